package sandboxagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
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

// reattachTimeout is how long a suspended command waits for the node to
// attach a new connection (counted while the VM runs: a paused VM's clock
// stands still) before it is killed.
const reattachTimeout = 2 * time.Minute

// errSuspended ends a connection whose command was suspended: the node
// acknowledged the suspension and the command waits for a new connection.
var errSuspended = errors.New("suspended")

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request, fence int64) {
	if v := r.URL.Query().Get("attach"); v != "" {
		s.handleAttach(w, r, v)
		return
	}
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
		session: id,
		attach:  make(chan attachment),
		out:     make(chan frame, 16),
		signals: make(chan compute.AgentMessage, maxPendingSignals),
		stdin:   stdinQueue{wake: make(chan struct{}, 1)},
		stdout:  newWindow(),
		stderr:  newWindow(),
		changed: make(chan struct{}),
		gone:    make(chan struct{}),
	}
	x.run(sb, fence, conn)
}

// handleAttach serves GET /v1/exec?attach=ID: a new connection for the
// suspended command ID, which continues its streams where the suspended
// connection left them. It answers {"type":"attached"} first.
func (s *Server) handleAttach(w http.ResponseWriter, r *http.Request, raw string) {
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		writeError(w, session.Errorf(session.CodeBadRequest, "attach=%q is not a command id", raw))
		return
	}
	s.mu.Lock()
	x := s.execs[id]
	s.mu.Unlock()
	if x == nil {
		writeError(w, session.Errorf(session.CodeNotFound, "no command %d: it ended or was killed", id))
		return
	}
	if st, _ := x.getState(); st != execSuspended {
		writeError(w, session.Errorf(session.CodeConflict, "command %d is not suspended", id))
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{compute.AgentSubprotocol}})
	if err != nil {
		return
	}
	if conn.Subprotocol() != compute.AgentSubprotocol {
		conn.Close(websocket.StatusProtocolError, "use subprotocol "+compute.AgentSubprotocol)
		return
	}
	conn.SetReadLimit(compute.AgentMaxMessage)
	b, _ := json.Marshal(compute.AgentMessage{Type: "attached", ID: id})
	wctx, cancel := context.WithTimeout(r.Context(), startTimeout)
	err = conn.Write(wctx, websocket.MessageText, b)
	cancel()
	if err != nil {
		conn.CloseNow()
		return
	}
	done := make(chan struct{})
	select {
	case x.attach <- attachment{conn: conn, done: done}:
		<-done
	case <-x.ctx.Done():
		conn.Close(websocket.StatusGoingAway, "the command is gone")
	case <-time.After(startTimeout):
		conn.Close(websocket.StatusTryAgainLater, "the command is not waiting for a connection")
	}
}

// handleSuspend serves POST /v1/sandbox/suspend: every running command's
// connection is ended in agreement with the node (nothing in flight is
// lost), and the command keeps running until the node attaches a new
// connection (GET /v1/exec?attach=ID) or reattachTimeout passes. The node
// does this before the VM is paused, so the commands outlive the pause.
func (s *Server) handleSuspend(w http.ResponseWriter, r *http.Request, _ int64) {
	s.mu.Lock()
	xs := make([]*execConn, 0, len(s.execs))
	for _, x := range s.execs {
		xs = append(xs, x)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	errs := make([]error, len(xs))
	var wg sync.WaitGroup
	for i, x := range xs {
		wg.Go(func() { errs[i] = x.suspend(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		s.fail(w, r, session.Errorf(session.CodeUnavailable, "suspend commands: %v", err))
		return
	}
	// The VM is about to sleep: its kept connections would be dead after
	// the wake.
	s.objects.CloseIdleConnections()
	s.log.Info("commands suspended", "session", string(s.boundSession()), "commands", len(xs))
	writeJSON(w, http.StatusOK, map[string]int{"suspended": len(xs)})
}

// errOrphaned ends a suspended command that the node opening the sandbox
// will not attach again.
var errOrphaned = errors.New("suspended by a node that is gone: the node opening the sandbox does not attach it")

// dropSuspended kills the suspended commands not in keep (AgentOpen's
// Suspended) and waits until they are gone, or ctx ends.
func (s *Server) dropSuspended(ctx context.Context, keep []int64) {
	s.mu.Lock()
	xs := make([]*execConn, 0, len(s.execs))
	for id, x := range s.execs {
		if !slices.Contains(keep, id) {
			xs = append(xs, x)
		}
	}
	s.mu.Unlock()
	var dropped []*execConn
	for _, x := range xs {
		if st, _ := x.getState(); st == execSuspended {
			x.cancel(errOrphaned)
			dropped = append(dropped, x)
		}
	}
	for _, x := range dropped {
		select {
		case <-x.gone:
		case <-ctx.Done():
			return
		}
	}
	if len(dropped) > 0 {
		s.log.Info("suspended commands nobody will attach killed", "session", string(s.boundSession()), "commands", len(dropped))
	}
}

func (s *Server) boundSession() session.ID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session
}

// register gives x its id and lists it for suspension and attachment.
func (s *Server) register(x *execConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextExec++
	x.id = s.nextExec
	if s.execs == nil {
		s.execs = make(map[int64]*execConn)
	}
	s.execs[x.id] = x
}

func (s *Server) unregister(x *execConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.execs, x.id)
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
	// pause ends the connection's writer after writing it: later frames
	// wait for the next connection (a suspension).
	pause bool
}

// attachment is a new connection for a suspended command; done is closed
// when the command is done with it.
type attachment struct {
	conn *websocket.Conn
	done chan struct{}
}

// States of an execConn.
const (
	execServing   = "serving"
	execSuspended = "suspended"
	execDone      = "done"
)

// execConn is one command and its streams, served over one connection at a
// time: a suspension ends the connection but not the command, and a new
// connection attaches to it.
type execConn struct {
	s       *Server
	id      int64 // set by register
	session session.ID
	// ctx lives as long as the command is served; cancel ends it with a
	// cause.
	ctx    context.Context
	cancel context.CancelCauseFunc

	attach  chan attachment           // from handleAttach, while suspended
	out     chan frame                // to the connection's writer
	signals chan compute.AgentMessage // to the signal goroutine
	stdin   stdinQueue                // from the reader to the stdin goroutine
	stdout  *window                   // credit the node granted for stdout
	stderr  *window                   // and for stderr

	gone chan struct{} // closed when run returns: the command is no longer counted or listed

	mu         sync.Mutex
	state      string        // guarded by mu
	suspending bool          // guarded by mu: a suspension was asked for on the current connection
	changed    chan struct{} // guarded by mu: closed and replaced when state changes
}

func (x *execConn) setState(st string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.state = st
	x.suspending = false
	close(x.changed)
	x.changed = make(chan struct{})
}

func (x *execConn) getState() (string, chan struct{}) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.state, x.changed
}

// suspend asks the node to let the current connection go, and returns once
// the command is suspended (or done).
func (x *execConn) suspend(ctx context.Context) error {
	x.mu.Lock()
	st, asked := x.state, x.suspending
	x.suspending = true
	x.mu.Unlock()
	if st != execServing {
		return nil
	}
	if !asked {
		b, _ := json.Marshal(compute.AgentMessage{Type: "suspended", ID: x.id})
		select {
		case x.out <- frame{typ: websocket.MessageText, data: b, pause: true}:
		case <-x.ctx.Done():
			return nil
		case <-ctx.Done():
			return fmt.Errorf("command %d: %w", x.id, ctx.Err())
		}
	}
	for {
		st, changed := x.getState()
		if st != execServing {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("command %d: the node did not acknowledge the suspension: %w", x.id, ctx.Err())
		}
	}
}

// run serves the command: it reads the request, starts the command and
// its goroutines, and serves connections until the command ended and its
// exit was delivered, or nobody is left to control it. It returns when
// every goroutine it started is done.
func (x *execConn) run(sb compute.Sandbox, fence int64, conn *websocket.Conn) {
	defer close(x.gone)
	x.ctx, x.cancel = context.WithCancelCause(x.s.ctx)
	defer x.cancel(nil)
	req, err := x.readRequest(conn)
	if err != nil {
		x.refuse(conn, err)
		return
	}
	if err := x.s.startCommand(); err != nil {
		x.refuse(conn, err)
		return
	}
	// The command stops counting as running once it has exited, before
	// the node hears of it: the node may restore the workspace next.
	var endOnce sync.Once
	end := func() { endOnce.Do(x.s.endCommand) }
	defer end()
	proc, err := sb.Exec(x.ctx, req.ExecRequest)
	if err != nil {
		x.refuse(conn, fmt.Errorf("exec: %w", err))
		return
	}
	x.s.register(x)
	defer x.s.unregister(x)
	log := x.s.log.With("session", string(x.session), "command", x.id)
	log.Debug("command started", "fence", fence)
	x.stdout.add(req.Window)
	x.stderr.add(req.Window)
	x.setState(execServing)

	var wg sync.WaitGroup
	x.sendJSON(compute.AgentMessage{Type: "started", Window: x.s.cfg.StdinWindow, ID: x.id}, false)
	var pumps sync.WaitGroup
	pumps.Go(func() { x.pump(proc.Stdout(), compute.AgentStdout, "stdout", x.stdout) })
	pumps.Go(func() { x.pump(proc.Stderr(), compute.AgentStderr, "stderr", x.stderr) })
	wg.Go(func() { x.feedStdin(proc.Stdin()) })
	wg.Go(func() { x.signal(proc) })
	exited := make(chan struct{})
	wg.Go(func() {
		pumps.Wait()
		exit, err := proc.Wait()
		end()
		close(exited)
		msg := compute.AgentMessage{Type: "exit", Exit: &exit}
		if err != nil {
			log.Warn("wait for command", "err", err)
			msg.Error = session.Errorf(session.CodeInternal, "the agent could not clean up after the command: %v", err)
		}
		log.Debug("command finished", "detail", exit.Detail)
		x.sendJSON(msg, true)
	})

	var done chan struct{} // of the current attachment
	for {
		err = x.serve(conn)
		if done != nil {
			close(done)
		}
		if !errors.Is(err, errSuspended) {
			break
		}
		x.setState(execSuspended)
		log.Info("command suspended: waiting for the node to attach")
		t := time.NewTimer(reattachTimeout)
		select {
		case a := <-x.attach:
			conn, done = a.conn, a.done
			err = nil
		case <-t.C:
			err = fmt.Errorf("no connection attached within %v of the suspension", reattachTimeout)
		case <-x.ctx.Done():
			err = context.Cause(x.ctx)
		}
		t.Stop()
		if err != nil {
			break
		}
		log.Info("command attached")
		x.setState(execServing)
	}
	x.setState(execDone)
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
}

// serve runs one connection of the command until it ends, and returns why:
// errSuspended when the node acknowledged a suspension.
func (x *execConn) serve(conn *websocket.Conn) error {
	cctx, ccancel := context.WithCancelCause(x.ctx)
	defer ccancel(nil)
	var wg sync.WaitGroup
	wg.Go(func() { x.write(cctx, ccancel, conn) })
	wg.Go(func() { x.heartbeat(cctx, ccancel, conn) })
	err := x.read(cctx, conn)
	if errors.Is(err, errSuspended) {
		ccancel(err)
		wg.Wait()
		conn.Close(websocket.StatusNormalClosure, "suspended")
		return err
	}
	ccancel(err)
	wg.Wait()
	conn.CloseNow()
	return err
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
func (x *execConn) readRequest(conn *websocket.Conn) (compute.AgentExec, error) {
	ctx, cancel := context.WithTimeout(x.ctx, startTimeout)
	defer cancel()
	var req compute.AgentExec
	typ, data, err := conn.Read(ctx)
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
func (x *execConn) refuse(conn *websocket.Conn, err error) {
	e := session.AsError(err)
	if e.Code == session.CodeInternal {
		x.s.log.Warn("exec failed", "session", string(x.session), "err", err)
	}
	b, _ := json.Marshal(compute.AgentMessage{Type: "error", Error: e})
	ctx, cancel := context.WithTimeout(x.ctx, startTimeout)
	defer cancel()
	if conn.Write(ctx, websocket.MessageText, b) == nil {
		conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	conn.CloseNow()
}

// send queues f for the connection's writer (the next connection's, while
// suspended); it gives up when the command is no longer served.
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

// write is conn's only writer. After the last frame it closes the
// connection normally; after a pause frame it stops, leaving later frames
// for the next connection.
func (x *execConn) write(ctx context.Context, cancel context.CancelCauseFunc, conn *websocket.Conn) {
	for {
		select {
		case f := <-x.out:
			if err := conn.Write(ctx, f.typ, f.data); err != nil {
				cancel(fmt.Errorf("write: %w", err))
				conn.CloseNow()
				return
			}
			if f.last {
				conn.Close(websocket.StatusNormalClosure, "")
				return
			}
			if f.pause {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// read handles the node's messages until the connection ends, and returns
// why it ended.
func (x *execConn) read(ctx context.Context, conn *websocket.Conn) error {
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			if c := context.Cause(ctx); c != nil {
				return c
			}
			return fmt.Errorf("read: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 || data[0] != compute.AgentStdin || len(data) > 1+compute.AgentMaxChunk {
				return x.violation(conn, "binary messages from the node must be stdin chunks")
			}
			if !x.stdin.push(data[1:], x.s.cfg.StdinWindow) {
				return x.violation(conn, "stdin beyond the window")
			}
			continue
		}
		var m compute.AgentMessage
		if err := json.Unmarshal(data, &m); err != nil {
			return x.violation(conn, "control message is not valid JSON")
		}
		switch m.Type {
		case "credit":
			if m.Bytes <= 0 {
				return x.violation(conn, "credit must be positive")
			}
			switch m.Stream {
			case "stdout":
				x.stdout.add(m.Bytes)
			case "stderr":
				x.stderr.add(m.Bytes)
			default:
				return x.violation(conn, "credit for an unknown stream")
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
		case "suspend_ack":
			x.mu.Lock()
			asked := x.suspending
			x.mu.Unlock()
			if !asked {
				return x.violation(conn, "suspend_ack without a suspension")
			}
			// The node sends nothing after it: the connection is done.
			return errSuspended
		default:
			return x.violation(conn, "unknown control message "+m.Type)
		}
	}
}

// violation closes the connection for a broken protocol.
func (x *execConn) violation(conn *websocket.Conn, why string) error {
	conn.Close(websocket.StatusPolicyViolation, why)
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

// heartbeat pings the node over conn; a node that does not answer is gone.
func (x *execConn) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, conn *websocket.Conn) {
	every := x.s.cfg.Heartbeat
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			pctx, pcancel := context.WithTimeout(ctx, every)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("no answer to ping: %w", err))
				conn.CloseNow()
				return
			}
		case <-ctx.Done():
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
