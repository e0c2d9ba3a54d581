package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

func TestMain(m *testing.M) {
	if egress.IsForwarder(os.Args) { // The egress tests' sandboxes run this binary as their forwarder.
		os.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

var _ History = (*sqlite.Log)(nil)

// env is a node under test: an embedded NATS server, a history directory, a
// sandbox provider and a started Host, plus a second NATS connection that
// plays the gateway.
type env struct {
	t    testing.TB
	ns   *server.Server
	nc   *nats.Conn // the node's
	gw   *nats.Conn // the "gateway"'s
	dir  *sqlite.Dir
	host *Host
	kv   jetstream.KeyValue
	subj session.Subjects
	cfg  Config
}

type envOption func(*Config)

func withHibernate(d time.Duration) envOption { return func(c *Config) { c.HibernateAfter = d } }
func withGrace(d time.Duration) envOption     { return func(c *Config) { c.CancelGrace = d } }

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	ns, err := server.NewServer(&server.Options{DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name(name))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	e := &env{t: t, ns: ns, nc: connect("node"), gw: connect("gateway")}
	e.dir = &sqlite.Dir{Path: filepath.Join(t.TempDir(), "histories"), Logger: testLogger(t)}
	e.cfg = Config{
		NATS:           e.nc,
		Histories:      HistoriesOf(e.dir),
		SecretKeys:     testSecretKeys,
		Provider:       newProvider(t),
		NodeID:         "n1",
		HibernateAfter: time.Minute,
		CancelGrace:    time.Second,
		// Tests close hosts with turns running; drain is tested on its own.
		DrainGrace: 100 * time.Millisecond,
		Logger:     testLogger(t),
	}
	for _, o := range opts {
		o(&e.cfg)
	}
	e.start()
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	if e.kv, err = js.KeyValue(context.Background(), e.subj.CatalogBucket()); err != nil {
		t.Fatalf("catalog bucket: %v", err)
	}
	return e
}

// start starts a new Host on the env's config; Cleanup closes it.
func (e *env) start() {
	e.t.Helper()
	h, err := New(e.cfg)
	if err != nil {
		e.t.Fatalf("new host: %v", err)
	}
	if err := h.Start(context.Background()); err != nil {
		e.t.Fatalf("start host: %v", err)
	}
	e.host = h
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			e.t.Errorf("close host: %v", err)
		}
	})
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("ACTOR_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// request sends a request with the principal headers set.
func (e *env) request(subject, user string, body any, timeout time.Duration) (*nats.Msg, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Header.Set(session.HeaderUser, user)
	msg.Data = b
	return e.gw.RequestMsg(msg, timeout)
}

// place sends a place request and returns the reply.
func (e *env) place(user string, req session.PlaceRequest) session.Reply {
	e.t.Helper()
	// On a cluster, a node's interest in the place subject reaches the
	// other servers a moment after it subscribed: no responders until then.
	deadline := time.Now().Add(10 * time.Second)
	resp, err := e.request(e.subj.Place(), user, req, 20*time.Second)
	for errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // interest propagation has no notification to wait on
		resp, err = e.request(e.subj.Place(), user, req, 20*time.Second)
	}
	if err != nil {
		e.t.Fatalf("place %s %s: %v", req.Op, req.Session, err)
	}
	var rep session.Reply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		e.t.Fatalf("place reply %q: %v", resp.Data, err)
	}
	return rep
}

// create makes a session owned by user and returns its id.
func (e *env) create(user string, h session.Harness) session.ID {
	e.t.Helper()
	id := session.NewID()
	rep := e.place(user, session.PlaceRequest{Op: session.PlaceCreate, Session: id, Title: "test " + e.t.Name(), Harness: h})
	if rep.Error != nil {
		e.t.Fatalf("create: %v", rep.Error)
	}
	return id
}

// cmd sends a command like a gateway: on no responders it places the
// session and retries.
func (e *env) cmd(id session.ID, user string, c session.Command) session.Reply {
	e.t.Helper()
	rep, err := e.tryCmd(id, user, c)
	if err != nil {
		e.t.Fatalf("%s on %s: %v", c.Op, id, err)
	}
	return rep
}

func (e *env) tryCmd(id session.ID, user string, c session.Command) (session.Reply, error) {
	return e.tryCmdWithin(id, user, c, 20*time.Second)
}

// tryCmdWithin is tryCmd with each request's timeout.
func (e *env) tryCmdWithin(id session.ID, user string, c session.Command, timeout time.Duration) (session.Reply, error) {
	var rep session.Reply
	for range 50 {
		resp, err := e.request(e.subj.Cmd(id), user, c, timeout)
		if errors.Is(err, nats.ErrNoResponders) {
			resp, err = e.request(e.subj.Place(), user, session.PlaceRequest{Op: session.PlaceActivate, Session: id}, timeout)
			if err != nil {
				return rep, fmt.Errorf("activate: %w", err)
			}
			if err := json.Unmarshal(resp.Data, &rep); err != nil {
				return rep, err
			}
			if rep.Error != nil {
				return rep, nil
			}
			continue
		}
		if err != nil {
			return rep, err
		}
		err = json.Unmarshal(resp.Data, &rep)
		return rep, err
	}
	return rep, errors.New("no responder after 50 activations")
}

func (e *env) prompt(id session.ID, user, text string) session.Seq {
	e.t.Helper()
	rep := e.cmd(id, user, session.Command{Op: session.OpPrompt, Text: text})
	if rep.Error != nil || rep.Seq == 0 {
		e.t.Fatalf("prompt %q: %+v", text, rep)
	}
	return rep.Seq
}

// history returns all events of a session through the history op.
func (e *env) history(id session.ID, user string) []json.RawMessage {
	e.t.Helper()
	var all []json.RawMessage
	var after session.Seq
	for {
		rep := e.cmd(id, user, session.Command{Op: session.OpHistory, After: after})
		if rep.Error != nil {
			e.t.Fatalf("history: %v", rep.Error)
		}
		all = append(all, rep.Events...)
		if !rep.More {
			return all
		}
		after += session.Seq(len(rep.Events))
	}
}

func (e *env) catalog(id session.ID) (session.CatalogEntry, bool) {
	var c session.CatalogEntry
	ent, err := e.kv.Get(context.Background(), string(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return c, false
	} else if err != nil {
		e.t.Fatalf("catalog get: %v", err)
	}
	if err := json.Unmarshal(ent.Value(), &c); err != nil {
		e.t.Fatalf("catalog entry: %v", err)
	}
	return c, true
}

// watcher collects a session's published events.
type watcher struct {
	t   testing.TB
	sub *nats.Subscription
	ch  chan *nats.Msg
	raw []json.RawMessage
	evs []session.Event
}

func (e *env) watch(id session.ID) *watcher {
	e.t.Helper()
	w := &watcher{t: e.t, ch: make(chan *nats.Msg, 1<<16)}
	var err error
	if w.sub, err = e.gw.ChanSubscribe(e.subj.Events(id), w.ch); err != nil {
		e.t.Fatal(err)
	}
	w.sub.SetPendingLimits(-1, -1)
	if err := e.gw.Flush(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { w.sub.Unsubscribe() })
	return w
}

// next returns the next published message (event or control).
func (w *watcher) next(timeout time.Duration) (*nats.Msg, bool) {
	select {
	case m := <-w.ch:
		if m.Header.Get(session.HeaderControl) == "" {
			var ev session.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				w.t.Fatalf("published event %q: %v", m.Data, err)
			}
			w.raw = append(w.raw, m.Data)
			w.evs = append(w.evs, ev)
		}
		return m, true
	case <-time.After(timeout):
		return nil, false
	}
}

// until reads events until pred holds for one, returning it.
func (w *watcher) until(what string, pred func(session.Event) bool) session.Event {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		m, ok := w.next(time.Until(deadline))
		if !ok {
			break
		}
		if m.Header.Get(session.HeaderControl) != "" {
			continue
		}
		if ev := w.evs[len(w.evs)-1]; pred(ev) {
			return ev
		}
	}
	w.t.Fatalf("no event %s; saw %s", what, summarize(w.evs))
	return session.Event{}
}

func isKind(k session.Kind) func(session.Event) bool {
	return func(ev session.Event) bool { return ev.Kind == k }
}

// finished matches turn_finished of turn n.
func finished(n int64) func(session.Event) bool {
	return func(ev session.Event) bool {
		if ev.Kind != session.KindTurnFinished {
			return false
		}
		var d session.TurnFinishedData
		json.Unmarshal(ev.Data, &d)
		return d.Turn == n
	}
}

func data[T any](t testing.TB, ev session.Event) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(ev.Data, &v); err != nil {
		t.Fatalf("data of %s event: %v", ev.Kind, err)
	}
	return v
}

func summarize(evs []session.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		d := string(ev.Data)
		if len(d) > 120 {
			d = d[:120] + "…"
		}
		fmt.Fprintf(&b, "\n  %d %s %s", ev.Seq, ev.Kind, d)
	}
	return b.String()
}

// outputText joins the output text of one stream of turn n.
func outputText(t testing.TB, evs []session.Event, turn int64, stream string) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == session.KindOutput {
			d := data[session.OutputData](t, ev)
			if d.Turn == turn && d.Stream == stream {
				b.WriteString(d.Text)
			}
		}
	}
	return b.String()
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func decode(t testing.TB, raw []json.RawMessage) []session.Event {
	t.Helper()
	evs := make([]session.Event, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &evs[i]); err != nil {
			t.Fatalf("event %q: %v", r, err)
		}
	}
	return evs
}

// checkContiguous fails unless evs have seqs 1..n in order.
func checkContiguous(t testing.TB, evs []session.Event) {
	t.Helper()
	for i, ev := range evs {
		if ev.Seq != session.Seq(i+1) {
			t.Fatalf("event %d has seq %d; events:%s", i, ev.Seq, summarize(evs))
		}
	}
}

func shell() session.Harness { return session.Harness{Template: "shell"} }

func command(argv ...string) session.Harness { return session.Harness{Command: argv} }
