package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
)

// Defaults of WatchOptions.
const (
	DefaultMinBackoff   = 250 * time.Millisecond
	DefaultMaxBackoff   = 10 * time.Second
	DefaultBuffer       = 256
	DefaultHelloTimeout = 30 * time.Second
	DefaultWriteTimeout = 10 * time.Second
	// DefaultReadLimit bounds one server→client frame. Event frames carry
	// harness objects of any size, so this is well above the 1 MiB limit of
	// client→server frames.
	DefaultReadLimit = 16 << 20
)

// closeTimeout bounds the close handshake when a Stream is closed.
const closeTimeout = 2 * time.Second

// FrameReconnecting is the Type of the frames a Stream adds to the server's
// (session.FrameHello, FrameEvent, FramePresence, FrameAck, FrameError): the
// connection was lost and the stream will reconnect after Reconnect.Delay.
// They are advice, delivered only when the consumer is not behind.
const FrameReconnecting = "reconnecting"

// Errors of streams.
var (
	// ErrClosed is the Err of a stream ended by Close.
	ErrClosed = errors.New("client: stream closed")
	// ErrEpochChanged ends a stream whose session's history was rebuilt
	// (its epoch changed): seqs seen before no longer name the same events,
	// so the consumer must reload the session from the start.
	ErrEpochChanged = errors.New("client: session history was rebuilt (epoch changed); reload it from the start")
	// errProtocol marks answers that are not the atrium.v1 protocol at all.
	errProtocol = errors.New("client: protocol error")
)

// WatchOptions tune a Stream. The zero value uses the Default* constants.
type WatchOptions struct {
	// MinBackoff and MaxBackoff bound the delay before each reconnection
	// attempt. The delay doubles with each failed attempt, starting at
	// MinBackoff, and is jittered to between half and all of its value.
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts is how many reconnection attempts in a row may fail
	// before the stream gives up; 0 retries until the context ends.
	MaxAttempts int
	// Buffer is how many frames wait for the consumer. A consumer that
	// falls further behind stops the stream reading, and the gateway may
	// then disconnect it as a slow consumer; the stream reconnects and
	// resumes, so nothing is lost.
	Buffer int
	// Epoch, if set, is the epoch the caller's `after` belongs to; a
	// session with another epoch ends the stream with ErrEpochChanged.
	Epoch string
	// HelloTimeout bounds the handshake and the wait for the hello frame.
	HelloTimeout time.Duration
	// WriteTimeout bounds writing one client frame.
	WriteTimeout time.Duration
	// ReadLimit bounds one server frame; default DefaultReadLimit.
	ReadLimit int64
	// Deltas asks for the streaming text of agent messages: frames of
	// Type session.FrameDelta, delivered live between events. They are not
	// history: a reconnection resumes with events only, and the
	// agent_message event that follows a message's deltas holds its whole
	// text.
	Deltas bool
}

func (o WatchOptions) withDefaults() WatchOptions {
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	if o.HelloTimeout <= 0 {
		o.HelloTimeout = DefaultHelloTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = DefaultReadLimit
	}
	return o
}

// Frame is one thing a Stream delivers. Type says which field is set.
type Frame struct {
	// Type is session.FrameHello, FrameEvent, FramePresence, FrameAck,
	// FrameError, FrameReconnecting, or (with WatchOptions.Deltas)
	// session.FrameDelta. A server's events frames (session.FrameEvents)
	// are delivered as one FrameEvent per event.
	Type string
	// After is, for hello and reconnecting frames, the seq the connection
	// resumes after: its events start at After+1.
	After session.Seq
	// Hello is the first frame of every connection.
	Hello *session.HelloFrame
	// Event is the next event: its Seq is exactly one more than the
	// previous event's (or than Watch's after, for the first).
	Event *session.Event
	// Raw is the event exactly as the server encoded it.
	Raw json.RawMessage
	// Presence lists who is watching the session now.
	Presence *session.PresenceFrame
	// Ack says a prompt sent with Stream.Prompt is durable.
	Ack *session.AckFrame
	// Error reports a problem with a frame this client sent (ClientID set
	// for prompts), such as a viewer's prompt being forbidden.
	Error *session.ErrorFrame
	// Reconnect says why and when the stream reconnects.
	Reconnect *Reconnect
	// Delta is streaming text of the agent message being written.
	Delta *session.DeltaFrame
}

// Reconnect describes a lost connection.
type Reconnect struct {
	// Attempt counts the reconnection attempts in a row, from 1.
	Attempt int
	// Delay is the wait before this attempt.
	Delay time.Duration
	// Err is why the previous connection (or attempt) ended.
	Err error
}

// Stream is a live view of one session over a WebSocket. It delivers a hello
// frame for each connection, then every event after the resume point exactly
// once in seq order, presence, acks and errors; when the connection drops it
// reconnects with backoff and resumes after the last event it delivered.
//
// Frames are read with Next or from Frames (not both). The stream ends when
// Close is called, Watch's context ends, or a terminal error occurs (the
// session was deleted, access was revoked, the epoch changed); Err then says
// which.
type Stream struct {
	c    *Client
	id   session.ID
	url  string // ws endpoint without query
	opts WatchOptions

	ctx    context.Context // the stream's life; cancelled by Close
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	frames chan Frame    // to the consumer; closed after done
	out    chan outFrame // client frames to the current connection's writer
	done   chan struct{} // closed when run returns
	err    error         // why the stream ended; written by run before done is closed

	last  atomic.Int64 // seq of the last event delivered; written by run only
	epoch string       // owned by run (and Watch before run starts)
}

// outFrame is a client frame waiting for a writer.
type outFrame struct {
	ctx  context.Context
	b    []byte
	done chan error // buffered: the writer never blocks on it
}

// Watch opens a live stream of session id's events with seq > after. The
// first connection is made before Watch returns, so a wrong id, a missing
// role or an unreachable server is reported here; later disconnects are
// retried by the stream. The stream lives until ctx ends or Close is called;
// always call Close.
func (c *Client) Watch(ctx context.Context, id session.ID, after session.Seq, opts WatchOptions) (*Stream, error) {
	p, err := sessionPath(id, "/ws")
	if err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, session.Errorf(session.CodeBadRequest, "after must not be negative")
	}
	opts = opts.withDefaults()
	s := &Stream{
		c:      c,
		id:     id,
		url:    c.Server + p,
		opts:   opts,
		frames: make(chan Frame, opts.Buffer),
		out:    make(chan outFrame),
		done:   make(chan struct{}),
		epoch:  opts.Epoch,
	}
	s.last.Store(after)
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	conn, hello, stop, err := s.connect()
	if err != nil {
		s.cancel(err)
		return nil, err
	}
	s.wg.Go(func() { s.run(conn, hello, stop) })
	return s, nil
}

// Frames returns the channel of frames. It is closed when the stream ends,
// after the frames already received.
func (s *Stream) Frames() <-chan Frame { return s.frames }

// Next returns the next frame. When the stream has ended it returns Err (or
// ErrClosed); when ctx ends first it returns ctx's error.
func (s *Stream) Next(ctx context.Context) (Frame, error) {
	select {
	case f, ok := <-s.frames:
		if !ok {
			return Frame{}, s.Err()
		}
		return f, nil
	case <-ctx.Done():
		return Frame{}, ctx.Err()
	}
}

// Err returns why the stream ended: ErrClosed after Close, the context's
// error when Watch's context ended, or the terminal error. It returns nil
// while the stream runs.
func (s *Stream) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Done is closed when the stream has ended.
func (s *Stream) Done() <-chan struct{} { return s.done }

// LastSeq returns the seq of the last event the stream has handed to its
// consumer's buffer (or Watch's after, before the first). A reconnection
// resumes after it. A consumer that must resume later, in another process,
// should keep the seq of the last event it has processed instead.
func (s *Stream) LastSeq() session.Seq { return s.last.Load() }

// Session returns the session id the stream watches.
func (s *Stream) Session() session.ID { return s.id }

// Close ends the stream, closing the connection with a close handshake, and
// waits for its goroutines. It is safe to call more than once.
func (s *Stream) Close() error {
	s.cancel(ErrClosed)
	s.wg.Wait()
	return nil
}

// Prompt sends a prompt frame. The gateway answers with an ack frame
// carrying clientID and the seq of the message event once it is durable, or
// an error frame with clientID. Prompt returns when the frame is written; if
// the stream is reconnecting it waits for the next connection (or ctx), even
// while the consumer is behind on frames, so it may be called from the
// goroutine that reads them. A
// frame written just before a connection dies may be lost: a prompt is
// durable only when its ack (or its message event) arrives.
func (s *Stream) Prompt(ctx context.Context, text, clientID string) error {
	if err := checkPrompt(text, clientID); err != nil {
		return err
	}
	return s.send(ctx, session.ClientFrame{Type: session.FramePrompt, Text: text, ClientID: clientID})
}

// Cancel sends a cancel frame: the running turn stops.
func (s *Stream) Cancel(ctx context.Context) error {
	return s.send(ctx, session.ClientFrame{Type: session.FrameCancel})
}

// Approve sends an answer to the pending approval approvalID.
func (s *Stream) Approve(ctx context.Context, approvalID string, allow bool) error {
	if approvalID == "" {
		return session.Errorf(session.CodeBadRequest, "approval id is empty")
	}
	return s.send(ctx, session.ClientFrame{Type: session.FrameApprove, ID: approvalID, Allow: &allow})
}

// Typing sends a typing frame (a driver's): typing true says the caller is
// typing a prompt, which the session's watchers see in presence
// ("typing":true on this connection's watcher) until the gateway's typing
// TTL passes without another typing frame, a prompt is sent, or Typing(false)
// says the caller stopped. Repeat it while typing; the gateway takes at
// most a few per TTL.
func (s *Stream) Typing(ctx context.Context, typing bool) error {
	f := session.ClientFrame{Type: session.FrameTyping}
	if !typing {
		f.Typing = &typing
	}
	return s.send(ctx, f)
}

func (s *Stream) send(ctx context.Context, f session.ClientFrame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", f.Type, err)
	}
	req := outFrame{ctx: ctx, b: b, done: make(chan error, 1)}
	select {
	case s.out <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		if err := s.Err(); err != nil {
			return err
		}
		return ErrClosed
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run serves connections one after another until the stream ends.
func (s *Stream) run(conn *websocket.Conn, hello session.HelloFrame, stop context.CancelFunc) {
	defer func() {
		close(s.done)
		close(s.frames)
	}()
	attempt := 0
	for {
		started := time.Now()
		progressed, err := s.serve(conn, hello)
		stop()
		if s.ctx.Err() != nil {
			s.err = context.Cause(s.ctx)
			return
		}
		if progressed || time.Since(started) >= s.opts.MaxBackoff {
			attempt = 0 // the connection was good: start the backoff over
		}
		for {
			attempt++
			if Terminal(err) {
				s.err = err
				return
			}
			if s.opts.MaxAttempts > 0 && attempt > s.opts.MaxAttempts {
				s.err = fmt.Errorf("reconnect to session %s: gave up after %d attempts: %w", s.id, attempt-1, err)
				return
			}
			delay := backoff(attempt, s.opts.MinBackoff, s.opts.MaxBackoff)
			var ra retryAfterError
			if errors.As(err, &ra) && ra.after > delay {
				delay = ra.after
			}
			// Reconnecting frames are advice: dropped when the consumer
			// is behind, so the stream never waits for it to reconnect.
			select {
			case s.frames <- Frame{Type: FrameReconnecting, After: s.last.Load(), Reconnect: &Reconnect{Attempt: attempt, Delay: delay, Err: err}}:
			default:
			}
			if !s.sleep(delay) {
				s.err = context.Cause(s.ctx)
				return
			}
			conn, hello, stop, err = s.connect()
			if err == nil {
				break
			}
			if s.ctx.Err() != nil {
				s.err = context.Cause(s.ctx)
				return
			}
		}
	}
}

// backoff returns the delay before reconnection attempt n (from 1), by
// Atrium's one backoff policy (session/retry): min·2^(n-1), capped at max,
// jittered to between half and all of it.
func backoff(n int, min, max time.Duration) time.Duration {
	return retry.Policy{Min: min, Max: max}.Delay(n)
}

func (s *Stream) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

func (s *Stream) emit(f Frame) bool {
	select {
	case s.frames <- f:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// retryAfterError carries a server's Retry-After with its error.
type retryAfterError struct {
	error
	after time.Duration
}

func (e retryAfterError) Unwrap() error { return e.error }

// connect dials, resuming after LastSeq, and reads the hello frame. The
// returned stop function ends the connection's context; call it once the
// connection is done.
func (s *Stream) connect() (*websocket.Conn, session.HelloFrame, context.CancelFunc, error) {
	var hello session.HelloFrame
	// The connection's context must outlive Close's cancellation, so the
	// close handshake can still run; until the hello arrives, Close (or
	// the handshake timeout) aborts the dial through it.
	cctx, stop := context.WithCancel(context.WithoutCancel(s.ctx))
	unhook := context.AfterFunc(s.ctx, stop)
	timer := time.AfterFunc(s.opts.HelloTimeout, stop)
	fail := func(conn *websocket.Conn, err error) (*websocket.Conn, session.HelloFrame, context.CancelFunc, error) {
		if conn != nil {
			conn.CloseNow()
		}
		timer.Stop()
		unhook()
		stop()
		if s.ctx.Err() != nil {
			return nil, hello, nil, context.Cause(s.ctx)
		}
		return nil, hello, nil, err
	}

	header, err := s.c.header(cctx, true)
	if err != nil {
		return fail(nil, fmt.Errorf("connect to session %s: %w", s.id, err))
	}
	after := s.last.Load()
	u := s.url + "?" + url.Values{"after": {strconv.FormatInt(after, 10)}}.Encode()
	conn, resp, err := websocket.Dial(cctx, u, &websocket.DialOptions{
		HTTPClient: s.c.httpClient(),
		HTTPHeader: header,
		// atrium.v1+batch lets the gateway send history in events frames;
		// one without it picks atrium.v1.
		Subprotocols: []string{session.SubprotocolBatch, session.Subprotocol},
	})
	if err != nil {
		if cctx.Err() != nil && s.ctx.Err() == nil {
			return fail(nil, fmt.Errorf("connect to session %s: no answer within %s", s.id, s.opts.HelloTimeout))
		}
		return fail(nil, dialError(s.id, resp, err))
	}
	if p := conn.Subprotocol(); p != session.Subprotocol && p != session.SubprotocolBatch {
		return fail(conn, fmt.Errorf("connect to session %s: server did not agree to subprotocol %s: %w", s.id, session.Subprotocol, errProtocol))
	}
	conn.SetReadLimit(s.opts.ReadLimit)
	_, b, err := conn.Read(cctx)
	if !timer.Stop() {
		return fail(conn, fmt.Errorf("connect to session %s: no hello within %s", s.id, s.opts.HelloTimeout))
	}
	if err != nil {
		return fail(conn, fmt.Errorf("read hello of session %s: %w", s.id, err))
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return fail(conn, fmt.Errorf("decode first frame of session %s: %v: %w", s.id, err, errProtocol))
	}
	switch head.Type {
	case session.FrameHello:
		if err := json.Unmarshal(b, &hello); err != nil {
			return fail(conn, fmt.Errorf("decode hello of session %s: %v: %w", s.id, err, errProtocol))
		}
	case session.FrameError:
		var ef session.ErrorFrame
		if err := json.Unmarshal(b, &ef); err != nil || ef.Code == "" {
			return fail(conn, fmt.Errorf("decode error frame of session %s: %w", s.id, errProtocol))
		}
		return fail(conn, &session.Error{Code: ef.Code, Message: ef.Message})
	default:
		return fail(conn, fmt.Errorf("connect to session %s: first frame is %q, want hello: %w", s.id, head.Type, errProtocol))
	}
	if hello.Session.Epoch != "" {
		if s.epoch != "" && hello.Session.Epoch != s.epoch {
			return fail(conn, fmt.Errorf("session %s: epoch %s, was %s: %w", s.id, hello.Session.Epoch, s.epoch, ErrEpochChanged))
		}
		s.epoch = hello.Session.Epoch
	}
	unhook()
	return conn, hello, stop, nil
}

// dialError explains a failed handshake: the gateway's REST error when it
// answered with one, else the network error.
func dialError(id session.ID, resp *http.Response, err error) error {
	if resp == nil {
		return fmt.Errorf("connect to session %s: %w", id, err)
	}
	switch {
	case resp.StatusCode == http.StatusSwitchingProtocols:
		return fmt.Errorf("connect to session %s: %v: %w", id, err, errProtocol)
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return fmt.Errorf("connect to session %s: server answered %s instead of switching to WebSocket (is this an Atrium gateway?): %w", id, resp.Status, errProtocol)
	}
	e := decodeError(resp)
	if secs, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && secs > 0 {
		return retryAfterError{error: e, after: time.Duration(secs) * time.Second}
	}
	return e
}

// serve delivers the frames of one connection until it ends. It reports
// whether any new event was delivered and why the connection ended.
func (s *Stream) serve(conn *websocket.Conn, hello session.HelloFrame) (progressed bool, err error) {
	defer conn.CloseNow()
	readCtx, stopRead := context.WithCancel(context.Background())
	defer stopRead()
	var wg sync.WaitGroup
	// The writer starts before the hello is delivered, so a consumer
	// blocked in Prompt while the stream reconnects is released even when
	// it is behind on frames.
	wg.Go(func() { s.writeLoop(conn, readCtx, stopRead) })
	// If the stream is closing, emit fails and readLoop drains the
	// connection until the writer's close handshake ends.
	s.emit(Frame{Type: session.FrameHello, After: s.last.Load(), Hello: &hello})
	progressed, err = s.readLoop(readCtx, conn)
	stopRead()
	wg.Wait()
	return progressed, err
}

// readLoop reads frames and delivers them. When the stream is closing it
// keeps reading, dropping frames, so the close handshake can complete.
func (s *Stream) readLoop(ctx context.Context, conn *websocket.Conn) (progressed bool, err error) {
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			return progressed, err
		}
		if s.ctx.Err() != nil {
			continue
		}
		if isEventsFrame(b) {
			n, err := s.deliverEvents(b)
			if n > 0 {
				progressed = true
			}
			if err != nil {
				return progressed, err
			}
			continue
		}
		f, ok, err := s.decode(b)
		if err != nil {
			return progressed, err
		}
		if !ok {
			continue
		}
		if f.Event != nil {
			// Advance before delivering, so LastSeq is never behind an
			// event the consumer holds.
			s.last.Store(f.Event.Seq)
			progressed = true
		}
		s.emit(f)
	}
}

// isEventsFrame reports whether b is an events frame, as gateways encode it.
func isEventsFrame(b []byte) bool {
	return len(b) >= len(session.EventsFrameHead) && string(b[:len(session.EventsFrameHead)]) == session.EventsFrameHead
}

// deliverEvents delivers the events of an events frame, one frame each, and
// returns how many were new.
func (s *Stream) deliverEvents(b []byte) (n int, err error) {
	var ef session.EventsFrame
	if err := json.Unmarshal(b, &ef); err != nil {
		return 0, fmt.Errorf("decode events frame: %w", err)
	}
	for _, raw := range ef.Events {
		ev, err := s.decodeEvent(raw)
		if err != nil {
			return n, err
		}
		if ev == nil {
			continue
		}
		s.last.Store(ev.Seq)
		n++
		if !s.emit(Frame{Type: session.FrameEvent, Event: ev, Raw: raw}) {
			return n, nil
		}
	}
	return n, nil
}

// decodeEvent decodes the next event; it returns nil for one delivered
// already and a gapError for one that does not follow.
func (s *Stream) decodeEvent(raw json.RawMessage) (*session.Event, error) {
	var ev session.Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, fmt.Errorf("decode event: %w", err)
	}
	last := s.last.Load()
	if ev.Seq <= last {
		return nil, nil // already delivered
	}
	if ev.Seq != last+1 {
		return nil, gapError{last: last, got: ev.Seq}
	}
	return &ev, nil
}

// gapError reports an event that does not follow the last one delivered.
type gapError struct{ last, got session.Seq }

func (e gapError) Error() string {
	return fmt.Sprintf("event seq %d does not follow %d; resuming from %d", e.got, e.last, e.last)
}

// decode parses one server frame. ok is false for frames that are not
// delivered: duplicate events and frame types this client does not know.
func (s *Stream) decode(b []byte) (f Frame, ok bool, err error) {
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return f, false, fmt.Errorf("decode frame: %w", err)
	}
	f.Type = head.Type
	switch head.Type {
	case session.FrameEvent:
		var ef session.EventFrame
		if err := json.Unmarshal(b, &ef); err != nil {
			return f, false, fmt.Errorf("decode event frame: %w", err)
		}
		ev, err := s.decodeEvent(ef.Event)
		if ev == nil || err != nil {
			return f, false, err
		}
		f.Event, f.Raw = ev, ef.Event
	case session.FramePresence:
		f.Presence = new(session.PresenceFrame)
		err = json.Unmarshal(b, f.Presence)
	case session.FrameAck:
		f.Ack = new(session.AckFrame)
		err = json.Unmarshal(b, f.Ack)
	case session.FrameError:
		f.Error = new(session.ErrorFrame)
		err = json.Unmarshal(b, f.Error)
	case session.FrameDelta:
		if !s.opts.Deltas {
			return f, false, nil
		}
		f.Delta = new(session.DeltaFrame)
		err = json.Unmarshal(b, f.Delta)
	default:
		return f, false, nil // a hello mid-connection, or a newer frame type
	}
	if err != nil {
		return f, false, fmt.Errorf("decode %s frame: %w", head.Type, err)
	}
	return f, true, nil
}

// writeLoop writes client frames to conn until the connection ends; when the
// stream closes it performs the close handshake.
func (s *Stream) writeLoop(conn *websocket.Conn, readCtx context.Context, stopRead context.CancelFunc) {
	for {
		select {
		case <-readCtx.Done():
			return
		case <-s.ctx.Done():
			// Bound the handshake: cancelling the reader closes the socket.
			t := time.AfterFunc(closeTimeout, stopRead)
			_ = conn.Close(websocket.StatusNormalClosure, "")
			t.Stop()
			return
		case req := <-s.out:
			if err := req.ctx.Err(); err != nil {
				req.done <- err
				continue
			}
			wctx, cancel := context.WithTimeout(context.Background(), s.opts.WriteTimeout)
			err := conn.Write(wctx, websocket.MessageText, req.b)
			cancel()
			if err != nil {
				req.done <- fmt.Errorf("write frame: %w", err)
				stopRead()
				return
			}
			req.done <- nil
		}
	}
}
