package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// errProviderClosed ends the commands of a closed provider.
var errProviderClosed = errors.New("the remote compute provider was closed")

// errStdinClosed is returned by writes to a command's stdin once it is
// closed, broken or the command has ended.
var errStdinClosed = errors.New("write stdin: the command's stdin is closed")

// Process is a command running in a remote sandbox. It implements
// compute.Process.
type Process struct {
	m     *machine
	agent *agent
	// id is the agent's id of the command, for attaching a connection
	// after a suspension.
	id int64
	// fence is the fence the command was started with.
	fence int64

	// ctx lives as long as the command is served (across connections);
	// cancel ends it with a cause.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// stopDial releases the context the first connection was dialled
	// with.
	stopDial context.CancelFunc
	// attach carries a new connection to a suspended command (wake).
	attach chan *websocket.Conn

	// suspendSeen is set when the agent suspended the current connection
	// and cleared once a new one is attached.
	suspendSeen atomic.Bool

	connMu    sync.Mutex
	conn      *websocket.Conn // guarded by connMu: the current connection; nil while suspended
	suspended bool            // guarded by connMu: waiting for a connection after a suspension

	out    chan frame   // for the writer, in order
	stdin  *stdinWriter // the command's stdin
	stdout *streamBuf
	stderr *streamBuf

	sigMu   sync.Mutex
	sigNext int64                // guarded by sigMu
	sigWait map[int64]chan error // guarded by sigMu: signals waiting for their answer

	// ended is closed when the command has ended (exit received) or its
	// connection is gone; exit and err are set before.
	ended   chan struct{}
	endOnce sync.Once
	exit    compute.Exit
	err     error
}

var _ compute.Process = (*Process)(nil)

// startProcess dials a's exec endpoint and starts req. A failure to reach
// the agent is an *unreachableError.
func startProcess(ctx context.Context, m *machine, a *agent, fence int64, req compute.ExecRequest) (*Process, error) {
	p := m.p
	// The connection outlives ctx, which bounds the start only, as does
	// the request timeout.
	dialCtx, stopDial := context.WithCancel(context.Background())
	stopCtx := context.AfterFunc(ctx, stopDial)
	timer := time.AfterFunc(p.cfg.RequestTimeout, stopDial)
	stop := func() bool {
		t, c := timer.Stop(), stopCtx()
		return t && c
	}
	conn, resp, err := websocket.Dial(dialCtx, a.base+"/v1/exec", &websocket.DialOptions{
		HTTPClient:   p.client,
		HTTPHeader:   a.header(fence),
		Subprotocols: []string{compute.AgentSubprotocol},
	})
	if err != nil {
		stop()
		stopDial()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to the sandbox agent at %s: %w", a.vm.Addr, ctx.Err())
		}
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, a.answerError(resp.StatusCode, resp.Body)
		}
		return nil, &unreachableError{addr: a.vm.Addr, err: err}
	}
	fail := func(err error) (*Process, error) {
		stop()
		stopDial()
		conn.CloseNow()
		return nil, err
	}
	if conn.Subprotocol() != compute.AgentSubprotocol {
		return fail(session.Errorf(session.CodeUnavailable,
			"the sandbox agent at %s does not speak %s: upgrade it to this node's version", a.vm.Addr, compute.AgentSubprotocol))
	}
	conn.SetReadLimit(compute.AgentMaxMessage)
	b, err := json.Marshal(compute.AgentExec{ExecRequest: req, Window: p.cfg.Window})
	if err != nil {
		return fail(fmt.Errorf("encode exec request: %w", err))
	}
	if err := conn.Write(dialCtx, websocket.MessageText, b); err != nil {
		return fail(startError(ctx, a, err))
	}
	typ, b, err := conn.Read(dialCtx)
	if err != nil {
		return fail(startError(ctx, a, err))
	}
	var first compute.AgentMessage
	if typ != websocket.MessageText || json.Unmarshal(b, &first) != nil {
		return fail(session.Errorf(session.CodeUnavailable, "the sandbox agent at %s answered the exec request with garbage", a.vm.Addr))
	}
	switch {
	case first.Type == "error" && first.Error != nil:
		conn.Close(websocket.StatusNormalClosure, "")
		stop()
		stopDial()
		return nil, first.Error
	case first.Type != "started" || first.Window <= 0:
		return fail(session.Errorf(session.CodeUnavailable, "the sandbox agent at %s answered the exec request with %q", a.vm.Addr, first.Type))
	}
	if !stop() {
		// ctx ended or the timeout passed just now.
		stopDial()
		conn.CloseNow()
		return nil, fmt.Errorf("start command: %w", context.DeadlineExceeded)
	}

	pctx, cancel := context.WithCancelCause(context.Background())
	pr := &Process{
		m:        m,
		agent:    a,
		conn:     conn,
		id:       first.ID,
		fence:    fence,
		ctx:      pctx,
		cancel:   cancel,
		stopDial: stopDial,
		attach:   make(chan *websocket.Conn),
		out:      make(chan frame, 16),
		sigWait:  make(map[int64]chan error),
		ended:    make(chan struct{}),
	}
	pr.stdin = &stdinWriter{pr: pr, credit: first.Window, wake: make(chan struct{}, 1), broken: make(chan struct{})}
	pr.stdout = newStreamBuf(pr, "stdout", p.cfg.Window)
	pr.stderr = newStreamBuf(pr, "stderr", p.cfg.Window)

	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.wg.Add(1)
		m.mu.Lock()
		m.procs[pr] = true
		m.mu.Unlock()
	}
	p.mu.Unlock()
	if closed {
		cancel(errProviderClosed)
		stopDial()
		conn.CloseNow()
		return nil, session.Errorf(session.CodeUnavailable, "the remote compute provider is closed")
	}
	go func() { defer p.wg.Done(); pr.run() }()
	return pr, nil
}

// startError describes a connection that broke while a command started.
func startError(ctx context.Context, a *agent, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("start command: %w", ctx.Err())
	}
	return &unreachableError{addr: a.vm.Addr, err: fmt.Errorf("start command: %w", err)}
}

// Stdin returns the command's standard input. A Write blocks while the
// agent's stdin buffer is full and fails once the command has ended or
// closed its input.
func (pr *Process) Stdin() io.WriteCloser { return pr.stdin }

// Stdout returns the command's standard output.
func (pr *Process) Stdout() io.Reader { return pr.stdout }

// Stderr returns the command's standard error.
func (pr *Process) Stderr() io.Reader { return pr.stderr }

// Signal delivers sig to every process of the command and returns when the
// agent has done so (for SIGKILL: when none is left). Signalling a command
// that has ended does nothing.
func (pr *Process) Signal(sig syscall.Signal) error {
	if pr.suspendSeen.Load() {
		// The command is suspended in a sleeping VM: wake it, or the
		// signal would wait for a wake nobody asks for.
		pr.m.wakeFor(pr)
	}
	pr.sigMu.Lock()
	pr.sigNext++
	id := pr.sigNext
	answer := make(chan error, 1)
	pr.sigWait[id] = answer
	pr.sigMu.Unlock()
	defer func() {
		pr.sigMu.Lock()
		delete(pr.sigWait, id)
		pr.sigMu.Unlock()
	}()
	if !pr.sendJSON(compute.AgentMessage{Type: "signal", ID: id, Signal: sig}) {
		return nil // The command has ended.
	}
	select {
	case err := <-answer:
		if err != nil {
			return fmt.Errorf("signal command: %w", err)
		}
		return nil
	case <-pr.ended:
		return nil
	}
}

// Wait waits until the command has ended and returns how. A command whose
// sandbox died ends with Exit.Lost set; Wait's error is for a command the
// agent could not clean up after.
func (pr *Process) Wait() (compute.Exit, error) {
	<-pr.ended
	return pr.exit, pr.err
}

// end records how the command ended, once.
func (pr *Process) end(exit compute.Exit, err error) {
	pr.endOnce.Do(func() {
		pr.exit, pr.err = exit, err
		close(pr.ended)
		pr.stdin.fail()
		pr.m.forget(pr)
	})
}

// abort ends the connection for cause; the command ends with it unless it
// has ended already.
func (pr *Process) abort(cause error) {
	pr.cancel(cause)
	pr.connMu.Lock()
	c := pr.conn
	pr.connMu.Unlock()
	if c != nil {
		c.CloseNow()
	}
}

// isSuspended reports whether the command waits for a connection.
func (pr *Process) isSuspended() bool {
	pr.connMu.Lock()
	defer pr.connMu.Unlock()
	return pr.suspended
}

// reattach dials a new connection to the suspended command on a's agent
// and hands it to the command.
func (pr *Process) reattach(ctx context.Context, a *agent, fence int64) error {
	p := pr.m.p
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, fmt.Sprintf("%s/v1/exec?attach=%d", a.base, pr.id), &websocket.DialOptions{
		HTTPClient:   p.client,
		HTTPHeader:   a.header(fence),
		Subprotocols: []string{compute.AgentSubprotocol},
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return fmt.Errorf("attach to command %d: %w", pr.id, a.answerError(resp.StatusCode, resp.Body))
		}
		return &unreachableError{addr: a.vm.Addr, err: fmt.Errorf("attach to command %d: %w", pr.id, err)}
	}
	conn.SetReadLimit(compute.AgentMaxMessage)
	typ, b, err := conn.Read(ctx)
	var first compute.AgentMessage
	if err == nil && (typ != websocket.MessageText || json.Unmarshal(b, &first) != nil || first.Type != "attached") {
		err = fmt.Errorf("the agent answered %q", b)
	}
	if err != nil {
		conn.CloseNow()
		return fmt.Errorf("attach to command %d: %w", pr.id, err)
	}
	select {
	case pr.attach <- conn:
		return nil
	case <-pr.ctx.Done():
		conn.CloseNow()
		return fmt.Errorf("attach to command %d: %w", pr.id, context.Cause(pr.ctx))
	}
}

// frame is a message queued for the writer.
type frame struct {
	text bool
	data []byte
	// pause ends the connection's writer after writing it: later frames
	// wait for the next connection.
	pause bool
}

// send queues a frame for the writer; false once the connection is gone.
func (pr *Process) send(text bool, b []byte) bool {
	select {
	case <-pr.ctx.Done():
		return false
	default:
	}
	select {
	case pr.out <- frame{text: text, data: b}:
		return true
	case <-pr.ctx.Done():
		return false
	}
}

func (pr *Process) sendJSON(m compute.AgentMessage) bool {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("remote compute: encode %s message: %v", m.Type, err)) // Plain structs always encode.
	}
	return pr.send(true, b)
}

// write is conn's only writer; it stops after a pause frame.
func (pr *Process) write(ctx context.Context, cancel context.CancelCauseFunc, conn *websocket.Conn) {
	for {
		select {
		case f := <-pr.out:
			typ := websocket.MessageBinary
			if f.text {
				typ = websocket.MessageText
			}
			if err := conn.Write(ctx, typ, f.data); err != nil {
				cancel(fmt.Errorf("write to the sandbox agent: %w", err))
				conn.CloseNow()
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

// heartbeat pings the agent over conn; one that does not answer in time
// is dead.
func (pr *Process) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, conn *websocket.Conn) {
	every := pr.m.p.cfg.Heartbeat
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			pctx, pcancel := context.WithTimeout(ctx, every)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("no answer to a ping within %v", every))
				conn.CloseNow()
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// errSuspended ends a connection the agent let go after a suspension: the
// command keeps running in the (paused) VM and waits for a new connection.
var errSuspended = errors.New("suspended")

// run serves the command's connections: the first, and one after each
// suspension, until the command ends or its sandbox is lost.
func (pr *Process) run() {
	defer pr.stopDial()
	pr.connMu.Lock()
	conn := pr.conn
	pr.connMu.Unlock()
	var err error
	for {
		err = pr.serve(conn)
		if !errors.Is(err, errSuspended) {
			break
		}
		pr.connMu.Lock()
		pr.conn, pr.suspended = nil, true
		pr.connMu.Unlock()
		select {
		case conn = <-pr.attach:
			err = nil
		case <-pr.ctx.Done():
			err = context.Cause(pr.ctx)
		}
		pr.connMu.Lock()
		pr.conn, pr.suspended = conn, false
		pr.connMu.Unlock()
		if err != nil {
			break
		}
	}
	pr.finish(err)
}

// serve runs one connection until it ends and returns why.
func (pr *Process) serve(conn *websocket.Conn) error {
	cctx, ccancel := context.WithCancelCause(pr.ctx)
	defer ccancel(nil)
	var wg sync.WaitGroup
	wg.Go(func() { pr.write(cctx, ccancel, conn) })
	wg.Go(func() { pr.heartbeat(cctx, ccancel, conn) })
	err := pr.readLoop(cctx, conn)
	ccancel(err)
	wg.Wait()
	conn.CloseNow()
	return err
}

// finish ends the command after its last connection, if the agent did not.
func (pr *Process) finish(err error) {
	pr.cancel(err)
	pr.stdout.finish()
	pr.stderr.finish()
	select {
	case <-pr.ended:
		return
	default:
	}
	cause := context.Cause(pr.ctx)
	if errors.Is(cause, errProviderClosed) {
		pr.end(compute.Exit{Code: -1, Detail: "stopped: " + errProviderClosed.Error()}, nil)
		return
	}
	// The agent or its VM is gone, or unreachable: the command's fate is
	// unknown and the sandbox is replaced.
	a := pr.agent
	pr.m.p.log.Warn("sandbox died during a command", "session", string(pr.m.id), "addr", a.vm.Addr, "err", cause)
	pr.m.lost(a)
	pr.end(compute.Exit{Code: -1, Lost: true,
		Detail: fmt.Sprintf("sandbox died: lost the sandbox agent at %s during the command (%v); the next command gets a fresh sandbox", a.vm.Addr, cause)}, nil)
}

// readLoop reads messages until the connection ends and returns why:
// errSuspended when the agent let it go after a suspension.
func (pr *Process) readLoop(ctx context.Context, conn *websocket.Conn) error {
	suspending := false
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			if suspending && pr.ctx.Err() == nil {
				// Whatever ended it, nothing was in flight.
				return errSuspended
			}
			if c := context.Cause(ctx); c != nil {
				return c
			}
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				select {
				case <-pr.ended:
					return errors.New("closed")
				default:
				}
				return errors.New("the agent closed the connection before the command ended")
			}
			return fmt.Errorf("connection broken: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 {
				return errors.New("protocol violation: empty binary message")
			}
			var b *streamBuf
			switch data[0] {
			case compute.AgentStdout:
				b = pr.stdout
			case compute.AgentStderr:
				b = pr.stderr
			default:
				conn.Close(websocket.StatusPolicyViolation, "output on an unknown stream")
				return fmt.Errorf("protocol violation: output on unknown stream %d (%d bytes, starting %q)", data[0], len(data), data[:min(len(data), 16)])
			}
			if size, ok := b.push(data[1:]); !ok {
				conn.Close(websocket.StatusPolicyViolation, "output beyond the window")
				return fmt.Errorf("protocol violation: %d bytes of %s beyond the window: %d of %d buffered", len(data)-1, b.name, size, b.window)
			}
			continue
		}
		var m compute.AgentMessage
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("protocol violation: control message: %w", err)
		}
		switch m.Type {
		case "suspended":
			// The agent sends nothing more on this connection; the ack
			// is the last thing this side sends on it.
			suspending = true
			pr.suspendSeen.Store(true)
			b, _ := json.Marshal(compute.AgentMessage{Type: "suspend_ack"})
			select {
			case pr.out <- frame{text: true, data: b, pause: true}:
			case <-ctx.Done():
			}
		case "eof":
			switch m.Stream {
			case "stdout":
				pr.stdout.finish()
			case "stderr":
				pr.stderr.finish()
			}
		case "credit":
			if m.Stream == "stdin" && m.Bytes > 0 {
				pr.stdin.grant(m.Bytes)
			}
		case "stdin_closed":
			pr.stdin.fail()
		case "signaled":
			pr.sigMu.Lock()
			answer := pr.sigWait[m.ID]
			pr.sigMu.Unlock()
			if answer != nil {
				var err error
				if m.Error != nil {
					err = m.Error
				}
				answer <- err
			}
		case "exit":
			if m.Exit == nil {
				return errors.New("protocol violation: exit without a status")
			}
			var err error
			if m.Error != nil {
				err = m.Error
			}
			pr.stdout.finish()
			pr.stderr.finish()
			pr.end(*m.Exit, err)
		}
	}
}

// streamBuf is an output stream of a command: what the agent sent and the
// reader has not consumed, at most the window.
type streamBuf struct {
	pr     *Process
	name   string
	window int64

	mu      sync.Mutex
	cond    *sync.Cond
	chunks  [][]byte // guarded by mu
	size    int64    // guarded by mu
	eof     bool     // guarded by mu
	pending int64    // guarded by mu: consumed bytes not yet returned as credit
}

func newStreamBuf(pr *Process, name string, window int64) *streamBuf {
	b := &streamBuf{pr: pr, name: name, window: window}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// push adds a chunk from the agent; false when it exceeds the window, with
// what was buffered.
func (b *streamBuf) push(p []byte) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.size+int64(len(p)) > b.window {
		return b.size, false
	}
	if len(p) > 0 && !b.eof {
		b.chunks = append(b.chunks, p)
		b.size += int64(len(p))
		b.cond.Broadcast()
	}
	return b.size, true
}

// finish marks the end of the stream.
func (b *streamBuf) finish() {
	b.mu.Lock()
	b.eof = true
	b.cond.Broadcast()
	b.mu.Unlock()
}

// Read reads what the agent sent, blocking until there is some or the
// stream ended, and returns credit to the agent as it goes.
func (b *streamBuf) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b.mu.Lock()
	for len(b.chunks) == 0 && !b.eof {
		b.cond.Wait()
	}
	if len(b.chunks) == 0 {
		b.mu.Unlock()
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && len(b.chunks) > 0 {
		c := copy(p[n:], b.chunks[0])
		n += c
		if c == len(b.chunks[0]) {
			b.chunks[0] = nil
			b.chunks = b.chunks[1:]
		} else {
			b.chunks[0] = b.chunks[0][c:]
		}
	}
	b.size -= int64(n)
	b.pending += int64(n)
	var grant int64
	if b.pending >= b.window/4 && !b.eof {
		grant, b.pending = b.pending, 0
	}
	b.mu.Unlock()
	if grant > 0 {
		b.pr.sendJSON(compute.AgentMessage{Type: "credit", Stream: b.name, Bytes: grant})
	}
	return n, nil
}

// stdinWriter is a command's stdin: writes go to the agent as far as its
// credit allows.
type stdinWriter struct {
	pr *Process

	writeMu sync.Mutex // serializes writes

	mu     sync.Mutex
	credit int64         // guarded by mu
	closed bool          // guarded by mu: Close was called
	wake   chan struct{} // signalled when credit grows
	broken chan struct{} // closed when writes must fail
	once   sync.Once
}

func (s *stdinWriter) grant(n int64) {
	s.mu.Lock()
	s.credit += n
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// fail makes current and later writes fail.
func (s *stdinWriter) fail() { s.once.Do(func() { close(s.broken) }) }

// take waits for credit and takes up to n bytes of it.
func (s *stdinWriter) take(n int) (int, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, errStdinClosed
		}
		select {
		case <-s.broken:
			s.mu.Unlock()
			return 0, errStdinClosed
		default:
		}
		if s.credit > 0 {
			k := int(min(int64(n), s.credit, compute.AgentMaxChunk))
			s.credit -= int64(k)
			s.mu.Unlock()
			return k, nil
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-s.broken:
		}
	}
}

// Write sends b to the command's stdin.
func (s *stdinWriter) Write(b []byte) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	written := 0
	for written < len(b) {
		k, err := s.take(len(b) - written)
		if err != nil {
			return written, err
		}
		frame := make([]byte, 1+k)
		frame[0] = compute.AgentStdin
		copy(frame[1:], b[written:written+k])
		if !s.pr.send(false, frame) {
			return written, errStdinClosed
		}
		written += k
	}
	return written, nil
}

// Close closes the command's stdin after what was written before; a Write
// blocked meanwhile fails. It is safe to call more than once.
func (s *stdinWriter) Close() error {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if !already {
		select {
		case s.wake <- struct{}{}:
		default:
		}
		s.pr.sendJSON(compute.AgentMessage{Type: "close_stdin"})
	}
	return nil
}
