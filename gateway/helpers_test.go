package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// waitTimeout bounds every wait in these tests; nothing here should take
// more than a fraction of it.
const waitTimeout = 10 * time.Second

// startNATS runs an in-process nats-server with JetStream in a temp dir.
func startNATS(t testing.TB) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(waitTimeout) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

func connectNATS(t testing.TB, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// testLogger discards logs unless GATEWAY_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("GATEWAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// env is a gateway behind an httptest server, with a fake node, on one
// embedded NATS server.
type env struct {
	t    testing.TB
	ns   *server.Server
	node *fakeNode
	gw   *gateway.Server
	srv  *httptest.Server
	reg  *prometheus.Registry
}

func newEnv(t testing.TB, tune ...func(*gateway.Config)) *env {
	t.Helper()
	ns := startNATS(t)
	e := &env{t: t, ns: ns}
	e.node = startFakeNode(t, connectNATS(t, ns), session.Subjects{})
	e.gw, e.srv, e.reg = startGateway(t, ns, tune...)
	return e
}

func startGateway(t testing.TB, ns *server.Server, tune ...func(*gateway.Config)) (*gateway.Server, *httptest.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := gateway.Config{NATS: connectNATS(t, ns), Auth: &auth.Dev{}, Registry: reg, Logger: testLogger()}
	for _, f := range tune {
		f(&cfg)
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := gw.Close(ctx); err != nil {
			t.Errorf("close gateway: %v", err)
		}
		srv.Close()
	})
	return gw, srv, reg
}

// call makes a REST request as user ("" sends no credentials) and returns the
// status and body.
func (e *env) call(method, path, user string, body any) (int, []byte) {
	e.t.Helper()
	return callURL(e.t, e.srv.URL, method, path, user, body, nil)
}

func callURL(t testing.TB, base, method, path, user string, body any, hdr http.Header) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encode body: %v", err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if user != "" {
		req.Header.Set("Authorization", "Bearer dev:"+user)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, b
}

// errCode returns the code of a REST error body.
func errCode(t testing.TB, body []byte) session.Code {
	t.Helper()
	var eb session.ErrorBody
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil {
		t.Fatalf("not an error body: %s", body)
	}
	if eb.Error.Message == "" {
		t.Errorf("error without a message: %s", body)
	}
	return eb.Error.Code
}

// create makes a session owned by user.
func (e *env) create(user, title string) session.Session {
	e.t.Helper()
	code, body := e.call("POST", "/v1/sessions", user, map[string]any{"title": title})
	if code != http.StatusCreated {
		e.t.Fatalf("create: %d %s", code, body)
	}
	var s session.Session
	if err := json.Unmarshal(body, &s); err != nil {
		e.t.Fatalf("decode session: %v", err)
	}
	return s
}

// member gives user a role on id through the REST API, as its owner.
func (e *env) member(id session.ID, owner, user string, role session.Role) {
	e.t.Helper()
	r := string(role)
	if r == "" {
		r = "none"
	}
	code, body := e.call("PUT", "/v1/sessions/"+string(id)+"/members/"+user, owner, map[string]string{"role": r})
	if code != http.StatusOK {
		e.t.Fatalf("set member: %d %s", code, body)
	}
}

// wsClient is a test WebSocket client.
type wsClient struct {
	t  testing.TB
	c  *websocket.Conn
	ch chan wsFrame // frames read by the reader goroutine
}

type wsFrame struct {
	raw []byte
	err error // the read error that ended the stream
}

func wsURL(base string, id session.ID, after session.Seq) string {
	return "ws" + strings.TrimPrefix(base, "http") + "/v1/sessions/" + string(id) + "/ws?after=" + strconv.FormatInt(after, 10)
}

func (e *env) dial(id session.ID, user string, after session.Seq) *wsClient {
	e.t.Helper()
	return dialURL(e.t, e.srv.URL, id, user, after)
}

func dialURL(t testing.TB, base string, id session.ID, user string, after session.Seq) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL(base, id, after), &websocket.DialOptions{
		HTTPHeader:   http.Header{"Authorization": {"Bearer dev:" + user}},
		Subprotocols: []string{session.Subprotocol},
	})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	if c.Subprotocol() != session.Subprotocol {
		t.Errorf("subprotocol %q", c.Subprotocol())
	}
	c.SetReadLimit(-1)
	t.Helper()
	return readWS(t, c)
}

// readWS starts reading c into a wsClient.
func readWS(t testing.TB, c *websocket.Conn) *wsClient {
	w := &wsClient{t: t, c: c, ch: make(chan wsFrame, 4096)}
	done, stop := make(chan struct{}), make(chan struct{})
	go func() { // owned: the cleanup below waits for it.
		defer close(done)
		for {
			_, b, err := c.Read(context.Background())
			select {
			case w.ch <- wsFrame{raw: b, err: err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		_ = c.CloseNow()
		<-done
	})
	return w
}

// dialRaw opens a WebSocket and leaves reading to the caller.
func dialRaw(t testing.TB, base string, id session.ID, user string, after session.Seq, hdr http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	h := http.Header{"Authorization": {"Bearer dev:" + user}}
	for k, v := range hdr {
		h[k] = v
	}
	c, resp, err := websocket.Dial(ctx, wsURL(base, id, after), &websocket.DialOptions{
		HTTPHeader: h, Subprotocols: []string{session.Subprotocol},
	})
	if err == nil {
		c.SetReadLimit(-1)
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// next returns the next frame; it fails the test if the connection ended.
func (w *wsClient) next() map[string]any {
	w.t.Helper()
	raw := w.nextRaw()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		w.t.Fatalf("frame is not JSON: %s", raw)
	}
	return m
}

func (w *wsClient) nextRaw() []byte {
	w.t.Helper()
	select {
	case f := <-w.ch:
		if f.err != nil {
			w.t.Fatalf("connection ended: %v", f.err)
		}
		return f.raw
	case <-time.After(waitTimeout):
		w.t.Fatal("no frame in time")
	}
	return nil
}

// nextOf returns the next frame of type typ, skipping presence frames.
func (w *wsClient) nextOf(typ string) map[string]any {
	w.t.Helper()
	for {
		m := w.next()
		if m["type"] == typ {
			return m
		}
		if m["type"] != session.FramePresence {
			w.t.Fatalf("want a %s frame, got %v", typ, m)
		}
	}
}

// find returns the next frame of type typ, skipping events and presence.
func (w *wsClient) find(typ string) map[string]any {
	w.t.Helper()
	for {
		m := w.next()
		if m["type"] == typ {
			return m
		}
		if m["type"] != session.FramePresence && m["type"] != session.FrameEvent {
			w.t.Fatalf("want a %s frame, got %v", typ, m)
		}
	}
}

// ackAndEvents reads until it has a prompt's ack and at least one event
// (the node publishes the message event before it replies, and more may
// follow), and returns both.
func (w *wsClient) ackAndEvents() (ack map[string]any, evs [][]byte) {
	w.t.Helper()
	for ack == nil || len(evs) == 0 {
		raw := w.nextRaw()
		var f map[string]json.RawMessage
		if err := json.Unmarshal(raw, &f); err != nil {
			w.t.Fatalf("bad frame %s", raw)
		}
		switch string(f["type"]) {
		case `"ack"`:
			_ = json.Unmarshal(raw, &ack)
		case `"event"`:
			evs = append(evs, f["event"])
		case `"presence"`:
		default:
			w.t.Fatalf("want an ack or event, got %s", raw)
		}
	}
	return ack, evs
}

// ackAndEvent is ackAndEvents for the fake node, which publishes exactly one
// event per prompt.
func (w *wsClient) ackAndEvent() (map[string]any, []byte) {
	w.t.Helper()
	ack, evs := w.ackAndEvents()
	if len(evs) != 1 {
		w.t.Fatalf("want one event with the ack, got %d", len(evs))
	}
	return ack, evs[0]
}

// events reads n event frames (skipping presence) and returns the raw
// events.
func (w *wsClient) events(n int) [][]byte {
	w.t.Helper()
	var out [][]byte
	for len(out) < n {
		raw := w.nextRaw()
		var f struct {
			Type  string          `json:"type"`
			Event json.RawMessage `json:"event"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			w.t.Fatalf("bad frame %s", raw)
		}
		switch f.Type {
		case session.FrameEvent:
			out = append(out, f.Event)
		case session.FramePresence:
		default:
			w.t.Fatalf("want an event frame, got %s", raw)
		}
	}
	return out
}

// closed waits for the connection to end and returns its close status.
func (w *wsClient) closed() websocket.CloseError {
	w.t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case f := <-w.ch:
			if f.err == nil {
				continue
			}
			var ce websocket.CloseError
			if !errors.As(f.err, &ce) {
				w.t.Fatalf("connection ended without a close frame: %v", f.err)
			}
			return ce
		case <-deadline:
			w.t.Fatal("connection not closed in time")
		}
	}
}

func (w *wsClient) send(v any) {
	w.t.Helper()
	var b []byte
	switch x := v.(type) {
	case string:
		b = []byte(x)
	case []byte:
		b = x
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			w.t.Fatalf("encode frame: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, b); err != nil {
		w.t.Fatalf("write frame: %v", err)
	}
}

// seqOf returns an encoded event's seq.
func seqOf(t testing.TB, raw []byte) session.Seq {
	t.Helper()
	var ev session.Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatalf("bad event %s: %v", raw, err)
	}
	return ev.Seq
}

// checkSeqs fails unless evs have exactly the seqs from..to in order.
func checkSeqs(t testing.TB, evs [][]byte, from, to session.Seq) {
	t.Helper()
	if len(evs) != int(to-from+1) {
		t.Fatalf("got %d events, want seqs %d..%d", len(evs), from, to)
	}
	for i, ev := range evs {
		if got := seqOf(t, ev); got != from+session.Seq(i) {
			t.Fatalf("event %d has seq %d, want %d", i, got, from+session.Seq(i))
		}
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// metric returns the value of a counter or gauge (summed over labels).
func metric(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}
