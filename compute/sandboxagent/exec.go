package sandboxagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// startTimeout bounds how long the node may take to send the exec request
// after the connection opens.
const startTimeout = 10 * time.Second

// maxPendingSignals bounds the signals queued for one command.
const maxPendingSignals = 16

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request, fence int64) {
	sb, id, err := s.current()
	if err != nil {
		writeError(w, err)
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
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{compute.AgentSubprotocol}})
	if err != nil {
		return // Accept has answered.
	}
	if conn.Subprotocol() != compute.AgentSubprotocol {
		conn.Close(websocket.StatusProtocolError, "use subprotocol "+compute.AgentSubprotocol)
		return
	}
	conn.SetReadLimit(compute.AgentMaxMessage)
	x := &execConn{
		s:       s,
		conn:    conn,
		session: id,
		out:     make(chan frame, 16),
		signals: make(chan compute.AgentMessage, maxPendingSignals),
		stdin:   stdinQueue{wake: make(chan struct{}, 1)},
		stdout:  newWindow(),
		stderr:  newWindow(),
	}
	x.run(sb, fence)
}

// startCommand counts a command about to start, unless the workspace is
// being restored.
func (s *Server) startCommand() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.restoring {
		return session.Errorf(session.CodeConflict, "the sandbox's workspace is being restored: try again when it is done")
	}
	s.running++
	return nil
}

func (s *Server) endCommand() {
	s.mu.Lock()
	s.running--
	s.mu.Unlock()
}

// frame is a message queued for an exec connection's writer.
type frame struct {
	typ  websocket.MessageType
	data []byte
	last bool // close the connection after writing it
}

// execConn is one exec connection: one command and its streams.
type execConn struct {
	s       *Server
	conn    *websocket.Conn
	session session.ID
	ctx     context.Context
	cancel  context.CancelCauseFunc

	out     chan frame                // to the writer goroutine
	signals chan compute.AgentMessage // to the signal goroutine
	stdin   stdinQueue                // from the reader to the stdin goroutine
	stdout  *window                   // credit the node granted for stdout
	stderr  *window                   // and for stderr
}

// run serves the connection: it reads the request, starts the command and
// its goroutines, and reads the node's messages until the connection ends.
// It returns when every goroutine it started is done.
func (x *execConn) run(sb compute.Sandbox, fence int64) {
	x.ctx, x.cancel = context.WithCancelCause(x.s.ctx)
	defer x.cancel(nil)
	req, err := x.readRequest()
	if err != nil {
		x.refuse(err)
		return
	}
	if err := x.s.startCommand(); err != nil {
		x.refuse(err)
		return
	}
	defer x.s.endCommand()
	proc, err := sb.Exec(x.ctx, req.ExecRequest)
	if err != nil {
		x.refuse(fmt.Errorf("exec: %w", err))
		return
	}
	log := x.s.log.With("session", string(x.session))
	log.Debug("command started", "fence", fence)
	x.stdout.add(req.Window)
	x.stderr.add(req.Window)

	var wg sync.WaitGroup
	wg.Go(x.write)
	x.sendJSON(compute.AgentMessage{Type: "started", Window: x.s.cfg.StdinWindow}, false)
	var pumps sync.WaitGroup
	pumps.Go(func() { x.pump(proc.Stdout(), compute.AgentStdout, "stdout", x.stdout) })
	pumps.Go(func() { x.pump(proc.Stderr(), compute.AgentStderr, "stderr", x.stderr) })
	wg.Go(func() { x.feedStdin(proc.Stdin()) })
	wg.Go(func() { x.signal(proc) })
	wg.Go(x.heartbeat)
	exited := make(chan struct{})
	wg.Go(func() {
		pumps.Wait()
		exit, err := proc.Wait()
		close(exited)
		msg := compute.AgentMessage{Type: "exit", Exit: &exit}
		if err != nil {
			log.Warn("wait for command", "err", err)
			msg.Error = session.Errorf(session.CodeInternal, "the agent could not clean up after the command: %v", err)
		}
		log.Debug("command finished", "detail", exit.Detail)
		x.sendJSON(msg, true)
	})

	err = x.read()
	x.cancel(err)
	select {
	case <-exited:
	default:
		// The node is gone before the command ended: nobody can read
		// its output or stop it any more.
		log.Info("exec connection lost: killing the command", "reason", err.Error())
		killUntilExited(proc, exited, log)
	}
	wg.Wait()
	x.conn.CloseNow()
}

// killTimeout bounds how long the agent keeps killing a command nobody
// controls any more.
const killTimeout = 15 * time.Second

// killUntilExited sends SIGKILL to proc until exited is closed: a signal
// sent while the command is still starting can be lost (the provider may
// not know its processes yet).
func killUntilExited(proc compute.Process, exited <-chan struct{}, log *slog.Logger) {
	deadline := time.Now().Add(killTimeout)
	for {
		if err := proc.Signal(syscall.SIGKILL); err != nil {
			log.Warn("kill command", "err", err)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-exited:
			t.Stop()
			return
		case <-t.C:
		}
		if time.Now().After(deadline) {
			log.Error("the command survives SIGKILL", "after", killTimeout)
			return
		}
	}
}

// readRequest reads the AgentExec message that opens the connection.
func (x *execConn) readRequest() (compute.AgentExec, error) {
	ctx, cancel := context.WithTimeout(x.ctx, startTimeout)
	defer cancel()
	var req compute.AgentExec
	typ, data, err := x.conn.Read(ctx)
	if err != nil {
		return req, fmt.Errorf("read exec request: %w", err)
	}
	if typ != websocket.MessageText {
		return req, session.Errorf(session.CodeBadRequest, "the first message must be the exec request as JSON text")
	}
	if err := json.Unmarshal(data, &req); err != nil {
		return req, session.Errorf(session.CodeBadRequest, "exec request is not valid JSON: %v", err)
	}
	if req.Window <= 0 {
		return req, session.Errorf(session.CodeBadRequest, "exec request: window must be positive")
	}
	req.Window = min(req.Window, maxOutputWindow)
	return req, nil
}

// refuse reports a command that did not start and closes the connection.
func (x *execConn) refuse(err error) {
	e := session.AsError(err)
	if e.Code == session.CodeInternal {
		x.s.log.Warn("exec failed", "session", string(x.session), "err", err)
	}
	b, _ := json.Marshal(compute.AgentMessage{Type: "error", Error: e})
	ctx, cancel := context.WithTimeout(x.ctx, startTimeout)
	defer cancel()
	if x.conn.Write(ctx, websocket.MessageText, b) == nil {
		x.conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	x.conn.CloseNow()
}

// send queues f for the writer; it gives up when the connection ends.
func (x *execConn) send(f frame) bool {
	select {
	case x.out <- f:
		return true
	case <-x.ctx.Done():
		return false
	}
}

func (x *execConn) sendJSON(m compute.AgentMessage, last bool) bool {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("sandbox agent: encode %s message: %v", m.Type, err)) // Plain structs always encode.
	}
	return x.send(frame{typ: websocket.MessageText, data: b, last: last})
}

// write is the connection's only writer. After the last frame it closes
// the connection normally.
func (x *execConn) write() {
	for {
		select {
		case f := <-x.out:
			if err := x.conn.Write(x.ctx, f.typ, f.data); err != nil {
				x.cancel(fmt.Errorf("write: %w", err))
				return
			}
			if f.last {
				x.conn.Close(websocket.StatusNormalClosure, "")
				return
			}
		case <-x.ctx.Done():
			return
		}
	}
}

// read handles the node's messages until the connection ends, and returns
// why it ended.
func (x *execConn) read() error {
	for {
		typ, data, err := x.conn.Read(x.ctx)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 || data[0] != compute.AgentStdin || len(data) > 1+compute.AgentMaxChunk {
				return x.violation("binary messages from the node must be stdin chunks")
			}
			if !x.stdin.push(data[1:], x.s.cfg.StdinWindow) {
				return x.violation("stdin beyond the window")
			}
			continue
		}
		var m compute.AgentMessage
		if err := json.Unmarshal(data, &m); err != nil {
			return x.violation("control message is not valid JSON")
		}
		switch m.Type {
		case "credit":
			if m.Bytes <= 0 {
				return x.violation("credit must be positive")
			}
			switch m.Stream {
			case "stdout":
				x.stdout.add(m.Bytes)
			case "stderr":
				x.stderr.add(m.Bytes)
			default:
				return x.violation("credit for an unknown stream")
			}
		case "close_stdin":
			x.stdin.close()
		case "signal":
			select {
			case x.signals <- m:
			default:
				x.sendJSON(compute.AgentMessage{Type: "signaled", ID: m.ID,
					Error: session.Errorf(session.CodeTooManyRequests, "too many signals pending")}, false)
			}
		default:
			return x.violation("unknown control message " + m.Type)
		}
	}
}

// violation closes the connection for a broken protocol.
func (x *execConn) violation(why string) error {
	x.conn.Close(websocket.StatusPolicyViolation, why)
	return errors.New("protocol violation: " + why)
}

// pump streams r to the node as far as the node's credit allows, then
// reports EOF.
func (x *execConn) pump(r io.Reader, tag byte, name string, win *window) {
	for {
		avail, ok := win.wait(x.ctx)
		if !ok {
			return
		}
		buf := make([]byte, 1+min(avail, compute.AgentMaxChunk))
		buf[0] = tag
		n, err := r.Read(buf[1:])
		if n > 0 {
			win.add(-int64(n))
			if !x.send(frame{typ: websocket.MessageBinary, data: buf[:1+n]}) {
				return
			}
		}
		if err != nil {
			// EOF, or the pipe was closed: either way the stream ends.
			x.sendJSON(compute.AgentMessage{Type: "eof", Stream: name}, false)
			return
		}
	}
}

// feedStdin writes the node's stdin chunks to the command, granting credit
// back as they are written.
func (x *execConn) feedStdin(w io.WriteCloser) {
	broken := false
	for {
		chunk, closed, ok := x.stdin.pop(x.ctx)
		if !ok {
			return
		}
		if closed {
			_ = w.Close()
			return
		}
		if broken {
			continue // Discard what was in flight.
		}
		if _, err := w.Write(chunk); err != nil {
			broken = true
			x.sendJSON(compute.AgentMessage{Type: "stdin_closed",
				Error: session.Errorf(session.CodeConflict, "the command's stdin is closed")}, false)
			continue
		}
		x.sendJSON(compute.AgentMessage{Type: "credit", Stream: "stdin", Bytes: int64(len(chunk))}, false)
	}
}

// signal delivers the node's signals, one at a time.
func (x *execConn) signal(proc compute.Process) {
	for {
		select {
		case m := <-x.signals:
			reply := compute.AgentMessage{Type: "signaled", ID: m.ID}
			if m.Signal <= 0 || m.Signal > 64 {
				reply.Error = session.Errorf(session.CodeBadRequest, "signal %d is not a signal", int(m.Signal))
			} else if err := proc.Signal(m.Signal); err != nil {
				x.s.log.Warn("signal command", "session", string(x.session), "signal", int(m.Signal), "err", err)
				reply.Error = session.Errorf(session.CodeInternal, "the agent could not deliver the signal: %v", err)
			}
			x.sendJSON(reply, false)
		case <-x.ctx.Done():
			return
		}
	}
}

// heartbeat pings the node; a node that does not answer is gone.
func (x *execConn) heartbeat() {
	every := x.s.cfg.Heartbeat
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			ctx, cancel := context.WithTimeout(x.ctx, every)
			err := x.conn.Ping(ctx)
			cancel()
			if err != nil && x.ctx.Err() == nil {
				x.cancel(fmt.Errorf("no answer to ping: %w", err))
				x.conn.CloseNow()
				return
			}
		case <-x.ctx.Done():
			return
		}
	}
}

// window is the credit one side has for sending a stream.
type window struct {
	mu   sync.Mutex
	n    int64         // guarded by mu
	wake chan struct{} // signalled when n grows
}

func newWindow() *window { return &window{wake: make(chan struct{}, 1)} }

// add changes the credit by n (negative to spend it).
func (w *window) add(n int64) {
	w.mu.Lock()
	w.n += n
	w.mu.Unlock()
	if n > 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// wait returns the credit once it is positive; false when ctx ends first.
func (w *window) wait(ctx context.Context) (int, bool) {
	for {
		w.mu.Lock()
		n := w.n
		w.mu.Unlock()
		if n > 0 {
			return int(min(n, compute.AgentMaxChunk)), true
		}
		select {
		case <-w.wake:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// stdinQueue holds the stdin chunks received and not yet written.
type stdinQueue struct {
	mu     sync.Mutex
	chunks [][]byte      // guarded by mu
	bytes  int64         // guarded by mu
	closed bool          // guarded by mu: the node closed stdin
	wake   chan struct{} // signalled on push and close
}

// push queues b; it reports false when that exceeds limit bytes.
func (q *stdinQueue) push(b []byte, limit int64) bool {
	q.mu.Lock()
	q.chunks = append(q.chunks, b)
	q.bytes += int64(len(b))
	over := q.bytes > limit
	q.mu.Unlock()
	q.notify()
	return !over
}

func (q *stdinQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.notify()
}

func (q *stdinQueue) notify() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// pop returns the next chunk, or closed once the queue is empty and
// closed; ok is false when ctx ends first.
func (q *stdinQueue) pop(ctx context.Context) (chunk []byte, closed, ok bool) {
	for {
		q.mu.Lock()
		if len(q.chunks) > 0 {
			chunk = q.chunks[0]
			q.chunks[0] = nil
			q.chunks = q.chunks[1:]
			q.bytes -= int64(len(chunk))
			q.mu.Unlock()
			return chunk, false, true
		}
		closed = q.closed
		q.mu.Unlock()
		if closed {
			return nil, true, true
		}
		select {
		case <-q.wake:
		case <-ctx.Done():
			return nil, false, false
		}
	}
}
