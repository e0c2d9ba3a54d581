package sandboxagent

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// modelSocketName is the Unix socket in Config.Dir that the agent's
// provider binds into the sandbox as its model gateway
// (compute.Spec.ModelSocket).
const modelSocketName = "model.sock"

// modelPairTimeout bounds how long a sandbox's connection waits for an idle
// tunnel from the node.
const modelPairTimeout = 30 * time.Second

// modelRelay is the agent's end of the model gateway: a Unix socket whose
// connections it hands, one each, to the idle tunnels the node holds open
// (compute.AgentModelPath).
type modelRelay struct {
	ln      net.Listener
	socket  string
	pending chan net.Conn // unbuffered: a sandbox connection waiting for a tunnel
	done    chan struct{} // closed by close
	wg      sync.WaitGroup
}

// startModelLocked starts the relay once; the caller holds opMu.
func (s *Server) startModelLocked() (string, error) {
	if s.model != nil {
		return s.model.socket, nil
	}
	sock := filepath.Join(s.cfg.Dir, modelSocketName)
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return "", err
	}
	r := &modelRelay{ln: ln, socket: sock, pending: make(chan net.Conn), done: make(chan struct{})}
	r.wg.Go(r.accept)
	s.model = r
	return sock, nil
}

func (r *modelRelay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Go(func() {
			t := time.NewTimer(modelPairTimeout)
			defer t.Stop()
			select {
			case r.pending <- c:
			case <-t.C:
				c.Close() // No tunnel from the node: the client sees the close.
			case <-r.done:
				c.Close()
			}
		})
	}
}

// close stops the relay; tunnels in use end with their connections.
func (r *modelRelay) close() {
	close(r.done)
	r.ln.Close()
	r.wg.Wait()
	os.Remove(r.socket)
}

// handleModel holds one idle tunnel from the node until a sandbox
// connection takes it, then relays both ways until either side closes.
func (s *Server) handleModel(w http.ResponseWriter, r *http.Request, _ int64) {
	s.opMu.Lock()
	relay := s.model
	s.opMu.Unlock()
	if relay == nil {
		writeError(w, session.Errorf(session.CodeNotFound, "no model gateway in this sandbox: open it with model set"))
		return
	}
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.wg.Add(1)
	}
	s.mu.Unlock()
	if closed {
		writeError(w, session.Errorf(session.CodeUnavailable, "the sandbox agent is shutting down"))
		return
	}
	defer s.wg.Done()
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{compute.AgentModelSubprotocol}})
	if err != nil {
		return
	}
	if conn.Subprotocol() != compute.AgentModelSubprotocol {
		conn.Close(websocket.StatusProtocolError, "use subprotocol "+compute.AgentModelSubprotocol)
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	nc := websocket.NetConn(ctx, conn, websocket.MessageBinary)
	defer nc.Close()
	var c net.Conn
	select {
	case c = <-relay.pending:
	case <-relay.done:
		return
	case <-ctx.Done():
		return
	}
	defer c.Close()
	relayConns(nc, c)
}

// relayConns copies a to b and b to a until both directions end; either
// side closing ends the other.
func relayConns(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(b, a)
		b.Close()
	}()
	io.Copy(a, b)
	a.Close()
	<-done
}
