package gateway_test

// End-to-end tests: the real node (package actor, with storage/sqlite
// histories and compute/local bubblewrap sandboxes) behind the gateway, on
// one embedded NATS server.

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
	"github.com/coder/websocket"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// histories adapts sqlite.Dir to actor.Histories.
type histories struct{ d *sqlite.Dir }

func (h histories) Create(ctx context.Context, m session.Meta) (actor.History, error) {
	l, err := h.d.Create(ctx, m)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (h histories) Open(ctx context.Context, id session.ID) (actor.History, error) {
	l, err := h.d.Open(ctx, id)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (h histories) Remove(ctx context.Context, id session.ID) error { return h.d.Remove(ctx, id) }

// testSecretKeys is a fresh secrets keyring for a test node.
func testSecretKeys(t testing.TB) *session.SecretKeyring {
	t.Helper()
	k, err := session.ParseSecretKeyring(session.NewSecretKeyLine("test"))
	if err != nil {
		t.Fatalf("secrets keyring: %v", err)
	}
	return k
}

// startNode runs a real node on ns; Cleanup closes it.
func startNode(t testing.TB, ns *server.Server, hibernateAfter time.Duration) *actor.Host {
	t.Helper()
	return startNodeWith(t, ns, func(c *actor.Config) { c.HibernateAfter = hibernateAfter })
}

// startNodeWith runs a real node on ns (local bubblewrap sandboxes, SQLite
// histories in a temp dir, node id n1, a secrets keyring, quiet logs), its
// config changed by tune (nil: none) before it starts; Cleanup closes it and
// its sandboxes. Every gateway test that needs a node starts it here.
func startNodeWith(t testing.TB, ns *server.Server, tune func(*actor.Config)) *actor.Host {
	t.Helper()
	quiet := testLogger()
	p, err := local.New(local.Config{Dir: t.TempDir(), Bwrap: "/usr/bin/bwrap", Logger: quiet})
	if err != nil {
		t.Fatalf("local compute: %v", err)
	}
	cfg := actor.Config{
		NATS:           connectNATS(t, ns),
		Histories:      histories{&sqlite.Dir{Path: filepath.Join(t.TempDir(), "histories"), Logger: quiet}},
		Provider:       p,
		NodeID:         "n1",
		HibernateAfter: time.Minute,
		CancelGrace:    time.Second,
		SecretKeys:     testSecretKeys(t),
		Logger:         quiet,
	}
	if tune != nil {
		tune(&cfg)
	}
	h, err := actor.New(cfg)
	if err != nil {
		p.Close(context.Background())
		t.Fatalf("node %s: %v", cfg.NodeID, err)
	}
	if err := h.Start(context.Background()); err != nil {
		p.Close(context.Background())
		t.Fatalf("start node %s: %v", cfg.NodeID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("close node %s: %v", cfg.NodeID, err)
		}
		if err := p.Close(ctx); err != nil {
			t.Errorf("close compute: %v", err)
		}
	})
	return h
}

// e2eEnv is a real node and a gateway.
type e2eEnv struct {
	*env
}

func newE2E(t *testing.T, hibernateAfter time.Duration) e2eEnv {
	t.Helper()
	ns := startNATS(t)
	startNode(t, ns, hibernateAfter)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	return e2eEnv{e}
}

// untilTurnEnds reads events until turn_finished and returns them all.
func untilTurnEnds(t testing.TB, c *wsClient) [][]byte {
	t.Helper()
	var evs [][]byte
	for {
		ev := c.events(1)[0]
		evs = append(evs, ev)
		if strings.Contains(string(ev), `"kind":"turn_finished"`) {
			return evs
		}
	}
}

func (e e2eEnv) page(id session.ID, user string, after session.Seq) []json.RawMessage {
	e.t.Helper()
	code, body := e.call("GET", "/v1/sessions/"+string(id)+"/events?limit=1000&after="+strconv.FormatInt(after, 10), user, nil)
	var page struct{ Events []json.RawMessage }
	if code != 200 || json.Unmarshal(body, &page) != nil {
		e.t.Fatalf("events: %d %s", code, body)
	}
	return page.Events
}

func TestE2E_PromptWatchDelete(t *testing.T) {
	e := newE2E(t, time.Minute)
	s := e.create("alice", "end to end")
	e.member(s.ID, "alice", "bob", session.RoleViewer)

	a := e.dial(s.ID, "alice", 0)
	if h := a.nextOf(session.FrameHello); h["you"].(map[string]any)["role"] != "owner" {
		t.Fatalf("hello %v", h)
	}
	b := e.dial(s.ID, "bob", 0)
	b.nextOf(session.FrameHello)
	sse := e.stream(s.ID, "bob", nil, "")
	start := a.events(2) // session_created, member_changed
	b.events(2)

	a.send(map[string]string{"type": "prompt", "text": "echo hello-from-the-sandbox", "client_id": "p1"})
	ack, evs := a.ackAndEvents()
	if ack["client_id"] != "p1" || session.Seq(ack["seq"].(float64)) != seqOf(t, evs[0]) {
		t.Fatalf("ack %v for %s", ack, evs[0])
	}
	all := append(start, evs...)
	if !strings.Contains(string(all[len(all)-1]), `"kind":"turn_finished"`) {
		all = append(all, untilTurnEnds(t, a)...)
	}
	joined := string(all[len(all)-1])
	if !strings.Contains(joined, `"status":"ok"`) {
		t.Fatalf("turn did not succeed: %s", joined)
	}
	output := false
	for _, ev := range all {
		output = output || strings.Contains(string(ev), "hello-from-the-sandbox\\n")
	}
	if !output {
		t.Fatalf("no output event in %s", all)
	}
	checkSeqs(t, all, 1, session.Seq(len(all)))

	// Every reader sees the same bytes.
	viaB := b.events(len(all) - 2)
	viaREST := e.page(s.ID, "bob", 0)
	for i, ev := range all {
		if i >= 2 && string(viaB[i-2]) != string(ev) {
			t.Fatalf("watcher b event %d differs:\n%s\n%s", i, viaB[i-2], ev)
		}
		if string(viaREST[i]) != string(ev) {
			t.Fatalf("REST event %d differs:\n%s\n%s", i, viaREST[i], ev)
		}
		if got := sse.next(); got.data != string(ev) || got.id != strconv.Itoa(i+1) {
			t.Fatalf("SSE event %d differs: %+v\n%s", i, got, ev)
		}
	}

	b.send(map[string]string{"type": "prompt", "text": "echo no", "client_id": "v1"})
	if f := b.find(session.FrameError); f["code"] != string(session.CodeForbidden) {
		t.Fatalf("viewer prompt: %v", f)
	}

	if code, body := e.call("DELETE", "/v1/sessions/"+string(s.ID), "alice", nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	for _, c := range []*wsClient{a, b} {
		if ce := c.closed(); ce.Code != websocket.StatusNormalClosure || ce.Reason != "session deleted" {
			t.Fatalf("close %v", ce)
		}
	}
	sse.ended()
	if code, body := e.call("GET", "/v1/sessions/"+string(s.ID), "alice", nil); code != http.StatusNotFound {
		t.Fatalf("after delete: %d %s", code, body)
	}
}

// TestE2E_HibernateWhileWatched: a watched session hibernates with its
// watcher still connected; reading it does not wake it; a message wakes it
// and the watcher sees the new events live.
func TestE2E_HibernateWhileWatched(t *testing.T) {
	e := newE2E(t, 300*time.Millisecond)
	s := e.create("alice", "sleepy")
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	c.events(1)

	state := func() session.State {
		code, body := e.call("GET", "/v1/sessions/"+string(s.ID), "alice", nil)
		var got session.Session
		if code != 200 || json.Unmarshal(body, &got) != nil {
			t.Fatalf("get: %d %s", code, body)
		}
		return got.State
	}
	// Watch the catalog itself: asking the session would keep it awake.
	js, err := jetstream.New(connectNATS(t, e.ns))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), session.Subjects{}.CatalogBucket())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the session to hibernate", func() bool {
		entry, err := kv.Get(context.Background(), string(s.ID))
		var ce session.CatalogEntry
		return err == nil && json.Unmarshal(entry.Value(), &ce) == nil && ce.State == session.StateHibernated
	})
	if state() != session.StateHibernated {
		t.Fatal("the session is not hibernated")
	}
	var list struct{ Sessions []session.Session }
	if code, body := e.call("GET", "/v1/sessions", "alice", nil); code != 200 || json.Unmarshal(body, &list) != nil || len(list.Sessions) != 1 {
		t.Fatalf("list: %d %s", code, body)
	}
	if state() != session.StateHibernated {
		t.Fatal("reading the session woke it")
	}

	code, body := e.call("POST", "/v1/sessions/"+string(s.ID)+"/messages", "alice", map[string]string{"text": "echo awake"})
	if code != http.StatusAccepted {
		t.Fatalf("message: %d %s", code, body)
	}
	evs := untilTurnEnds(t, c)
	checkSeqs(t, evs, 2, session.Seq(len(evs)+1))
	if !strings.Contains(string(evs[0]), `"text":"echo awake"`) {
		t.Fatalf("first event after waking %s", evs[0])
	}
}

// TestE2E_ResumeDuringTurn reconnects repeatedly while a turn streams
// output; the events seen across connections are gap-free and unique.
func TestE2E_ResumeDuringTurn(t *testing.T) {
	e := newE2E(t, time.Minute)
	s := e.create("alice", "streaming")
	code, body := e.call("POST", "/v1/sessions/"+string(s.ID)+"/messages", "alice",
		map[string]string{"text": "for i in $(seq 1 200); do echo line $i; sleep 0.001; done"})
	if code != http.StatusAccepted {
		t.Fatalf("message: %d %s", code, body)
	}
	last := session.Seq(0)
	var seen [][]byte
	for done := false; !done; {
		c := e.dial(s.ID, "alice", last)
		c.nextOf(session.FrameHello)
		for range 5 {
			ev := c.events(1)[0]
			if seqOf(t, ev) != last+1 {
				t.Fatalf("got seq %d after %d", seqOf(t, ev), last)
			}
			last++
			seen = append(seen, ev)
			if done = strings.Contains(string(ev), `"kind":"turn_finished"`); done {
				break
			}
		}
		_ = c.c.Close(websocket.StatusNormalClosure, "")
	}
	if got := e.page(s.ID, "alice", 0); len(got) != len(seen) {
		t.Fatalf("REST has %d events, watchers saw %d", len(got), len(seen))
	}
}
