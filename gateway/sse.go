package gateway

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/atriumhq/atrium/session"
)

// serveSSE serves GET /v1/sessions/{id}/events with Accept:
// text/event-stream: history after the resume point (Last-Event-ID, else
// ?after=N), then live events, each as "id: <seq>", "event: <kind>",
// "data: <Event>", with a heartbeat comment when idle.
func (s *Server) serveSSE(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	after, err := parseSeq("after", r.URL.Query().Get("after"))
	if v := r.Header.Get("Last-Event-ID"); v != "" && err == nil {
		after, err = parseSeq("Last-Event-ID", v)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	a, err := s.check(r.Context(), p, id, session.ActRead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.track() {
		s.fail(w, r, session.Errorf(session.CodeUnavailable, "the gateway is shutting down: reconnect"))
		return
	}
	defer s.conns.Done()

	// The stream ends when the client leaves or the server closes.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	wt := s.newWatcher(p.User, true)
	wt.token = apiToken(r, p)
	wt.deltas = true
	defer s.closeAtExpiry(wt, p)()
	if a.allowed() {
		wt.setRole(roleIn(a.entry, p))
	}
	t, err := s.hub.join(ctx, id, wt)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.hub.leave(t, wt)
	f := &feed{s: s, p: p, id: id, w: wt, access: a}
	if a.entry != nil {
		f.owner = a.entry.Owner
	}
	first, err := f.open(ctx, after)
	if err != nil {
		s.auditDenied(ctx, remoteOf(r), p, id, "watch", a.entry, err)
		s.fail(w, r, err)
		return
	}
	f.roleSeq = first.LastSeq // the owner let the caller read as of then.

	s.metrics.conns.WithLabelValues("sse").Inc()
	defer s.metrics.conns.WithLabelValues("sse").Dec()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	out := &sseSink{w: w, rc: http.NewResponseController(w), timeout: s.writeTimeout}
	defer func() { _ = out.rc.SetWriteDeadline(time.Time{}) }() // the connection may serve more requests.
	if err := out.flush(); err != nil {
		return
	}
	var end ending
	if err = f.replay(ctx, first, out); err != nil {
		end, err = f.failed(err)
	} else {
		end, err = f.pump(ctx, out)
	}
	if err != nil {
		s.log.Debug("sse stream ended", "session", string(id), "err", err)
	}
	if end.reason != "" {
		_ = out.comment("closing: " + end.reason)
	}
}

// sseSink writes a feed as Server-Sent Events.
type sseSink struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (k *sseSink) event(ev *event) error {
	k.deadline()
	var head [96]byte
	b := append(head[:0], "id: "...)
	b = strconv.AppendInt(b, ev.seq, 10)
	b = append(b, "\nevent: "...)
	for _, c := range []byte(ev.kind) {
		if c != '\r' && c != '\n' {
			b = append(b, c)
		}
	}
	if _, err := k.w.Write(b); err != nil {
		return &writeFailed{err: err}
	}
	return k.data(ev.raw)
}

// data writes raw as data lines and ends the event. Encoded JSON has no line
// breaks, so this is one line unless the node sent some.
func (k *sseSink) data(raw []byte) error {
	for first := true; first || len(raw) > 0; first = false {
		line, rest := raw, []byte(nil)
		if i := bytes.IndexAny(raw, "\r\n"); i >= 0 {
			line, rest = raw[:i], raw[i+1:]
			if raw[i] == '\r' && len(rest) > 0 && rest[0] == '\n' {
				rest = rest[1:]
			}
		}
		if _, err := k.w.Write(dataPrefix); err != nil {
			return &writeFailed{err: err}
		}
		if _, err := k.w.Write(line); err != nil {
			return &writeFailed{err: err}
		}
		raw = rest
	}
	if _, err := k.w.Write(eventEnd); err != nil {
		return &writeFailed{err: err}
	}
	return nil
}

var (
	deltaHead  = []byte("event: " + session.FrameDelta)
	dataPrefix = []byte("\ndata: ")
	eventEnd   = []byte("\n\n")
)

func (k *sseSink) frame([]byte) error { return nil } // presence, acks and errors are WebSocket-only.

// delta writes a delta frame as an SSE event named delta, with no id: an
// SSE client's Last-Event-ID stays the seq of the last durable event.
func (k *sseSink) delta(b []byte) error {
	k.deadline()
	if _, err := k.w.Write(deltaHead); err != nil {
		return &writeFailed{err: err}
	}
	return k.data(b)
}

func (k *sseSink) heartbeat() error { return k.comment("heartbeat") }

func (k *sseSink) comment(text string) error {
	k.deadline()
	if _, err := k.w.Write([]byte(": " + text + "\n\n")); err != nil {
		return &writeFailed{err: err}
	}
	return k.flush()
}

func (k *sseSink) deadline() {
	_ = k.rc.SetWriteDeadline(time.Now().Add(k.timeout)) // unsupported writers just have no deadline.
}

func (k *sseSink) flush() error {
	if err := k.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return &writeFailed{err: err}
	}
	return nil
}
