// Package sandboxagent is `atrium sandbox-agent`: the daemon that runs inside
// a sandbox VM and serves the agent protocol of package compute (see
// compute.AgentFenceHeader and docs/compute.md) to the node's compute/remote
// provider. It runs commands through a compute.Provider of its own,
// normally compute/local: under bubblewrap inside the VM, or directly when
// the VM itself is the isolation boundary.
//
// One agent serves one sandbox: the first POST /v1/sandbox binds it to a
// session, and it refuses others until that sandbox is destroyed. Every call
// but the health check must carry the sandbox's bearer token, compared in
// constant time, and the caller's fence: the agent remembers the highest
// fence it has seen and refuses older ones with 409, so a node that lost the
// session cannot touch the sandbox any more.
//
// The agent holds no object-store credentials. The node moves the
// workspace to and from object storage by handing it transfer plans whose
// objects are presigned URLs.
//
// Exec streams run over WebSocket with credit-based flow control in both
// directions, so a command whose output the node does not read is slowed
// down by its pipe and the agent's memory stays bounded (a window per
// stream). A command whose connection drops is killed, unless the node
// suspended it first (POST /v1/sandbox/suspend, before its VM is paused):
// then it keeps running and the node attaches a new connection after the
// VM wakes (GET /v1/exec?attach=ID).
package sandboxagent

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// Defaults of Config.
const (
	// DefaultVersion is reported by the health check when Config.Version
	// is empty.
	DefaultVersion = "devel"
	// DefaultHeartbeat is how often an exec connection is pinged; a peer
	// that does not answer within the same time is considered gone.
	DefaultHeartbeat = 10 * time.Second
	// DefaultStdinWindow is how many bytes of stdin the agent buffers per
	// command.
	DefaultStdinWindow = 256 << 10
)

// maxOutputWindow caps the output window a node may ask for, which bounds
// the agent's memory per command.
const maxOutputWindow = 8 << 20

// Config configures a Server.
type Config struct {
	// Token is the sandbox's bearer token. Required.
	Token string
	// Provider runs the commands, normally a compute/local provider whose
	// Config.Dir is Dir. Required.
	Provider compute.Provider
	// Dir is the root of the provider's sandboxes: the workspace of
	// session S is Dir/S/workspace (compute/local's layout), where the
	// file and workspace endpoints read and write. Required.
	Dir string
	// Version is reported by GET /healthz; default DefaultVersion.
	Version string
	// Heartbeat is the ping interval of exec connections; default
	// DefaultHeartbeat.
	Heartbeat time.Duration
	// StdinWindow bounds the stdin bytes buffered per command; default
	// DefaultStdinWindow.
	StdinWindow int64
	// UpstreamProxy, when set, is the HTTP proxy every transfer to and
	// from presigned URLs goes through (a VM whose only way out is its
	// VM host's outbound proxy); nil: HTTP_PROXY and HTTPS_PROXY as
	// usual. UpstreamDial gives compute/local's egress proxies the same
	// way out.
	UpstreamProxy *url.URL
	// Logger receives the agent's logs; default slog.Default().
	Logger *slog.Logger
}

// Server is the sandbox agent. It is an http.Handler; Serve runs it on a
// listener. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	token   [sha256.Size]byte // hash of the token, compared in constant time
	started time.Time
	mux     *http.ServeMux

	// ctx ends when Close is called; exec connections derive from it.
	ctx    context.Context
	cancel context.CancelFunc
	// wg counts the exec connections.
	wg sync.WaitGroup

	// opMu serializes open, sleep and destroy.
	opMu sync.Mutex
	// model relays the sandbox's model connections to the node (model.go);
	// guarded by opMu, nil until an open asks for it.
	model *modelRelay

	mu        sync.Mutex
	fence     int64               // guarded by mu: the highest fence seen
	session   session.ID          // guarded by mu: the bound session; "" before the first open
	sandbox   compute.Sandbox     // guarded by mu: the newest handle; nil when none is open
	running   int                 // guarded by mu: commands running
	restoring bool                // guarded by mu: a workspace restore runs; commands wait
	execs     map[int64]*execConn // guarded by mu: running commands by id (exec.go)
	nextExec  int64               // guarded by mu
	closed    bool                // guarded by mu

	// objects moves workspace objects to and from presigned URLs.
	objects *http.Client
}

// New returns an agent serving cfg.Provider's sandbox.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Token == "":
		return nil, errors.New("sandbox agent: a token is required")
	case cfg.Provider == nil:
		return nil, errors.New("sandbox agent: Config.Provider is required")
	case cfg.Dir == "":
		return nil, errors.New("sandbox agent: Config.Dir is required")
	case cfg.Heartbeat < 0 || cfg.StdinWindow < 0:
		return nil, errors.New("sandbox agent: Heartbeat and StdinWindow must not be negative")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox agent: resolve dir: %w", err)
	}
	cfg.Dir = dir
	if cfg.Version == "" {
		cfg.Version = DefaultVersion
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.StdinWindow == 0 {
		cfg.StdinWindow = DefaultStdinWindow
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	proxy := http.ProxyFromEnvironment
	if cfg.UpstreamProxy != nil {
		proxy = http.ProxyURL(cfg.UpstreamProxy)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		token:   sha256.Sum256([]byte(cfg.Token)),
		started: time.Now(),
		ctx:     ctx,
		cancel:  cancel,
		fence:   -1,
		objects: &http.Client{Transport: &http.Transport{
			Proxy:               proxy,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		}},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.HandleFunc("POST /v1/sandbox", s.authed(s.handleOpen))
	mux.HandleFunc("POST /v1/sandbox/sleep", s.authed(s.handleSleep))
	mux.HandleFunc("POST /v1/sandbox/suspend", s.authed(s.handleSuspend))
	mux.HandleFunc("DELETE /v1/sandbox", s.authed(s.handleDestroy))
	mux.HandleFunc("GET /v1/exec", s.authed(s.handleExec))
	mux.HandleFunc("GET "+compute.AgentModelPath, s.authed(s.handleModel))
	mux.HandleFunc("PUT /v1/files/{path...}", s.authed(s.handlePutFile))
	mux.HandleFunc("GET /v1/files/{path...}", s.authed(s.handleGetFile))
	s.routeWorkspace(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, session.Errorf(session.CodeNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	s.mux = mux
	return s, nil
}

// ServeHTTP serves the agent's API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Serve serves the agent on ln until ctx ends, then shuts down: it stops
// accepting, kills running commands and waits for their connections (up to
// 10 seconds). It returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		_ = s.Close(context.Background())
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := errors.Join(hs.Shutdown(sctx), s.Close(sctx))
	<-errc
	if err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	return nil
}

// Close kills every running command and waits for its connection to end.
// Requests afterwards fail with 503. Close is safe to call more than once.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.objects.CloseIdleConnections()
	s.opMu.Lock()
	if s.model != nil {
		s.model.close()
		s.model = nil
	}
	s.opMu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close sandbox agent: %w", ctx.Err())
	}
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, compute.AgentHealth{
		Version:  s.cfg.Version,
		UptimeMS: time.Since(s.started).Milliseconds(),
		TimeMS:   time.Now().UnixMilli(),
	})
}

// authed wraps h with the checks every call but the health check gets:
// the bearer token, then the fence.
func (s *Server) authed(h func(w http.ResponseWriter, r *http.Request, fence int64)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(token))
		if !ok || subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="atrium-sandbox-agent"`)
			writeError(w, session.Errorf(session.CodeUnauthenticated,
				"missing or wrong bearer token: send the sandbox's token as 'Authorization: Bearer <token>'"))
			return
		}
		raw := r.Header.Get(compute.AgentFenceHeader)
		fence, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || fence < 0 {
			writeError(w, session.Errorf(session.CodeBadRequest,
				"header %s must be the caller's fence, a non-negative integer (got %q)", compute.AgentFenceHeader, raw))
			return
		}
		if err := s.admit(fence); err != nil {
			writeError(w, err)
			return
		}
		h(w, r, fence)
	}
}

// admit records fence and refuses it if it is older than the newest seen.
func (s *Server) admit(fence int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return session.Errorf(session.CodeUnavailable, "the sandbox agent is shutting down")
	}
	if fence < s.fence {
		return session.Errorf(session.CodeConflict,
			"the sandbox belongs to a newer owner (fence %d, not %d): this node no longer owns the session", s.fence, fence)
	}
	s.fence = fence
	return nil
}

// current returns the open sandbox and its session.
func (s *Server) current() (compute.Sandbox, session.ID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandbox == nil {
		return nil, "", session.Errorf(session.CodeNotFound, "no sandbox is open on this agent: open it with POST /v1/sandbox first")
	}
	return s.sandbox, s.session, nil
}

// workspace returns the host directory of the open sandbox's workspace.
func (s *Server) workspace() (string, error) {
	_, id, err := s.current()
	if err != nil {
		return "", err
	}
	return filepath.Join(s.cfg.Dir, string(id), "workspace"), nil
}

func (s *Server) handleOpen(w http.ResponseWriter, r *http.Request, fence int64) {
	var req compute.AgentOpen
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := req.Session.Validate(); err != nil {
		writeError(w, err)
		return
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.mu.Lock()
	bound := s.session
	s.mu.Unlock()
	if bound != "" && bound != req.Session {
		writeError(w, session.Errorf(session.CodeConflict,
			"this sandbox agent serves session %s, not %s: provision a sandbox per session", bound, req.Session))
		return
	}
	spec := compute.Spec{
		Session: req.Session, Fence: fence,
		MemoryBytes: req.MemoryBytes, Pids: req.Pids, Network: req.Network, Egress: req.Egress,
	}
	s.dropSuspended(r.Context(), req.Suspended)
	// An open follows a wake: the connections kept for presigned URLs
	// (through the VM host's proxy) did not survive the VM's sleep, and
	// a PUT on a dead one fails without a retry.
	s.objects.CloseIdleConnections()
	mounts, err := s.makeMounts(req.Session, req.Mounts)
	if err != nil {
		writeError(w, err)
		return
	}
	spec.Mounts = mounts
	if req.Model {
		sock, err := s.startModelLocked()
		if err != nil {
			s.fail(w, r, fmt.Errorf("start the model relay: %w", err))
			return
		}
		spec.ModelSocket = sock
	}
	sb, err := s.cfg.Provider.Open(r.Context(), spec)
	if err != nil {
		s.fail(w, r, fmt.Errorf("open sandbox: %w", err))
		return
	}
	s.mu.Lock()
	s.session, s.sandbox = req.Session, sb
	s.mu.Unlock()
	s.log.Info("sandbox open", "session", string(req.Session), "fence", fence)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleSleep(w http.ResponseWriter, r *http.Request, _ int64) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	sb, id, err := s.current()
	if err == nil {
		err = sb.Sleep(r.Context())
	}
	if err != nil {
		s.fail(w, r, fmt.Errorf("sleep: %w", err))
		return
	}
	s.log.Info("sandbox sleeping", "session", string(id))
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleDestroy(w http.ResponseWriter, r *http.Request, _ int64) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	sb, id, err := s.current()
	if err == nil {
		err = sb.Destroy(r.Context())
	}
	if err != nil {
		s.fail(w, r, fmt.Errorf("destroy: %w", err))
		return
	}
	s.mu.Lock()
	s.session, s.sandbox = "", nil
	s.mu.Unlock()
	if err := os.RemoveAll(filepath.Join(s.cfg.Dir, string(id)+".mounts")); err != nil {
		s.log.Warn("remove the sandbox's mounts", "session", string(id), "err", err)
	}
	s.log.Info("sandbox destroyed", "session", string(id))
	w.WriteHeader(http.StatusNoContent)
}

// maxJSONBody bounds the JSON bodies the agent reads.
const maxJSONBody = 1 << 20

// decodeJSON reads r's body as one JSON value into v.
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return session.Errorf(session.CodePayloadTooLarge, "request body is larger than %d bytes", maxJSONBody)
		}
		return session.Errorf(session.CodeBadRequest, "request body is not valid JSON: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// fail answers with err's wire form. An error without a code is logged and
// becomes "internal" without details.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if session.AsError(err).Code == session.CodeInternal {
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, err)
}

// writeError answers with err's wire form; errors without a code become
// "internal" without details.
func writeError(w http.ResponseWriter, err error) {
	e := session.AsError(err)
	writeJSON(w, e.Code.HTTPStatus(), struct {
		Error *session.Error `json:"error"`
	}{e})
}
