package local

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// A sandbox reaches the node's model gateway (compute.Spec.ModelSocket) at
// compute.ModelAddr on its own loopback: the gateway's Unix socket is bound
// in at /run/atrium/model.sock and the forwarder (the same executable as
// the egress proxy's, compute/egress) relays the address to it, whether or
// not the sandbox has egress or the network. In unsafe mode, commands run
// on the host: a relay on an ephemeral port of the host's loopback stands
// in, and compute.ModelAddr in the commands' environment is rewritten to
// it.

// checkModelSocket validates a spec's model socket.
func checkModelSocket(path string) error {
	if !filepath.IsAbs(path) {
		return session.Errorf(session.CodeBadRequest, "model socket %q is not an absolute path", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return session.Errorf(session.CodeUnavailable, "model gateway socket: %s", err.Error())
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return session.Errorf(session.CodeBadRequest, "model socket %q is not a socket", path)
	}
	return nil
}

// modelRelay relays connections on a host loopback port to the model
// gateway's socket, for unsafe mode.
type modelRelay struct {
	ln     net.Listener
	socket string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // guarded by mu
	closed bool                  // guarded by mu
}

// modelRelayLocked starts the sandbox's relay if needed and returns its
// address. The caller holds the lifecycle lock.
func (m *machine) modelRelayLocked() (string, error) {
	if r := m.relay; r != nil && r.socket == m.limits.model {
		return r.ln.Addr().String(), nil
	}
	m.closeModelRelayLocked()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	r := &modelRelay{ln: ln, socket: m.limits.model, conns: map[net.Conn]struct{}{}}
	r.wg.Go(r.serve)
	m.relay = r
	return ln.Addr().String(), nil
}

// closeModelRelayLocked stops the relay, ending its connections.
func (m *machine) closeModelRelayLocked() {
	if m.relay == nil {
		return
	}
	m.relay.close()
	m.relay = nil
}

func (r *modelRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			c.Close()
			return
		}
		r.wg.Go(func() {
			defer r.untrack(c)
			up, err := net.Dial("unix", r.socket)
			if err != nil {
				return
			}
			if !r.track(up) {
				up.Close()
				return
			}
			defer r.untrack(up)
			done := make(chan struct{})
			go func() {
				io.Copy(up, c)
				if uc, ok := up.(*net.UnixConn); ok {
					uc.CloseWrite()
				}
				close(done)
			}()
			io.Copy(c, up)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			<-done
		})
	}
}

func (r *modelRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *modelRelay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *modelRelay) close() {
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// unsafeModelAddr rewrites compute.ModelAddr in env entries to the relay's
// address.
func unsafeModelAddr(addr string, env []string) []string {
	if addr == compute.ModelAddr {
		return env
	}
	out := make([]string, len(env))
	for i, e := range env {
		out[i] = strings.ReplaceAll(e, compute.ModelAddr, addr)
	}
	return out
}
