package channel

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitTimeout = 10 * time.Second

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runQueue runs q until the test ends.
func runQueue(t *testing.T, q *queue) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { q.run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

func waitDrained(t *testing.T, q *queue) {
	t.Helper()
	select {
	case <-q.drained():
	case <-time.After(waitTimeout):
		t.Fatal("queue not drained in time")
	}
}

func TestQueue_OrderAndCoalescing(t *testing.T) {
	q := newQueue("test", Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond}, quiet)
	var mu sync.Mutex
	var ran []string
	gate := make(chan struct{})
	record := func(name string) func(context.Context) error {
		return func(context.Context) error {
			mu.Lock()
			ran = append(ran, name)
			mu.Unlock()
			return nil
		}
	}
	// The first job blocks, so that the others wait behind it.
	q.push(&job{what: "first", first: 1, last: 1, run: func(ctx context.Context) error {
		<-gate
		return record("first")(ctx)
	}})
	q.push(&job{key: "status", first: 2, last: 2, run: record("status v1")})
	q.push(&job{key: "approval", first: 3, last: 3, run: record("approval")})
	q.push(&job{key: "status", first: 4, last: 4, run: record("status v2")})
	if got := q.delivered(4); got != 0 {
		t.Fatalf("delivered = %d with event 1's job pending, want 0", got)
	}
	runQueue(t, q)
	close(gate)
	waitDrained(t, q)
	want := []string{"first", "status v2", "approval"}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(ran, ",") != strings.Join(want, ",") {
		t.Fatalf("ran %v, want %v (one status job, in its first place, with the last content)", ran, want)
	}
	if got := q.delivered(4); got != 4 {
		t.Fatalf("delivered = %d once empty, want 4", got)
	}
}

func TestQueue_Retries(t *testing.T) {
	q := newQueue("test", Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond}, quiet)
	var mu sync.Mutex
	var times []time.Time
	tries := 0
	q.push(&job{what: "rate limited once", run: func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		times = append(times, time.Now())
		tries++
		if tries == 1 {
			return &RateLimited{After: 60 * time.Millisecond, Err: errors.New("429")}
		}
		if tries == 2 {
			return errors.New("connection refused")
		}
		return nil
	}})
	dropped := 0
	q.push(&job{what: "permanent", run: func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		dropped++
		return Permanent(errors.New("channel_not_found"))
	}})
	after := false
	q.push(&job{what: "after", run: func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		after = true
		return nil
	}})
	runQueue(t, q)
	waitDrained(t, q)
	mu.Lock()
	defer mu.Unlock()
	if tries != 3 || dropped != 1 || !after {
		t.Fatalf("tries %d, permanent ran %d times, later job ran %v", tries, dropped, after)
	}
	if gap := times[1].Sub(times[0]); gap < 60*time.Millisecond {
		t.Fatalf("retried %s after a Retry-After of 60ms", gap)
	}
}

func TestQueue_Attempts(t *testing.T) {
	q := newQueue("test", Backoff{Min: time.Millisecond, Max: time.Millisecond, Attempts: 3}, quiet)
	n := 0
	q.push(&job{what: "always failing", run: func(context.Context) error { n++; return errors.New("503") }})
	runQueue(t, q)
	waitDrained(t, q)
	if n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
}

func TestBackoff_Delay(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for attempt, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		d := b.delay(attempt, errors.New("x"))
		want *= time.Millisecond
		if d < want/2 || d > want { // session/retry's policy
			t.Errorf("attempt %d: %s, want within [%s, %s]", attempt, d, want/2, want)
		}
	}
	if d := b.delay(0, &RateLimited{After: 7 * time.Second}); d != 7*time.Second {
		t.Errorf("Retry-After not honoured: %s", d)
	}
}

// emails is a Channel that knows people's email addresses.
type emails struct {
	Channel
	known map[string]string
	err   error
}

func (e emails) VerifiedEmail(_ context.Context, _, id string) (string, error) {
	return e.known[id], e.err
}

func TestIdentity(t *testing.T) {
	id := Identity{
		Workspaces: []WorkspaceMapping{
			{Platform: "slack", Workspace: "T1", Tenant: "acme", EmailDomains: []string{"acme.test"}},
			{Platform: "slack", Workspace: "T2", Tenant: "globex"},
		},
		Users: []UserMapping{
			{Platform: "slack", ID: "U1", User: "alice"},
			{Platform: "slack", Workspace: "T2", ID: "U2", User: "bob"},
			{Platform: "telegram", ID: "42", User: "carol", Tenant: "acme"},
		},
	}
	if err := id.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	d := &directory{id: id, now: time.Now}
	ch := emails{known: map[string]string{"U3": "Dana@Acme.test", "U4": "eve@evil.test"}}
	for name, tc := range map[string]struct {
		th   Thread
		user string
		want session.Principal
		ok   bool
	}{
		"row, tenant of the workspace": {Thread{Platform: "slack", Workspace: "T1"}, "U1", session.Principal{User: "alice", Tenant: "acme", Via: "slack"}, true},
		"row in another workspace":     {Thread{Platform: "slack", Workspace: "T2"}, "U1", session.Principal{User: "alice", Tenant: "globex", Via: "slack"}, true},
		"row of one workspace only":    {Thread{Platform: "slack", Workspace: "T1"}, "U2", session.Principal{}, false},
		"row with its tenant":          {Thread{Platform: "telegram", Workspace: "9"}, "42", session.Principal{User: "carol", Tenant: "acme", Via: "telegram"}, true},
		"email in the domain":          {Thread{Platform: "slack", Workspace: "T1"}, "U3", session.Principal{User: "dana@acme.test", Tenant: "acme", Via: "slack"}, true},
		"email elsewhere":              {Thread{Platform: "slack", Workspace: "T1"}, "U4", session.Principal{}, false},
		"no email domains there":       {Thread{Platform: "slack", Workspace: "T2"}, "U3", session.Principal{}, false},
		"nobody":                       {Thread{Platform: "slack", Workspace: "T1"}, "U9", session.Principal{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			p, ok, err := d.resolve(context.Background(), ch, tc.th, User{ID: tc.user})
			if err != nil || ok != tc.ok || p != tc.want {
				t.Fatalf("resolve = %+v, %v, %v; want %+v, %v", p, ok, err, tc.want, tc.ok)
			}
		})
	}
	if _, _, err := d.resolve(context.Background(), emails{err: errors.New("slack down")}, Thread{Platform: "slack", Workspace: "T1"}, User{ID: "U7"}); err == nil {
		t.Fatal("a failed email lookup was not an error")
	}
	for name, bad := range map[string]Identity{
		"workspace without tenant": {Workspaces: []WorkspaceMapping{{Platform: "slack", Workspace: "T1"}}},
		"domain with @":            {Workspaces: []WorkspaceMapping{{Platform: "slack", Workspace: "T1", Tenant: "a", EmailDomains: []string{"@acme.test"}}}},
		"user without tenant":      {Users: []UserMapping{{Platform: "slack", ID: "U1", User: "alice"}}},
		"user with spaces":         {Users: []UserMapping{{Platform: "slack", ID: "U1", User: " alice", Tenant: "a"}}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", name)
		}
	}
}

func TestRender(t *testing.T) {
	for name, tc := range map[string]struct{ data, want string }{
		"text":          {`{"type":"x","text":"hello"}`, "hello\n"},
		"result":        {`{"type":"result","result":"all done"}`, "all done\n"},
		"claude":        {`{"type":"assistant","message":{"content":[{"type":"text","text":"a"},{"type":"tool_use"},{"type":"text","text":"b"}]}}`, "a\nb\n"},
		"nothing human": {`{"type":"tool_use","name":"ls"}`, ""},
	} {
		if got := agentText(json.RawMessage(tc.data)); got != tc.want {
			t.Errorf("%s: agentText = %q, want %q", name, got, tc.want)
		}
	}
	if got := lastBytes([]byte("line one\nline two\nline three\n"), 16); got != "…\nline three" {
		t.Errorf("lastBytes = %q", got)
	}
	if got := title("  fix the build\nand more"); got != "fix the build" {
		t.Errorf("title = %q", got)
	}
	if got := title(strings.Repeat("é", 200)); len([]rune(got)) != maxTitle {
		t.Errorf("title of a long prompt has %d runes", len([]rune(got)))
	}
	if got := truncateUTF8("héllo", 2); got != "h" {
		t.Errorf("truncateUTF8 = %q", got)
	}
}

// fakeChat is a Channel that records what it is asked to show.
type fakeChat struct {
	mu    sync.Mutex
	posts map[Ref]Message
	order []Ref
	files []File
	fail  int // fail the next calls
}

func (f *fakeChat) Platform() string { return "fake" }

func (f *fakeChat) Post(_ context.Context, _ Thread, m Message) (Ref, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return "", errors.New("unavailable")
	}
	if f.posts == nil {
		f.posts = make(map[Ref]Message)
	}
	r := Ref(time.Now().Format(time.RFC3339Nano))
	f.posts[r] = m
	f.order = append(f.order, r)
	return r, nil
}

func (f *fakeChat) Edit(_ context.Context, _ Thread, r Ref, m Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.posts[r] = m
	return nil
}

func (f *fakeChat) Upload(_ context.Context, _ Thread, file File, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files = append(f.files, file)
	return nil
}

func (f *fakeChat) Whisper(context.Context, Thread, User, string) error { return nil }

func event(seq session.Seq, kind session.Kind, by string, data any) *session.Event {
	return &session.Event{Seq: seq, Kind: kind, By: by, Data: session.MustData(data)}
}

func TestThread_Turn(t *testing.T) {
	fc := &fakeChat{}
	q := newQueue("test", Backoff{Min: time.Millisecond, Max: time.Millisecond}, quiet)
	cfg := &Config{InlineOutput: 100, MaxFileBytes: 1000, EditEvery: time.Millisecond}
	th := newThread(fc, Thread{Platform: "fake"}, q, "https://atrium.test/s/s_1", cfg, nil)
	th.event(event(2, session.KindTurnStarted, "alice", session.TurnStartedData{Turn: 1, PromptSeq: 1}), false)
	th.event(event(3, session.KindOutput, session.BySystem, session.OutputData{Turn: 1, Stream: "stdout", Text: "building\n"}), false)
	th.event(event(4, session.KindApprovalRequested, session.BySystem, session.ApprovalRequestedData{Turn: 1, ID: "a1", Summary: "push?"}), false)
	runQueue(t, q)
	waitDrained(t, q)
	th.event(event(5, session.KindApprovalResolved, "bob", session.ApprovalResolvedData{Turn: 1, ID: "a1", Allow: false}), false)
	th.event(event(6, session.KindOutput, session.BySystem, session.OutputData{Turn: 1, Stream: "stdout", Text: strings.Repeat("y", 300)}), false)
	th.event(event(7, session.KindTurnFinished, session.BySystem, session.TurnFinishedData{Turn: 1, Status: session.TurnFailed, ExitCode: 2, DurationMS: 1500}), false)
	waitDrained(t, q)

	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.order) != 2 || len(fc.files) != 1 {
		t.Fatalf("%d messages and %d files, want 2 (status, approval) and 1 (the long output)", len(fc.order), len(fc.files))
	}
	status, ask := fc.posts[fc.order[0]], fc.posts[fc.order[1]]
	if !strings.Contains(status.Text, "Turn 1 failed (exit code 2) after 1.5s") {
		t.Errorf("status %q", status.Text)
	}
	if !strings.Contains(ask.Text, "Denied by bob: push?") || len(ask.Buttons) != 0 {
		t.Errorf("approval %+v", ask)
	}
	if f := fc.files[0]; f.Name != "turn-1-output.txt" || string(f.Content) != "building\n"+strings.Repeat("y", 300) {
		t.Errorf("file %s %q", f.Name, f.Content)
	}
	if v := th.snapshot(7); v.Turn != 0 || len(v.Refs) != 3 {
		t.Errorf("view at 7 %+v: want no running turn and 3 refs (status, approval, upload)", v)
	}
	if v := th.snapshot(5); v.Turn != 1 || v.TurnStart != 2 {
		t.Errorf("view at 5 %+v: want turn 1 running since 2, to replay", v)
	}
}

// startNATS runs an in-process nats-server with JetStream.
func startNATS(t *testing.T) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(waitTimeout) {
		t.Fatal("nats not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return nc
}

func newStore(t *testing.T, now func() time.Time) *store {
	js, err := jetstream.New(startNATS(t))
	if err != nil {
		t.Fatal(err)
	}
	return &store{js: js, timeout: 5 * time.Second, now: now,
		bindings: bucket{cfg: jetstream.KeyValueConfig{Bucket: "t_channels"}},
		dedupe:   bucket{cfg: jetstream.KeyValueConfig{Bucket: "t_dedupe", TTL: time.Hour}},
		leases:   bucket{cfg: jetstream.KeyValueConfig{Bucket: "t_leases", TTL: time.Minute}},
	}
}

func TestStore_Claims(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	s := newStore(t, clock)
	ctx := context.Background()
	c, err := s.claim(ctx, "slack.ev1")
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if _, err := s.claim(ctx, "slack.ev1"); !errors.Is(err, errInProgress) {
		t.Fatalf("second claim while processing: %v, want in progress", err)
	}
	if err := s.done(ctx, c); err != nil {
		t.Fatalf("done: %v", err)
	}
	if _, err := s.claim(ctx, "slack.ev1"); !errors.Is(err, errDuplicate) {
		t.Fatalf("claim after done: %v, want duplicate", err)
	}
	// A released claim can be taken again (the platform's retry).
	c2, err := s.claim(ctx, "slack.ev2")
	if err != nil {
		t.Fatal(err)
	}
	s.release(ctx, c2)
	if _, err := s.claim(ctx, "slack.ev2"); err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	// A claim whose holder died is taken over once stale.
	now = now.Add(claimStale + time.Second)
	if _, err := s.claim(ctx, "slack.ev2"); err != nil {
		t.Fatalf("claim of a stale one: %v", err)
	}
}

func TestStore_LeasesAndBindings(t *testing.T) {
	s := newStore(t, time.Now)
	ctx := context.Background()
	rev, ok, err := s.acquire(ctx, "s_1", "gw_a")
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if _, ok, _ := s.acquire(ctx, "s_1", "gw_b"); ok {
		t.Fatal("a second gateway acquired a held lease")
	}
	if _, err := s.renew(ctx, "s_1", "gw_b", rev-1); err == nil {
		t.Fatal("renewed at a stale revision")
	}
	rev, err = s.renew(ctx, "s_1", "gw_a", rev)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	s.releaseLease(ctx, "s_1", rev)
	if _, ok, err := s.acquire(ctx, "s_1", "gw_b"); err != nil || !ok {
		t.Fatalf("acquire after release: %v %v", ok, err)
	}

	th := Thread{Platform: "slack", Workspace: "T1", Channel: "C1", ID: "1.2"}
	got, err := s.bindThread(ctx, th, "s_1", "alice", "acme", false)
	if err != nil || got != "s_1" {
		t.Fatalf("bind: %s %v", got, err)
	}
	if got, _ := s.bindThread(ctx, th, "s_2", "bob", "acme", false); got != "s_1" {
		t.Fatalf("a second bind of the thread got %s, want the first session", got)
	}
	if got, _ := s.latestIn(ctx, Thread{Platform: "slack", Workspace: "T1", Channel: "C1"}); got != "s_1" {
		t.Fatalf("latest in channel = %s", got)
	}
	b, _, err := s.binding(ctx, "s_1")
	if err != nil || b == nil || b.Owner != "alice" || b.Thread == nil || *b.Thread != th {
		t.Fatalf("binding %+v %v", b, err)
	}
	if err := s.unbind(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.sessionOf(ctx, th); got != "" {
		t.Fatalf("thread still bound to %s after unbind", got)
	}
}
