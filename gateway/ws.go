package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
)

// wsConn is one WebSocket watching a session. Its reader goroutine handles
// client frames, and its commander (started with the first command) sends
// their commands; its writer goroutine owns every write and is the only user
// of its feed.
type wsConn struct {
	s      *Server
	ws     *websocket.Conn
	conn   *batchConn // under ws
	p      session.Principal
	id     session.ID
	w      *watcher
	after  session.Seq // the resume point
	access access
	remote string // the client's address, for the audit log

	// batch is set when the client chose session.SubprotocolBatch: history
	// events then go out in events frames.
	batch bool

	// Owned by the writer goroutine.
	holding bool   // conn holds a batch: flush releases it
	scratch []byte // frame of a history event
	// events is the events frame being gathered (batch only): events
	// since the last flush or other frame; empty when none.
	events []byte
	// one is a live event held back (batch only, while events is empty):
	// sent alone, in the frame built once for every watcher, unless more
	// events follow in the same batch, which then go with it in one events
	// frame.
	one *event

	// Owned by the reader goroutine.
	cmds     *commander // nil until the first command
	typing   time.Time  // when the last typing frame was taken (the rate limit)
	typingOn bool       // the last typing frame taken said typing, and no prompt or stop followed
}

// serveWS serves GET /v1/sessions/{id}/ws?after=N.
func (s *Server) serveWS(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	after, err := parseSeq("after", r.URL.Query().Get("after"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	a, err := s.check(r.Context(), p, id, session.ActRead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !a.allowed() {
		// The catalog does not (yet) let the caller in: only an active
		// actor can. Ask it now, so a session the caller may not see is a
		// 404 rather than a socket that closes at once.
		if _, err := s.call(r.Context(), p, id, session.Command{Op: session.OpInfo}, false); err != nil {
			if errors.Is(err, errNotActive) {
				err = a.notActive()
			}
			s.auditDenied(r.Context(), remoteOf(r), p, id, "watch", a.entry, err)
			s.fail(w, r, err)
			return
		}
	}
	if !s.originAllowed(r) {
		s.fail(w, r, session.Errorf(session.CodeForbidden,
			"WebSocket from origin %s refused: add it to the gateway's allowed origins", r.Header.Get("Origin")))
		return
	}
	if offered := headerTokens(r, "Sec-WebSocket-Protocol"); len(offered) > 0 &&
		!slices.Contains(offered, session.Subprotocol) && !slices.Contains(offered, session.SubprotocolBatch) {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, "unsupported WebSocket subprotocol: use %s", session.Subprotocol))
		return
	}
	if !s.track() {
		s.fail(w, r, session.Errorf(session.CodeUnavailable, "the gateway is shutting down: reconnect"))
		return
	}
	defer s.conns.Done()

	hj := &batchHijacker{ResponseWriter: w, timeout: s.writeTimeout, pool: s.batches}
	ws, err := websocket.Accept(hj, r, &websocket.AcceptOptions{
		Subprotocols:    []string{session.SubprotocolBatch, session.Subprotocol}, // batch if offered
		OriginPatterns:  s.origins,
		CompressionMode: websocket.CompressionDisabled, // ~1.2 MB per connection otherwise.
	})
	if err != nil {
		return // Accept has answered.
	}
	if hj.conn == nil { // the library found another http.Hijacker: cannot happen.
		s.log.Error("websocket accepted without its batchConn", "session", string(id))
		_ = ws.CloseNow()
		return
	}
	ws.SetReadLimit(session.MaxFrameBytes) // a bigger frame closes with 1009.

	c := &wsConn{s: s, ws: ws, conn: hj.conn, p: p, id: id, w: s.newWatcher(p.User, false), after: after, access: a, remote: remoteOf(r)}
	c.w.token = apiToken(r, p)
	c.w.deltas = true
	stopExpiry := s.closeAtExpiry(c.w, p)
	c.batch = ws.Subprotocol() == session.SubprotocolBatch
	if a.allowed() {
		c.w.setRole(roleIn(a.entry, p))
	}
	s.metrics.conns.WithLabelValues("ws").Inc()

	// The connection is hijacked, so this handler returns and the
	// connection lives on in two fresh goroutines with small stacks: its
	// writer and its reader (which starts a commander at the first
	// command, and stops it when the connection ends).
	done := make(chan struct{})
	s.conns.Go(func() {
		defer close(done)
		c.write()
	})
	s.conns.Go(func() {
		defer s.metrics.conns.WithLabelValues("ws").Dec()
		c.read()
		stopExpiry()
		if c.cmds != nil {
			c.cmds.stop()
		}
		c.w.q.finish(ending{}) // the peer left or the connection broke: stop the writer.
		<-done
	})
}

// write runs the connection's writer until the connection ends, then closes
// it with the ending's code.
func (c *wsConn) write() {
	end, err := c.run()
	if err != nil {
		_ = c.send(errorFrame(err, ""))
	}
	if c.flush() != nil || end.code == 0 {
		_ = c.ws.CloseNow()
		return
	}
	_ = c.ws.Close(end.code, end.reason)
}

func (c *wsConn) run() (ending, error) {
	ctx := c.s.ctx
	f := &feed{s: c.s, p: c.p, id: c.id, w: c.w, access: c.access}
	t, err := c.s.hub.join(ctx, c.id, c.w)
	if err != nil {
		return f.failed(err)
	}
	defer c.s.hub.leave(t, c.w)

	first, err := f.open(ctx, c.after)
	if err != nil {
		c.s.auditDenied(ctx, c.remote, c.p, c.id, "watch", c.access.entry, err)
		return f.failed(err)
	}
	info, err := c.s.call(ctx, c.p, c.id, session.Command{Op: session.OpInfo}, true)
	if err == nil && info.Session == nil {
		err = session.Errorf(session.CodeInternal, "info reply of session %s has no session", c.id)
	}
	if err != nil {
		c.s.auditDenied(ctx, c.remote, c.p, c.id, "watch", c.access.entry, err)
		return f.failed(err)
	}
	sess := *info.Session
	f.owner, f.roleSeq = sess.Owner, sess.LastSeq
	c.w.setRole(sess.Role)
	hello, err := json.Marshal(session.HelloFrame{
		Type: session.FrameHello, Session: sess, You: session.You{User: c.p.User, Role: sess.Role}, LastSeq: first.LastSeq,
	})
	if err != nil {
		return f.failed(err)
	}
	if err := c.send(hello); err != nil {
		return f.failed(err)
	}
	if err := f.replay(ctx, first, c); err != nil {
		return f.failed(err)
	}
	return f.pump(ctx, c)
}

// maxEventsFrameBytes bounds an events frame: one is sent when the events
// gathered reach it. (A single larger event is a frame of its own.)
const maxEventsFrameBytes = maxBatchBytes

// event writes ev's frame. When the client takes batches, events written
// together (history, or live events the writer took from its queue at
// once) go in events frames; a live event alone goes in its frame, built
// once for every watcher. Otherwise a live event goes in that frame, and a
// history event's is built in a scratch buffer.
func (c *wsConn) event(ev *event) error {
	live := ev.frame != nil
	if live {
		c.s.metrics.fanoutLag.Observe(time.Since(ev.recv).Seconds())
	}
	if c.batch {
		if live && c.one == nil && len(c.events) == 0 {
			c.one = ev
			return nil
		}
		if c.one != nil {
			one := c.one
			c.one = nil
			if err := c.gather(one.raw); err != nil {
				return err
			}
		}
		return c.gather(ev.raw)
	}
	if live {
		if err := c.sendEvents(); err != nil {
			return err
		}
		return c.sendWire(ev.wire)
	}
	c.scratch = session.AppendEventFrame(c.scratch[:0], ev.raw)
	err := c.send(c.scratch)
	if cap(c.scratch) > maxBatchBytes {
		c.scratch = nil
	}
	return err
}

// gather adds raw to the events frame being gathered, sending it first if
// raw would make it too big.
func (c *wsConn) gather(raw []byte) error {
	if len(c.events) > 0 && len(c.events)+len(raw) >= maxEventsFrameBytes {
		if err := c.sendEvents(); err != nil {
			return err
		}
	}
	if len(c.events) == 0 {
		c.events = append(c.events, session.EventsFrameHead...)
	} else {
		c.events = append(c.events, ',')
	}
	c.events = append(c.events, raw...)
	return nil
}

// sendEvents sends the live event held back or the events frame being
// gathered, if any.
func (c *wsConn) sendEvents() error {
	if c.one != nil {
		wire := c.one.wire
		c.one = nil
		return c.sendWire(wire)
	}
	if len(c.events) == 0 {
		return nil
	}
	c.events = append(c.events, session.EventsFrameTail...)
	err := c.sendRaw(c.events)
	if cap(c.events) > 2*maxEventsFrameBytes {
		c.events = nil
	} else {
		c.events = c.events[:0]
	}
	return err
}

func (c *wsConn) frame(b []byte) error { return c.send(b) }
func (c *wsConn) delta(b []byte) error { return c.send(b) }
func (c *wsConn) heartbeat() error     { return nil }

// send writes a message into the current batch, after the events frame
// being gathered. The write has no context (one per message would cost a
// timer): the batchConn's write deadline bounds it.
func (c *wsConn) send(b []byte) error {
	if err := c.sendEvents(); err != nil {
		return err
	}
	return c.sendRaw(b)
}

// sendRaw is send without the events frame. Data messages bypass the
// library's writer (batchConn.writeMessage).
func (c *wsConn) sendRaw(b []byte) error {
	c.holdBatch()
	if err := c.conn.writeMessage(b); err != nil {
		return &writeFailed{err: err}
	}
	return nil
}

// sendWire writes a complete frame built once for every watcher.
func (c *wsConn) sendWire(frame []byte) error {
	c.holdBatch()
	if err := c.conn.writeFrame(frame); err != nil {
		return &writeFailed{err: err}
	}
	return nil
}

func (c *wsConn) holdBatch() {
	if !c.holding {
		c.conn.hold()
		c.holding = true
	}
}

// flush sends the batch.
func (c *wsConn) flush() error {
	if err := c.sendEvents(); err != nil {
		return err
	}
	if !c.holding {
		return nil
	}
	c.holding = false
	if err := c.conn.release(); err != nil {
		return &writeFailed{err: err}
	}
	return nil
}

// read handles client frames until the connection ends. A connection is
// always read, so control frames and the close handshake are answered.
func (c *wsConn) read() {
	for {
		typ, data, err := c.ws.Read(context.Background())
		if err != nil {
			return
		}
		c.handle(typ, data)
	}
}

// handle acts on one client frame. Every problem is answered with an error
// frame; the connection stays open.
func (c *wsConn) handle(typ websocket.MessageType, data []byte) {
	if typ != websocket.MessageText {
		c.reply(errorFrame(session.Errorf(session.CodeBadRequest, "frames must be JSON text messages"), ""))
		return
	}
	var f session.ClientFrame
	if text, cid, ok := scanPromptFrame(data); ok {
		f = session.ClientFrame{Type: session.FramePrompt, Text: text, ClientID: cid}
	} else if err := json.Unmarshal(data, &f); err != nil {
		c.reply(errorFrame(session.Errorf(session.CodeBadRequest, "malformed JSON frame: %v", err), clientID(f.ClientID)))
		return
	}
	cid := clientID(f.ClientID)
	switch f.Type {
	case session.FramePrompt, session.FrameCancel, session.FrameApprove, session.FrameTyping:
	default:
		c.reply(errorFrame(session.Errorf(session.CodeBadRequest,
			"unknown frame type %q: want prompt, cancel, approve or typing", f.Type), cid))
		return
	}
	if err := session.Authorize(c.w.getRole(), session.ActDrive); err != nil {
		c.s.auditDenied(c.s.ctx, c.remote, c.p, c.id, f.Type+" frame", c.access.entry, err)
		c.reply(errorFrame(err, cid))
		return
	}
	if f.Type == session.FrameTyping {
		if f.Typing != nil && !*f.Typing { // stopped typing
			if c.typingOn {
				c.typingOn = false
				c.s.hub.setTyping(c.id, c.w, time.Time{})
			}
			return
		}
		// Rate limit: while typing, a frame within a quarter of the TTL of
		// the last one taken only extends the typing a little, and is
		// dropped unanswered. A start after a stop is always taken (the
		// client sends no other); start/stop flapping reaches the other
		// watchers at most once per presence flush (presenceSpacing).
		if now := time.Now(); !c.typingOn || now.Sub(c.typing) >= c.s.typingTTL/4 {
			c.typing, c.typingOn = now, true
			c.s.hub.setTyping(c.id, c.w, now.Add(c.s.typingTTL))
		}
		return
	}
	var cmd session.Command
	switch f.Type {
	case session.FramePrompt:
		if err := validatePrompt(f.Text, f.ClientID); err != nil {
			c.reply(errorFrame(err, cid))
			return
		}
		// Tenant quotas (invoke.go) hold for every way a prompt arrives;
		// without quotas this returns at once.
		if err := c.s.checkPromptQuota(c.s.ctx, c.p, c.id); err != nil {
			c.reply(errorFrame(err, cid))
			return
		}
		cmd = session.Command{Op: session.OpPrompt, Text: f.Text, ClientID: f.ClientID}
		if c.typingOn {
			c.typingOn = false
			c.s.hub.setTyping(c.id, c.w, time.Time{}) // the prompt is what was being typed
		}
	case session.FrameCancel:
		cmd = session.Command{Op: session.OpCancel}
	case session.FrameApprove:
		if f.ID == "" || (f.Allow == nil && f.OptionID == "") {
			c.reply(errorFrame(session.Errorf(session.CodeBadRequest, `approve needs "id" and "allow" (or an agent's "option_id")`), cid))
			return
		}
		cmd = session.Command{Op: session.OpApprove, ApprovalID: f.ID, Allow: f.Allow != nil && *f.Allow, OptionID: f.OptionID}
	}
	if c.cmds == nil {
		c.cmds = newCommander(c)
		c.s.conns.Go(c.cmds.run) // legal: this reader is counted in conns.
		c.s.conns.Go(c.cmds.publish)
	}
	c.cmds.submit(&pending{cmd: cmd, clientID: cid})
}

// reply queues a frame for the writer.
func (c *wsConn) reply(frame []byte) {
	if !c.w.q.push(out{frame: frame}) && c.w.q.finish(ending{code: session.CloseSlowConsumer, reason: reasonSlowConsumer}) {
		c.s.metrics.slow.Inc()
	}
}

// clientID returns a client_id fit to echo back.
func clientID(id string) string {
	if len(id) > session.MaxClientIDBytes {
		return ""
	}
	return id
}

func validatePrompt(text, clientID string) error {
	switch {
	case text == "":
		return session.Errorf(session.CodeBadRequest, "prompt text must not be empty")
	case len(text) > session.MaxTextBytes:
		return session.Errorf(session.CodePayloadTooLarge, "prompt text is longer than %d bytes", session.MaxTextBytes)
	case len(clientID) > session.MaxClientIDBytes:
		return session.Errorf(session.CodeBadRequest, "client_id is longer than %d bytes", session.MaxClientIDBytes)
	}
	return nil
}

func errorFrame(err error, clientID string) []byte {
	e := session.AsError(err)
	if errors.Is(err, errNotActive) {
		e = errNotFound
	}
	b, _ := json.Marshal(session.ErrorFrame{Type: session.FrameError, Code: e.Code, Message: e.Message, ClientID: clientID})
	return b
}

// headerTokens returns the comma-separated tokens of a header.
func headerTokens(r *http.Request, key string) []string {
	var out []string
	for _, v := range r.Header.Values(key) {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}
