package remote

import (
	"context"
	"io"
	"net"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/compute"
)

// A VM sandbox reaches the node's model gateway (compute.Spec.ModelSocket)
// through tunnels the node opens to its agent: the agent cannot dial the
// node, so the node keeps idleModelTunnels WebSocket connections waiting at
// compute.AgentModelPath; the agent hands each connection its sandbox makes
// to compute.ModelAddr to one of them, and the node relays it to the
// gateway's socket, dialing a new idle tunnel as soon as one is taken.

// idleModelTunnels is how many tunnels wait for a sandbox connection.
const idleModelTunnels = 2

// modelRetry is the pause after a tunnel that could not be opened or was
// closed unused.
const modelRetry = time.Second

// modelTunnels keeps the tunnels of one agent.
type modelTunnels struct {
	a      *agent
	fence  int64
	socket string
	cancel context.CancelFunc
	done   chan struct{}
}

// startModelLocked keeps model tunnels open to a for the current spec, or
// stops them when the spec has no model socket. The caller holds the
// lifecycle lock.
func (m *machine) startModelLocked(a *agent, fence int64) {
	sock := m.spec.ModelSocket
	m.mu.Lock()
	old := m.model
	if old != nil && old.a == a && old.fence == fence && old.socket == sock {
		m.mu.Unlock()
		return
	}
	m.model = nil
	m.mu.Unlock()
	if old != nil {
		old.stop()
	}
	if sock == "" {
		return
	}
	p := m.p
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &modelTunnels{a: a, fence: fence, socket: sock, cancel: cancel, done: make(chan struct{})}
	m.mu.Lock()
	m.model = t
	m.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer close(t.done)
		t.run(ctx)
	}()
}

// stopModel stops the machine's model tunnels, ending the relayed
// connections.
func (m *machine) stopModel() {
	m.mu.Lock()
	t := m.model
	m.model = nil
	m.mu.Unlock()
	if t != nil {
		t.stop()
	}
}

func (t *modelTunnels) stop() {
	t.cancel()
	<-t.done
}

// run keeps idleModelTunnels tunnels waiting until ctx ends.
func (t *modelTunnels) run(ctx context.Context) {
	slots := make(chan struct{}, idleModelTunnels)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() { t.tunnel(ctx, slots) })
	}
}

// tunnel opens one tunnel, waits for the agent to pair it with a sandbox
// connection, frees its slot and relays the connection to the gateway.
func (t *modelTunnels) tunnel(ctx context.Context, slots chan struct{}) {
	released := false
	release := func() {
		if !released {
			released = true
			<-slots
		}
	}
	defer release()
	pause := func() {
		timer := time.NewTimer(modelRetry)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	a := t.a
	conn, resp, err := websocket.Dial(ctx, a.base+compute.AgentModelPath, &websocket.DialOptions{
		HTTPClient:   a.p.client,
		HTTPHeader:   a.header(t.fence),
		Subprotocols: []string{compute.AgentModelSubprotocol},
	})
	if err != nil {
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		if ctx.Err() == nil {
			a.p.log.Debug("model tunnel not opened", "sandbox", a.req.SandboxID, "err", err)
		}
		pause()
		return
	}
	conn.SetReadLimit(compute.AgentMaxMessage)
	nc := websocket.NetConn(ctx, conn, websocket.MessageBinary)
	defer nc.Close()
	buf := make([]byte, 32<<10)
	n, err := nc.Read(buf)
	if n == 0 {
		if err != nil {
			pause()
		}
		return
	}
	release()
	var d net.Dialer
	up, err := d.DialContext(ctx, "unix", t.socket)
	if err != nil {
		a.p.log.Warn("model gateway unreachable", "socket", t.socket, "err", err)
		return
	}
	defer up.Close()
	if _, err := up.Write(buf[:n]); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(up, nc)
		up.(*net.UnixConn).CloseWrite()
	}()
	io.Copy(nc, up)
	nc.Close()
	<-done
}
