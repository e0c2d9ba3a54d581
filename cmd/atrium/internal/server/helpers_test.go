package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// waitLong bounds how long a test waits for anything the stack does: a turn to
// finish, an event to arrive, a session to hibernate. It is a deadline for
// polling, never a timing assertion.
const waitLong = 30 * time.Second

// bash is the shell harnesses run with inside the sandbox.
const bash = "/bin/bash"

// testHarness is a harness command whose behaviour the prompt selects, so one
// session can exercise every harness path. The prompt is matched inside the
// JSON input line, so test prompts are plain ASCII words.
var testHarness = map[string]any{"command": []string{bash, "-c", `
read -r input
case "$input" in
*'"prompt":"mixed'*)
  echo "stdout: <b>&amp; ünïcødé ` + "\u2028" + ` end"
  echo "stderr: oops <&>" >&2
  echo '{"type":"thinking","text":"<hmm> & ü"}'
  echo '{"type":"approval_request","id":"ap'"$ATRIUM_TURN"'","summary":"may I <rm -rf>?"}'
  read -r answer
  echo "answer: $answer"
  ;;
*'"prompt":"hold'*)
  echo '{"type":"approval_request","id":"hold'"$ATRIUM_TURN"'","summary":"hold the queue"}'
  read -r answer
  echo "answer: $answer"
  ;;
*'"prompt":"long'*)
  echo "started long"
  exec sleep 600
  ;;
*'"prompt":"exit3'*)
  echo "about to fail"
  exit 3
  ;;
*'"prompt":"garbage'*)
  head -c 300000 /dev/urandom
  echo
  echo "after garbage"
  ;;
*'"prompt":"flood'*)
  yes 0123456789012345678901234567890123456789 | head -c 100000000
  ;;
*)
  echo "ran: $input turn=$ATRIUM_TURN session=$ATRIUM_SESSION"
  ;;
esac
`}}

// stack is one in-process Atrium (server.Start) serving on loopback.
type stack struct {
	t   testing.TB
	srv *server.Server
	url string
}

// startStack starts a server in a fresh data dir; mod may adjust the config.
// The server is closed when the test ends.
func startStack(t testing.TB, mod func(*server.Config)) *stack {
	t.Helper()
	logs := &testWriter{t: t}
	t.Cleanup(logs.stop) // Registered first so it runs after Close.
	cfg := server.Config{
		Listen:         "127.0.0.1:0",
		DataDir:        t.TempDir(),
		HibernateAfter: time.Hour,
		CancelGrace:    2 * time.Second,
		// Closing a stack drains its node: turns still running get this
		// long to finish before they are cancelled.
		DrainGrace: 2 * time.Second,
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("close server: %v", err)
		}
		if err := srv.Close(ctx); err != nil {
			t.Errorf("close server twice: %v", err)
		}
	})
	return &stack{t: t, srv: srv, url: srv.URL()}
}

// testWriter forwards the server's logs to the test log until stop.
type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool // guarded by mu
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Logf("server: %s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// client talks to the stack's HTTP API as one dev user.
type client struct {
	t    testing.TB
	base string
	user string
}

func (s *stack) as(user string) *client { return &client{t: s.t, base: s.url, user: user} }

// request performs an HTTP request and returns the status and body. A
// transport error fails the test.
func (c *client) request(method, path string, body any) (int, []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			c.t.Fatalf("encode body: %v", err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		c.t.Fatalf("new request: %v", err)
	}
	if c.user != "" {
		req.Header.Set("Authorization", "Bearer dev:"+c.user)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, b
}

// must performs a request that must answer want, decoding the body into out
// (if not nil).
func (c *client) must(want int, method, path string, body, out any) {
	c.t.Helper()
	status, b := c.request(method, path, body)
	if status != want {
		c.t.Fatalf("%s %s as %s: status %d, want %d; body %s", method, path, c.user, status, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}

// mustError performs a request that must fail with status and code.
func (c *client) mustError(status int, code session.Code, method, path string, body any) {
	c.t.Helper()
	got, b := c.request(method, path, body)
	var eb struct {
		Error *session.Error `json:"error"`
	}
	if err := json.Unmarshal(b, &eb); err != nil || eb.Error == nil {
		c.t.Fatalf("%s %s as %s: status %d, body %q is not an error body (%v)", method, path, c.user, got, b, err)
	}
	if got != status || eb.Error.Code != code || eb.Error.Message == "" {
		c.t.Fatalf("%s %s as %s: status %d error %+v, want status %d code %s with a message", method, path, c.user, got, eb.Error, status, code)
	}
}

// create creates a session with harness (nil for the default template).
func (c *client) create(title string, harness any) session.Session {
	c.t.Helper()
	body := map[string]any{"title": title}
	if harness != nil {
		body["harness"] = harness
	}
	var s session.Session
	c.must(http.StatusCreated, "POST", "/v1/sessions", body, &s)
	if s.ID == "" || s.Owner != c.user || s.Role != session.RoleOwner || s.Epoch == "" || s.Title != title {
		c.t.Fatalf("created session %+v: want an id, an epoch, title %q, owner and role of %s", s, title, c.user)
	}
	return s
}

func (c *client) get(id session.ID) session.Session {
	c.t.Helper()
	var s session.Session
	c.must(http.StatusOK, "GET", "/v1/sessions/"+string(id), nil, &s)
	return s
}

func (c *client) setRole(id session.ID, user string, role session.Role) {
	c.t.Helper()
	c.must(http.StatusOK, "PUT", "/v1/sessions/"+string(id)+"/members/"+url.PathEscape(user), map[string]any{"role": role}, nil)
}

// prompt posts a message and returns the seq it is durable at.
func (c *client) prompt(id session.ID, text string) int64 {
	c.t.Helper()
	var r struct {
		Seq *int64 `json:"seq"`
	}
	c.must(http.StatusAccepted, "POST", "/v1/sessions/"+string(id)+"/messages", map[string]any{"text": text}, &r)
	if r.Seq == nil || *r.Seq <= 0 {
		c.t.Fatalf("prompt %q: no positive seq in the reply", text)
	}
	return *r.Seq
}

func (c *client) approve(id session.ID, aid string, allow bool) {
	c.t.Helper()
	c.must(http.StatusAccepted, "POST", "/v1/sessions/"+string(id)+"/approvals/"+url.PathEscape(aid), map[string]any{"allow": allow}, nil)
}

// page fetches one page of events after after.
func (c *client) page(id session.ID, after int64, limit int) session.EventsPage {
	c.t.Helper()
	var p session.EventsPage
	q := "/v1/sessions/" + string(id) + "/events?after=" + strconv.FormatInt(after, 10)
	if limit > 0 {
		q += "&limit=" + strconv.Itoa(limit)
	}
	c.must(http.StatusOK, "GET", q, nil, &p)
	return p
}

// events returns every event after after, paging until last_seq.
func (c *client) events(id session.ID, after int64) []event {
	c.t.Helper()
	var all []event
	for {
		p := c.page(id, after, 0)
		for _, raw := range p.Events {
			all = append(all, parseEvent(c.t, raw))
		}
		if len(p.Events) == 0 || all[len(all)-1].Seq >= p.LastSeq {
			return all
		}
		after = all[len(all)-1].Seq
	}
}

// waitEvent polls the history (from seq after) until pred holds for an event
// and returns it.
func (c *client) waitEvent(id session.ID, after int64, what string, pred func(event) bool) event {
	c.t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		p := c.page(id, after, 0)
		for _, raw := range p.Events {
			ev := parseEvent(c.t, raw)
			if pred(ev) {
				return ev
			}
			after = ev.Seq
		}
		if len(p.Events) > 0 {
			continue // More pages may be waiting.
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("session %s: no %s within %v (history after seq %d is empty)", id, what, waitLong, after)
		}
		time.Sleep(20 * time.Millisecond) // Polling interval, not synchronization.
	}
}

// waitTurn waits for turn_finished of turn n and returns its data.
func (c *client) waitTurn(id session.ID, n int64) session.TurnFinishedData {
	c.t.Helper()
	ev := c.waitEvent(id, 0, fmt.Sprintf("turn_finished of turn %d", n), func(ev event) bool {
		return ev.Kind == session.KindTurnFinished && ev.turn() == n
	})
	var d session.TurnFinishedData
	ev.decode(c.t, &d)
	return d
}

// event is a decoded event plus its exact bytes.
type event struct {
	Seq   int64           `json:"seq"`
	Epoch string          `json:"epoch"`
	Time  string          `json:"time"`
	Kind  session.Kind    `json:"kind"`
	By    string          `json:"by"`
	Data  json.RawMessage `json:"data"`
	raw   []byte
}

func parseEvent(t testing.TB, raw []byte) event {
	t.Helper()
	var ev event
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatalf("event %q is not JSON: %v", raw, err)
	}
	if ev.Seq <= 0 || ev.Epoch == "" || ev.Kind == "" || ev.By == "" || len(ev.Data) == 0 || ev.Data[0] != '{' {
		t.Fatalf("event %s lacks seq, epoch, kind, by or a data object", raw)
	}
	if _, err := time.Parse(time.RFC3339Nano, ev.Time); err != nil || !strings.HasSuffix(ev.Time, "Z") {
		t.Fatalf("event %s: time %q is not RFC 3339 UTC", raw, ev.Time)
	}
	ev.raw = append([]byte(nil), raw...)
	return ev
}

func (ev event) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(ev.Data, v); err != nil {
		t.Fatalf("event %d (%s): decode data %s: %v", ev.Seq, ev.Kind, ev.Data, err)
	}
}

// turn returns data.turn, or 0 if the event has none.
func (ev event) turn() int64 {
	var d struct {
		Turn int64 `json:"turn"`
	}
	_ = json.Unmarshal(ev.Data, &d)
	return d.Turn
}

// text returns data.text (output events), or "".
func (ev event) text() string {
	var d struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(ev.Data, &d)
	return d.Text
}

// outputOf concatenates the output text of turn n on stream. (The node
// coalesces lines into output events; the text keeps the newlines.)
func outputOf(evs []event, n int64, stream string) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind != session.KindOutput || ev.turn() != n {
			continue
		}
		var d session.OutputData
		if json.Unmarshal(ev.Data, &d) == nil && d.Stream == stream {
			b.WriteString(d.Text)
		}
	}
	return b.String()
}

// checkContiguous fails unless evs are seqs from..to, each exactly once, in
// order.
func checkContiguous(t testing.TB, what string, evs []event, from, to int64) {
	t.Helper()
	if int64(len(evs)) != to-from+1 {
		t.Fatalf("%s: %d events, want seqs %d..%d (%d)", what, len(evs), from, to, to-from+1)
	}
	for i, ev := range evs {
		if ev.Seq != from+int64(i) {
			t.Fatalf("%s: event %d has seq %d, want %d (gap, duplicate or reordering)", what, i, ev.Seq, from+int64(i))
		}
	}
}

// sameBytes fails unless a and b hold the same events byte for byte.
func sameBytes(t testing.TB, what string, a, b []event) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d events vs %d", what, len(a), len(b))
	}
	for i := range a {
		if !bytes.Equal(a[i].raw, b[i].raw) {
			t.Fatalf("%s: event %d differs:\n  %s\n  %s", what, i, a[i].raw, b[i].raw)
		}
	}
}

// frame is any server → client WebSocket frame.
type frame struct {
	Type     string            `json:"type"`
	Event    json.RawMessage   `json:"event"`
	Code     session.Code      `json:"code"`
	Message  string            `json:"message"`
	ClientID string            `json:"client_id"`
	Seq      int64             `json:"seq"`
	LastSeq  int64             `json:"last_seq"`
	Session  *session.Session  `json:"session"`
	You      *session.You      `json:"you"`
	Watchers []session.Watcher `json:"watchers"`
	raw      []byte
}

// watcher is a WebSocket connection whose frames a reader goroutine queues.
type watcher struct {
	t     testing.TB
	conn  *websocket.Conn
	hello frame

	frames chan frame
	done   chan struct{}
	err    error   // set before done closes
	stash  []frame // frames read but not yet returned by next
}

func wsURL(base string, id session.ID, query string) string {
	u := "ws" + strings.TrimPrefix(base, "http") + "/v1/sessions/" + string(id) + "/ws"
	if query != "" {
		u += "?" + query
	}
	return u
}

// dial opens a WebSocket to session id with the given query (e.g. "after=0").
func (c *client) dial(id session.ID, query string) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	h := http.Header{}
	if c.user != "" {
		h.Set("Authorization", "Bearer dev:"+c.user)
	}
	conn, resp, err := websocket.Dial(ctx, wsURL(c.base, id, query), &websocket.DialOptions{
		HTTPHeader:   h,
		Subprotocols: []string{session.Subprotocol},
	})
	if err != nil {
		return nil, resp, err
	}
	conn.SetReadLimit(64 << 20)
	return conn, resp, nil
}

// watch opens a WebSocket with after=after, checks the hello frame and starts
// reading. The connection is closed when the test ends.
func (c *client) watch(id session.ID, after int64) *watcher {
	c.t.Helper()
	conn, resp, err := c.dial(id, "after="+strconv.FormatInt(after, 10))
	if err != nil {
		c.t.Fatalf("dial ws of %s as %s: %v (response %v)", id, c.user, err, respStatus(resp))
	}
	if conn.Subprotocol() != session.Subprotocol {
		c.t.Fatalf("ws subprotocol %q, want %q", conn.Subprotocol(), session.Subprotocol)
	}
	w := startWatcher(c.t, conn)
	w.hello = w.next("hello")
	if w.hello.Type != session.FrameHello || w.hello.Session == nil || w.hello.You == nil {
		c.t.Fatalf("first frame %s, want a hello with session and you", w.hello.raw)
	}
	if w.hello.Session.ID != id || w.hello.You.User != c.user {
		c.t.Fatalf("hello %s: want session %s and you.user %s", w.hello.raw, id, c.user)
	}
	return w
}

func respStatus(resp *http.Response) string {
	if resp == nil {
		return "none"
	}
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

func startWatcher(t testing.TB, conn *websocket.Conn) *watcher {
	w := &watcher{t: t, conn: conn, frames: make(chan frame, 1<<17), done: make(chan struct{})}
	go w.read()
	t.Cleanup(func() {
		w.conn.CloseNow()
		<-w.done
	})
	return w
}

func (w *watcher) read() {
	defer close(w.done)
	defer close(w.frames)
	for {
		typ, b, err := w.conn.Read(context.Background())
		if err != nil {
			w.err = err
			return
		}
		f := frame{raw: b}
		if typ != websocket.MessageText {
			f.Type = "!binary"
		} else if err := json.Unmarshal(b, &f); err != nil {
			f.Type = "!invalid"
		}
		f.raw = b
		select {
		case w.frames <- f:
		default:
			w.err = errors.New("test watcher queue overflow")
			w.conn.CloseNow()
			return
		}
	}
}

// next returns the next frame of any type (frames set aside by nextNonEvent
// first), failing the test if none arrives or the connection ends.
func (w *watcher) next(what string) frame {
	w.t.Helper()
	if len(w.stash) > 0 {
		f := w.stash[0]
		w.stash = w.stash[1:]
		return f
	}
	return w.recv(what)
}

// recv returns the next frame off the connection.
func (w *watcher) recv(what string) frame {
	w.t.Helper()
	select {
	case f, ok := <-w.frames:
		if !ok {
			w.t.Fatalf("waiting for %s: connection ended: %v", what, w.err)
		}
		return f
	case <-time.After(waitLong):
		w.t.Fatalf("waiting for %s: no frame within %v", what, waitLong)
		return frame{}
	}
}

// nextNonEvent returns the next frame that is neither an event nor presence
// (an ack, an error …). Event frames read meanwhile are set aside for next.
func (w *watcher) nextNonEvent(what string) frame {
	w.t.Helper()
	for i, f := range w.stash {
		if f.Type != session.FrameEvent && f.Type != session.FramePresence {
			w.stash = append(w.stash[:i:i], w.stash[i+1:]...)
			return f
		}
	}
	for {
		f := w.recv(what)
		switch f.Type {
		case session.FrameEvent:
			w.stash = append(w.stash, f)
		case session.FramePresence:
		default:
			return f
		}
	}
}

// waitPresence reads until a presence frame lists all users; other frames are
// set aside for next.
func (w *watcher) waitPresence(users ...string) {
	w.t.Helper()
	for {
		f := w.recv("presence of " + strings.Join(users, ", "))
		if f.Type != session.FramePresence {
			w.stash = append(w.stash, f)
			continue
		}
		seen := map[string]bool{}
		for _, wt := range f.Watchers {
			if wt.Conn == "" {
				w.t.Fatalf("presence %s: watcher without conn", f.raw)
			}
			seen[wt.User] = true
		}
		all := true
		for _, u := range users {
			all = all && seen[u]
		}
		if all {
			return
		}
	}
}

// eventsUntil collects event frames until one has seq >= last, checking that
// seqs are strictly increasing without gaps from the first one.
func (w *watcher) eventsUntil(last int64) []event {
	w.t.Helper()
	var evs []event
	for len(evs) == 0 || evs[len(evs)-1].Seq < last {
		f := w.next(fmt.Sprintf("event %d", last))
		switch f.Type {
		case session.FrameEvent:
			ev := parseEvent(w.t, f.Event)
			if n := len(evs); n > 0 && ev.Seq != evs[n-1].Seq+1 {
				w.t.Fatalf("ws event seq %d after %d: gap or reordering", ev.Seq, evs[n-1].Seq)
			}
			evs = append(evs, ev)
		case session.FramePresence, session.FrameAck:
		default:
			w.t.Fatalf("unexpected frame while reading events: %s", f.raw)
		}
	}
	return evs
}

func (w *watcher) send(v any) {
	w.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		w.t.Fatalf("encode frame: %v", err)
	}
	w.sendRaw(b)
}

func (w *watcher) sendRaw(b []byte) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := w.conn.Write(ctx, websocket.MessageText, b); err != nil {
		w.t.Fatalf("write frame: %v", err)
	}
}

func contextWithTimeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), waitLong)
}

// closed waits for the connection to end and returns why.
func (w *watcher) closed() error {
	w.t.Helper()
	deadline := time.After(waitLong)
	for {
		select {
		case _, ok := <-w.frames:
			if !ok {
				return w.err
			}
		case <-deadline:
			w.t.Fatalf("connection still open after %v", waitLong)
		}
	}
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	id, kind string
	data     []byte
}

// sseStream reads an SSE response.
type sseStream struct {
	resp   *http.Response
	br     *bufio.Reader
	cancel context.CancelFunc
}

// sse opens the SSE stream of id with the query and Last-Event-ID (if not "").
func (c *client) sse(id session.ID, query, lastEventID string) (*sseStream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	u := c.base + "/v1/sessions/" + string(id) + "/events"
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer dev:"+c.user)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("sse: status %d content-type %q body %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	s := &sseStream{resp: resp, br: bufio.NewReaderSize(resp.Body, 1<<20), cancel: cancel}
	c.t.Cleanup(s.close)
	return s, nil
}

func (s *sseStream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// next returns the next event (comments and retry lines are skipped).
func (s *sseStream) next() (sseEvent, error) {
	var ev sseEvent
	var data [][]byte
	for {
		line, err := s.br.ReadBytes('\n')
		if err != nil {
			return ev, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if data == nil {
				continue
			}
			ev.data = bytes.Join(data, []byte("\n"))
			return ev, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "id":
			ev.id = string(value)
		case "event":
			ev.kind = string(value)
		case "data":
			data = append(data, append([]byte(nil), value...))
		}
	}
}

// sseUntil reads events until seq >= last, checking id and event lines
// against the data.
func (s *sseStream) until(t testing.TB, last int64) []event {
	t.Helper()
	var evs []event
	for len(evs) == 0 || evs[len(evs)-1].Seq < last {
		se, err := s.next()
		if err != nil {
			t.Fatalf("sse: read until seq %d (have %d events): %v", last, len(evs), err)
		}
		ev := parseEvent(t, se.data)
		if se.id != strconv.FormatInt(ev.Seq, 10) || se.kind != string(ev.Kind) {
			t.Fatalf("sse event id %q event %q, want %d and %s for data %s", se.id, se.kind, ev.Seq, ev.Kind, se.data)
		}
		evs = append(evs, ev)
	}
	return evs
}
