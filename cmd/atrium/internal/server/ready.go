package server

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/storage/blob"
)

// ReadyTimeout bounds the checks of one /readyz request.
const ReadyTimeout = 5 * time.Second

// ProbeKey is the object ProbeStore writes, reads back and deletes.
const ProbeKey = "_probe/atrium-ready"

// Check is the result of one readiness or doctor check.
type Check struct {
	// Name is what was checked: "nats", "history", "object_store".
	Name string `json:"name"`
	// OK reports whether it is ready.
	OK bool `json:"ok"`
	// Error says what is wrong when it is not.
	Error string `json:"error,omitempty"`
	// Server is, for "nats", the server the process is connected to.
	Server string `json:"server,omitempty"`
}

// Readiness is the body of /readyz.
type Readiness struct {
	Ready bool `json:"ready"`
	// Roles are the roles of the process, whose checks these are.
	Roles  []string `json:"roles"`
	Checks []Check  `json:"checks"`
}

// Ready runs the readiness checks of the process's roles: NATS connected
// (every role); for a node also the history directory writable, the object
// store writable (a probe object is put, read back and deleted) and its
// ownership leases renewed in time.
func (s *Server) Ready(ctx context.Context) Readiness {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	checks := []Check{s.checkNATS()}
	if s.IsNode() {
		var wg sync.WaitGroup
		var hist, store Check
		wg.Go(func() { hist = result("history", ProbeDir(filepath.Join(s.cfg.DataDir, "history"))) })
		wg.Go(func() { store = result("object_store", ProbeStore(ctx, s.store)) })
		wg.Wait()
		checks = append(checks, hist, store, s.checkLeases())
	}
	r := Readiness{Ready: true, Roles: s.Roles(), Checks: checks}
	for _, c := range checks {
		r.Ready = r.Ready && c.OK
	}
	return r
}

func (s *Server) checkNATS() Check {
	switch {
	case s.closing.Load():
		return Check{Name: "nats", Error: "the server is shutting down"}
	case !s.nc.IsConnected():
		return Check{Name: "nats", Error: fmt.Sprintf("not connected to NATS (status %s)", s.nc.Status())}
	}
	return Check{Name: "nats", OK: true, Server: s.nc.ConnectedServerName()}
}

// checkLeases fails when the node holds no lease, or has not renewed it
// for two thirds of the lease TTL: NATS is slow or unreachable, and the
// node is about to give its sessions up (or has).
func (s *Server) checkLeases() Check {
	ttl := cmp.Or(s.cfg.LeaseTTL, actor.DefaultLeaseTTL)
	renewed, held := s.host.NodeLease()
	switch {
	case !held:
		return Check{Name: "leases", Error: "this node holds no node lease (NATS unreachable): it serves no session until it gets one"}
	case time.Since(renewed) > ttl*2/3:
		return Check{Name: "leases", Error: fmt.Sprintf("the node lease was last renewed %v ago, over %v (NATS slow or unreachable): its %d sessions stop at %v",
			time.Since(renewed).Round(time.Millisecond), ttl*2/3, len(s.host.Leases()), ttl*2/3)}
	}
	return Check{Name: "leases", OK: true}
}

func result(name string, err error) Check {
	if err != nil {
		return Check{Name: name, Error: err.Error()}
	}
	return Check{Name: name, OK: true}
}

// ProbeDir checks that dir is a writable directory by creating, writing,
// syncing and removing a file in it.
func ProbeDir(dir string) error {
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("create a file in %s: %w", dir, err)
	}
	name := f.Name()
	defer os.Remove(name)
	_, err = f.Write([]byte("atrium probe\n"))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write a file in %s: %w", dir, err)
	}
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("remove a file in %s: %w", dir, err)
	}
	return nil
}

// ProbeStore checks that st is reachable and writable: it puts ProbeKey,
// reads it back and deletes it.
func ProbeStore(ctx context.Context, st blob.Store) error {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	want := []byte(hex.EncodeToString(b))
	if _, err := st.Put(ctx, ProbeKey, bytes.NewReader(want), int64(len(want)), blob.PutOptions{}); err != nil {
		return fmt.Errorf("put a probe object: %w", err)
	}
	rc, _, err := st.Get(ctx, ProbeKey)
	if err != nil {
		return fmt.Errorf("get the probe object back: %w", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return fmt.Errorf("read the probe object: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("the probe object read back differs from what was written")
	}
	if err := st.Delete(ctx, ProbeKey); err != nil {
		return fmt.Errorf("delete the probe object: %w", err)
	}
	return nil
}

// serveReady answers /readyz: 200 when every check passes, else 503; the
// JSON body names each check.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	rd := s.Ready(r.Context())
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	b, _ := json.Marshal(rd)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// HeaderRequestID carries a request's id: a client's own (if it is short
// and plain) or one the server makes; it is echoed in the response and
// logged with the request.
const HeaderRequestID = "X-Request-Id"

// handler is the gateway's handler behind the server's own routes
// (/readyz) and request ids.
func (s *Server) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(HeaderRequestID)
		if !plainID(id) {
			b := make([]byte, 8)
			_, _ = rand.Read(b)
			id = hex.EncodeToString(b)
			r.Header.Set(HeaderRequestID, id)
		}
		w.Header().Set(HeaderRequestID, id)
		if r.URL.Path == "/readyz" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			s.serveReady(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// plainID reports whether a client's request id may be logged as it is.
func plainID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// inProcess connects the server's NATS client to the current embedded NATS
// server; restartNATS swaps it, and the client reconnects.
type inProcess struct {
	mu sync.Mutex
	ns *natsserver.Server
}

// InProcessConn implements nats.InProcessConnProvider.
func (p *inProcess) InProcessConn() (net.Conn, error) {
	p.mu.Lock()
	ns := p.ns
	p.mu.Unlock()
	if ns == nil {
		return nil, errors.New("embedded nats is stopped")
	}
	return ns.InProcessConn()
}

func (p *inProcess) set(ns *natsserver.Server) {
	p.mu.Lock()
	p.ns = ns
	p.mu.Unlock()
}

// stopNATS shuts the embedded NATS server down, as a NATS outage would;
// startNATS starts it again on the same store. Tests use them (see
// export_test.go) to watch readiness flip.
func (s *Server) stopNATS() {
	s.inproc.set(nil)
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

func (s *Server) startNATS() error {
	ns, err := newEmbeddedNATS(s.cfg.DataDir, s.cfg.Logger)
	if err != nil {
		return err
	}
	s.ns = ns
	s.inproc.set(ns)
	s.guard.watch(ns, s.cfg.Logger)
	return nil
}

// newEmbeddedNATS starts the embedded NATS server with JetStream in
// dataDir/nats; its log lines go to log (natslog.go).
func newEmbeddedNATS(dataDir string, log *slog.Logger) (*natsserver.Server, error) {
	ns, err := natsserver.NewServer(&natsserver.Options{
		ServerName: "atrium-dev",
		DontListen: true,
		JetStream:  true,
		StoreDir:   filepath.Join(dataDir, "nats"),
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("configure embedded nats: %w", err)
	}
	if log != nil {
		ns.SetLoggerV2(natsLogger{log.With("component", "nats-server")}, false, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded nats did not become ready within 10s")
	}
	return ns, nil
}
