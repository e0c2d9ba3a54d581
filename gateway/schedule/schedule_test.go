package schedule

// The scheduler's tests run under testing/synctest with a real nats-server
// (JetStream, in-process connections: net.Pipe, which the bubble sees as
// durably blocked) inside the bubble, so that hours of cron ticks, lease
// TTLs and backoff pass in fake time. Sessions is a recording stand-in for
// the gateway here; gateway/automation_test.go runs schedules against the
// real gateway and node.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats-server/v2/server/ats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) {
	// nats-server's access-time service runs one goroutine per process
	// that waits on a channel made at init, outside any bubble: a bubble
	// that started it could never see it durably blocked. Starting it
	// here, outside the bubbles, keeps it out of them.
	ats.Register()
	code := m.Run()
	ats.Unregister()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	ann   = session.Principal{User: "ann", Tenant: "acme", Via: session.ViaDev}
	bob   = session.Principal{User: "bob", Tenant: "acme", Via: session.ViaDev}
	admin = session.Principal{User: "ada", Tenant: "acme", Admin: true, Via: session.ViaDev}
	gil   = session.Principal{User: "gil", Tenant: "globex", Via: session.ViaDev}
)

// call is one Run the stand-in received.
type call struct {
	p    session.Principal
	id   session.ID
	text string
	at   time.Time
}

// fakeSessions records runs. Unless told otherwise, everyone may drive
// every session, and every turn ends ok.
type fakeSessions struct {
	mu      sync.Mutex
	calls   []call             // guarded by mu
	created []string           // guarded by mu: titles
	denied  map[string]bool    // guarded by mu: users refused (forbidden)
	script  []error            // guarded by mu: errors of the next runs, in order
	status  session.TurnStatus // guarded by mu: status of turns; default ok
}

func (f *fakeSessions) Authorize(ctx context.Context, p session.Principal, id session.ID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.denied[p.User] {
		return session.Errorf(session.CodeForbidden, "this needs the driver role; you are a viewer")
	}
	return nil
}

func (f *fakeSessions) Create(ctx context.Context, p session.Principal, title string) (session.ID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, title)
	return session.ID(fmt.Sprintf("s_new%d", len(f.created))), nil
}

func (f *fakeSessions) Run(ctx context.Context, p session.Principal, id session.ID, text string) (Outcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.denied[p.User] {
		return Outcome{}, session.Errorf(session.CodeForbidden, "this needs the driver role; you are a viewer")
	}
	if len(f.script) > 0 {
		err := f.script[0]
		f.script = f.script[1:]
		if err != nil {
			return Outcome{}, err
		}
	}
	f.calls = append(f.calls, call{p: p, id: id, text: text, at: time.Now()})
	st := f.status
	if st == "" {
		st = session.TurnOK
	}
	return Outcome{Seq: int64(len(f.calls)), Turn: int64(len(f.calls)), Status: st}, nil
}

func (f *fakeSessions) runs() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeSessions) deny(user string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.denied == nil {
		f.denied = make(map[string]bool)
	}
	f.denied[user] = true
}

// bubble is a nats-server and what the schedulers share, inside a synctest
// bubble.
type bubble struct {
	t        *testing.T
	ns       *server.Server
	sessions *fakeSessions
	dlq      *dlq.Queue
	// leaseTTL is the schedulers' lease TTL: long, so that hours of fake
	// time do not cost thousands of renewals, except in the tests about
	// leadership, which use DefaultLeaseTTL.
	leaseTTL time.Duration
}

// newBubble starts a nats-server inside the current bubble; Cleanup stops it.
func newBubble(t *testing.T) *bubble {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
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
	b := &bubble{t: t, ns: ns, sessions: &fakeSessions{}, leaseTTL: 10 * time.Minute}
	q, err := dlq.Open(t.Context(), dlq.Config{JetStream: b.js(), Bucket: "test_dlq", Logger: quiet()})
	if err != nil {
		t.Fatalf("open dlq: %v", err)
	}
	b.dlq = q
	return b
}

// js returns a JetStream context on a new connection; Cleanup closes it.
func (b *bubble) js() jetstream.JetStream {
	b.t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(b.ns))
	if err != nil {
		b.t.Fatalf("connect nats: %v", err)
	}
	b.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.t.Fatalf("jetstream: %v", err)
	}
	return js
}

// start opens and starts a scheduler on its own connection (another
// "gateway"); Cleanup closes it.
func (b *bubble) start(name string) (*Scheduler, *nats.Conn) {
	b.t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(b.ns), nats.NoReconnect())
	if err != nil {
		b.t.Fatalf("connect nats: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.t.Fatalf("jetstream: %v", err)
	}
	s, err := Open(b.t.Context(), Config{
		JetStream: js, Prefix: "test", Sessions: b.sessions, DLQ: b.dlq, Instance: name, LeaseTTL: b.leaseTTL,
		Retry:  dlq.Backoff{Base: time.Second, Max: 10 * time.Second, Attempts: 3},
		Logger: quiet().With("instance", name),
	})
	if err != nil {
		b.t.Fatalf("open scheduler: %v", err)
	}
	s.Start()
	b.t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			b.t.Errorf("close %s: %v", name, err)
		}
		nc.Close()
	})
	return s, nc
}

func create(t *testing.T, s *Scheduler, p session.Principal, sp Spec) Schedule {
	t.Helper()
	sc, err := s.Create(t.Context(), p, sp)
	if err != nil {
		t.Fatalf("create %+v: %v", sp, err)
	}
	return sc
}

// wait lets the bubble's goroutines act on what just happened.
func wait(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// ticks returns the minutes past the start of the bubble (2000-01-01
// 00:00 UTC) at which the runs happened.
func minutes(cs []call) []int {
	start := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]int, len(cs))
	for i, c := range cs {
		out[i] = int(c.at.Sub(start) / time.Minute)
	}
	return out
}

func every(from, to, step int) []int {
	var out []int
	for m := from; m <= to; m += step {
		out = append(out, m)
	}
	return out
}

func TestScheduler_ExactlyOnceWithTwoGateways(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		b.leaseTTL = DefaultLeaseTTL
		a, _ := b.start("gw-a")
		c, _ := b.start("gw-b")
		wait(time.Second)
		if a.Leading() == c.Leading() {
			t.Fatalf("leading: a=%v b=%v; want exactly one leader", a.Leading(), c.Leading())
		}
		sc := create(t, a, ann, Spec{Cron: "*/5 * * * *", Session: "s_target", Prompt: "report"})
		wait(time.Hour + 30*time.Second)
		runs := b.sessions.runs()
		if got, want := minutes(runs), every(5, 60, 5); !slices.Equal(got, want) {
			t.Fatalf("runs at minutes %v, want %v (each tick exactly once)", got, want)
		}
		for _, r := range runs {
			if r.p.User != "ann" || r.p.Tenant != "acme" || r.p.Admin || r.id != "s_target" || r.text != "report" {
				t.Fatalf("run %+v: want ann's prompt into s_target", r)
			}
		}
		got, err := c.Get(t.Context(), ann, sc.ID)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.LastRun == nil || got.LastRun.Status != "ok" || got.LastRun.Tick.Minute() != 0 || got.LastRun.Tick.Hour() != 1 {
			t.Errorf("last run = %+v, want the 01:00 tick, ok", got.LastRun)
		}
		if got.NextRun == nil || !got.NextRun.Equal(time.Date(2000, 1, 1, 1, 5, 0, 0, time.UTC)) {
			t.Errorf("next run = %v, want 01:05", got.NextRun)
		}
	})
}

func TestScheduler_OverlappingLeadersClaimOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		c, _ := b.start("gw-b")
		sc := create(t, a, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x"})
		wait(time.Second)
		// Both act as leaders at the same tick, from the same revision:
		// exactly one claim succeeds.
		r, rev, err := a.get(t.Context(), sc.ID)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		r.LastTick = time.Date(2000, 1, 1, 1, 0, 0, 0, time.UTC)
		errA, errB := a.claim(r, rev), c.claim(r, rev)
		if (errA == nil) == (errB == nil) || !errors.Is(cmpOr(errA, errB), errConflict) {
			t.Fatalf("claims = %v, %v; want one success and one conflict", errA, errB)
		}
	})
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func TestScheduler_LeaderFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		b.leaseTTL = DefaultLeaseTTL
		a, anc := b.start("gw-a")
		wait(time.Second) // a leads: it started alone.
		c, _ := b.start("gw-b")
		wait(time.Second)
		if !a.Leading() || c.Leading() {
			t.Fatalf("leading: a=%v b=%v; want a", a.Leading(), c.Leading())
		}
		create(t, c, ann, Spec{Cron: "*/5 * * * *", Session: "s_target", Prompt: "x"})
		wait(12 * time.Minute) // a fires 00:05 and 00:10.
		// a's connection dies: it can no longer renew its lease, nor claim
		// ticks; b takes over when the lease expires.
		anc.Close()
		wait(DefaultLeaseTTL + DefaultLeaseTTL/3 + time.Second)
		if !c.Leading() {
			t.Fatal("b does not lead after a's lease expired")
		}
		if a.Leading() {
			t.Error("a still believes it leads without renewing its lease")
		}
		wait(time.Hour)
		if got, want := minutes(b.sessions.runs()), every(5, 70, 5); !slices.Equal(got, want) {
			t.Fatalf("runs at minutes %v, want %v (none lost or doubled by the failover)", got, want)
		}
	})
}

func TestScheduler_CloseHandsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		b.leaseTTL = DefaultLeaseTTL
		a, _ := b.start("gw-a")
		wait(time.Second)
		c, _ := b.start("gw-b")
		wait(time.Second)
		if err := a.Close(t.Context()); err != nil {
			t.Fatalf("close: %v", err)
		}
		wait(DefaultLeaseTTL/3 + time.Second) // b's next campaign, well before the TTL.
		if !c.Leading() {
			t.Fatal("b does not lead after a closed (a should give up its lease)")
		}
	})
}

func TestScheduler_MissedTicks(t *testing.T) {
	for name, tc := range map[string]struct {
		policy string
		want   []int // minutes of the runs
	}{
		"skip":     {MissedSkip, []int{240, 300}},
		"run_once": {MissedRunOnce, []int{210, 240, 300}},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBubble(t)
				a, _ := b.start("gw-a")
				wait(10 * time.Minute)
				sc := create(t, a, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x", Missed: tc.policy})
				wait(time.Second)
				if err := a.Close(t.Context()); err != nil {
					t.Fatalf("close: %v", err)
				}
				// Every gateway is down from 00:10 to 03:30: the ticks of
				// 01:00, 02:00 and 03:00 are missed.
				wait(3*time.Hour + 20*time.Minute - time.Second)
				c, _ := b.start("gw-b")
				wait(time.Minute)
				back, err := c.Get(t.Context(), ann, sc.ID)
				if err != nil {
					t.Fatalf("get: %v", err)
				}
				if three := time.Date(2000, 1, 1, 3, 0, 0, 0, time.UTC); !back.LastTick.Equal(three) {
					t.Errorf("last tick = %v, want 03:00 (every missed tick claimed)", back.LastTick)
				}
				switch {
				case tc.policy == MissedSkip && back.LastRun != nil:
					t.Errorf("last run = %+v, want none: missed ticks are skipped", back.LastRun)
				case tc.policy == MissedRunOnce && (back.LastRun == nil || back.LastRun.Tick.Hour() != 3 || back.LastRun.Missed != 2):
					t.Errorf("last run = %+v, want one run for 03:00 standing for 2 more ticks", back.LastRun)
				}
				wait(2*time.Hour - 30*time.Minute) // until 05:01
				if got := minutes(b.sessions.runs()); !slices.Equal(got, tc.want) {
					t.Fatalf("runs at minutes %v, want %v", got, tc.want)
				}
				got, err := c.Get(t.Context(), ann, sc.ID)
				if err != nil {
					t.Fatalf("get: %v", err)
				}
				if got.LastRun == nil || got.LastRun.Tick.Hour() != 5 || got.LastRun.Missed != 0 {
					t.Errorf("last run = %+v, want the 05:00 tick", got.LastRun)
				}
			})
		})
	}
}

func TestScheduler_PauseResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		sc := create(t, a, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x", Missed: MissedRunOnce})
		wait(time.Hour + time.Minute) // runs at 01:00
		paused, err := a.SetPaused(t.Context(), ann, sc.ID, true)
		if err != nil || !paused.Paused || paused.NextRun != nil {
			t.Fatalf("pause = %+v, %v; want paused without a next run", paused, err)
		}
		wait(3 * time.Hour) // 02:00, 03:00, 04:00 pass while paused
		if got := minutes(b.sessions.runs()); !slices.Equal(got, []int{60}) {
			t.Fatalf("runs at minutes %v while paused, want [60]", got)
		}
		resumed, err := a.SetPaused(t.Context(), ann, sc.ID, false)
		if err != nil || resumed.Paused || resumed.NextRun == nil || resumed.NextRun.Hour() != 5 {
			t.Fatalf("resume = %+v, %v; want the next run at 05:00", resumed, err)
		}
		wait(time.Hour) // the ticks skipped while paused are not "missed": only 05:00 runs.
		if got := minutes(b.sessions.runs()); !slices.Equal(got, []int{60, 300}) {
			t.Fatalf("runs at minutes %v, want [60 300]", got)
		}
	})
}

func TestScheduler_NewSessionEachRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		create(t, a, ann, Spec{Cron: "30 9 * * *", TZ: "Europe/Paris", New: true, Title: "Daily report", Prompt: "summarise"})
		wait(33 * time.Hour) // until 09:00 UTC of the second day
		b.sessions.mu.Lock()
		titles := slices.Clone(b.sessions.created)
		b.sessions.mu.Unlock()
		want := []string{"Daily report 2000-01-01 09:30", "Daily report 2000-01-02 09:30"}
		if !slices.Equal(titles, want) {
			t.Fatalf("created %q, want %q", titles, want)
		}
		runs := b.sessions.runs()
		if len(runs) != 2 || runs[0].id != "s_new1" || runs[1].id != "s_new2" {
			t.Fatalf("runs %+v, want one into each new session", runs)
		}
		if h := runs[0].at.UTC().Hour(); h != 8 { // 09:30 in Paris is 08:30 UTC in winter.
			t.Errorf("ran at %v UTC, want 08:30", runs[0].at.UTC())
		}
	})
}

func TestScheduler_CreatorLostAccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		sc := create(t, a, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x"})
		b.sessions.deny("ann")
		wait(time.Hour + time.Minute)
		if n := len(b.sessions.runs()); n != 0 {
			t.Fatalf("%d prompts sent for a creator who lost access", n)
		}
		es, err := b.dlq.List(t.Context(), "acme")
		if err != nil || len(es) != 1 {
			t.Fatalf("dead letters = %v, %v; want one", es, err)
		}
		e := es[0]
		if e.Kind != KindSchedule || e.Ref != sc.ID || e.User != "ann" || !e.Permanent || e.Attempts != 1 ||
			!strings.Contains(e.Reason, "ann, who created schedule "+sc.ID+", can no longer drive session s_target") {
			t.Errorf("dead letter = %+v, want a permanent one saying ann lost access", e)
		}
		got, _ := a.Get(t.Context(), ann, sc.ID)
		if got.LastRun == nil || got.LastRun.Status != StatusDeadLetter || got.LastRun.DeadLetter != e.ID {
			t.Errorf("last run = %+v, want dead_letter %s", got.LastRun, e.ID)
		}
	})
}

func TestScheduler_RetriesThenDeadLetterThenRetryByHand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		unavailable := session.Errorf(session.CodeUnavailable, "no node is available: try again shortly")
		b.sessions.script = []error{unavailable, unavailable, unavailable}
		sc := create(t, a, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x"})
		wait(time.Hour + time.Minute)
		es, _ := b.dlq.List(t.Context(), "acme")
		if len(es) != 1 || es[0].Permanent || es[0].Attempts != 3 || !strings.Contains(es[0].Reason, "no node is available") {
			t.Fatalf("dead letters = %+v; want one, exhausted after 3 attempts", es)
		}
		if n := len(b.sessions.runs()); n != 0 {
			t.Fatalf("%d runs succeeded, want none", n)
		}
		// The node is back: the dead letter is retried by hand.
		if err := b.dlq.Retry(t.Context(), es[0].ID); err != nil {
			t.Fatalf("retry: %v", err)
		}
		if _, err := b.dlq.Get(t.Context(), es[0].ID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("dead letter still there after a successful retry: %v", err)
		}
		runs := b.sessions.runs()
		if len(runs) != 1 || runs[0].id != "s_target" || runs[0].p.User != "ann" {
			t.Fatalf("runs %+v, want ann's prompt into s_target", runs)
		}
		got, _ := a.Get(t.Context(), ann, sc.ID)
		if got.LastRun == nil || got.LastRun.Status != "ok" || got.LastRun.Attempts != 4 {
			t.Errorf("last run = %+v, want ok after 4 attempts", got.LastRun)
		}
	})
}

func TestScheduler_FailedTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		b.sessions.status = session.TurnFailed
		create(t, a, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x"})
		wait(time.Hour + time.Minute)
		if n := len(b.sessions.runs()); n != 1 {
			t.Fatalf("%d runs, want 1 (a failed turn is not retried)", n)
		}
		es, _ := b.dlq.List(t.Context(), "acme")
		if len(es) != 1 || !es[0].Permanent || !strings.Contains(es[0].Reason, "ended failed") {
			t.Fatalf("dead letters = %+v; want one permanent, saying the turn failed", es)
		}
	})
}

func TestScheduler_Access(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		mine := create(t, a, ann, Spec{Cron: "@daily", Session: "s_1", Prompt: "x"})
		create(t, a, bob, Spec{Cron: "@daily", Session: "s_2", Prompt: "y"})
		create(t, a, gil, Spec{Cron: "@daily", Session: "s_3", Prompt: "z"})
		ids := func(p session.Principal) []string {
			l, err := a.List(t.Context(), p)
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			var out []string
			for _, s := range l {
				out = append(out, s.Creator)
			}
			slices.Sort(out) // created at the same (fake) instant: any order.
			return out
		}
		if got := ids(ann); !slices.Equal(got, []string{"ann"}) {
			t.Errorf("ann sees %v", got)
		}
		if got := ids(admin); !slices.Equal(got, []string{"ann", "bob"}) {
			t.Errorf("the admin of acme sees %v, want ann's and bob's", got)
		}
		if _, err := a.Get(t.Context(), bob, mine.ID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("bob gets ann's schedule: %v", err)
		}
		if err := a.Delete(t.Context(), gil, mine.ID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("gil deletes ann's schedule: %v", err)
		}
		if _, err := a.SetPaused(t.Context(), bob, mine.ID, true); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("bob pauses ann's schedule: %v", err)
		}
		if _, err := a.SetPaused(t.Context(), admin, mine.ID, true); err != nil {
			t.Errorf("the admin pauses ann's schedule: %v", err)
		}
		if err := a.Delete(t.Context(), ann, mine.ID); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if _, err := a.Get(t.Context(), ann, mine.ID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("get after delete: %v", err)
		}
		b.sessions.deny("bob")
		_, err := a.Create(t.Context(), bob, Spec{Cron: "@daily", Session: "s_1", Prompt: "x"})
		if !errors.Is(err, session.ErrForbidden) || !strings.Contains(err.Error(), "driver role") {
			t.Errorf("create by a viewer = %v, want forbidden naming the driver role", err)
		}
		capped := ann
		capped.Cap = session.RoleViewer
		if _, err := a.Create(t.Context(), capped, Spec{Cron: "@daily", New: true, Prompt: "x"}); !errors.Is(err, session.ErrForbidden) {
			t.Errorf("create with a viewer-capped token = %v, want forbidden", err)
		}
	})
}

func TestSpec_Validate(t *testing.T) {
	long := strings.Repeat("x", session.MaxTitleBytes)
	for name, tc := range map[string]struct {
		spec Spec
		want string // part of the error; "" for none
	}{
		"weekdays":        {Spec{Cron: "0 9 * * 1-5", Session: "s_1", Prompt: "p"}, ""},
		"descriptor":      {Spec{Cron: "@hourly", New: true, Prompt: "p"}, ""},
		"tz":              {Spec{Cron: "0 9 * * *", TZ: "Europe/Paris", Session: "s_1", Prompt: "p"}, ""},
		"run_once":        {Spec{Cron: "0 9 * * *", Session: "s_1", Prompt: "p", Missed: "run_once"}, ""},
		"empty cron":      {Spec{Session: "s_1", Prompt: "p"}, "give a cron expression"},
		"bad cron":        {Spec{Cron: "0 9 * *", Session: "s_1", Prompt: "p"}, "five fields"},
		"seconds":         {Spec{Cron: "@every 10s", Session: "s_1", Prompt: "p"}, "more often than once a minute"},
		"never":           {Spec{Cron: "0 0 30 2 *", Session: "s_1", Prompt: "p"}, "never fires"},
		"tz in cron":      {Spec{Cron: "TZ=UTC 0 9 * * *", Session: "s_1", Prompt: "p"}, "time zone separately"},
		"bad tz":          {Spec{Cron: "0 9 * * *", TZ: "Mars/Olympus", Session: "s_1", Prompt: "p"}, "unknown time zone"},
		"local tz":        {Spec{Cron: "0 9 * * *", TZ: "Local", Session: "s_1", Prompt: "p"}, "depends on the server"},
		"no target":       {Spec{Cron: "0 9 * * *", Prompt: "p"}, "--session ID"},
		"both targets":    {Spec{Cron: "0 9 * * *", Session: "s_1", New: true, Prompt: "p"}, "not both"},
		"bad session":     {Spec{Cron: "0 9 * * *", Session: "s/1", Prompt: "p"}, "may contain only"},
		"title, no new":   {Spec{Cron: "0 9 * * *", Session: "s_1", Title: "t", Prompt: "p"}, "title is for new sessions"},
		"long title":      {Spec{Cron: "0 9 * * *", New: true, Title: long, Prompt: "p"}, "title is longer"},
		"no prompt":       {Spec{Cron: "0 9 * * *", Session: "s_1", Prompt: "  "}, "give the prompt"},
		"bad missed":      {Spec{Cron: "0 9 * * *", Session: "s_1", Prompt: "p", Missed: "always"}, "missed must be"},
		"too long prompt": {Spec{Cron: "0 9 * * *", Session: "s_1", Prompt: strings.Repeat("p", session.MaxTextBytes+1)}, "prompt is longer"},
	} {
		t.Run(name, func(t *testing.T) {
			sp := tc.spec
			_, err := validateSpec(&sp)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("validate: %v", err)
			case tc.want == "":
				if sp.TZ == "" || sp.Missed == "" || (sp.New && sp.Title == "") {
					t.Errorf("defaults not filled in: %+v", sp)
				}
			case err == nil:
				t.Fatalf("validate: no error, want %q", tc.want)
			case !errors.Is(err, session.ErrBadRequest) || !strings.Contains(err.Error(), tc.want):
				t.Errorf("validate = %v, want a bad request saying %q", err, tc.want)
			}
		})
	}
}

// quiet discards logs unless SCHEDULE_TEST_LOG is set.
func quiet() *slog.Logger {
	if os.Getenv("SCHEDULE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func TestScheduler_LostRunBecomesDeadLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		// A gateway claimed a tick and died during the run: the schedule
		// shows it running, and nobody will finish it.
		sc := create(t, a, ann, Spec{Cron: "@yearly", Session: "s_target", Prompt: "x"})
		started := time.Now().UTC()
		err := a.update(t.Context(), sc.ID, func(r *record) error {
			r.LastRun = &Run{Tick: started, Session: "s_target", Status: StatusRunning, StartedAt: started, Attempts: 1}
			return nil
		})
		if err != nil {
			t.Fatalf("update: %v", err)
		}
		wait(a.lostAfter() - time.Minute)
		if es, _ := b.dlq.List(t.Context(), "acme"); len(es) != 0 {
			t.Fatalf("dead letters %+v before the run could have ended", es)
		}
		wait(2 * time.Minute)
		es, err := b.dlq.List(t.Context(), "acme")
		if err != nil || len(es) != 1 || !es[0].Permanent || es[0].Ref != sc.ID ||
			!strings.Contains(es[0].Reason, "stopped before it finished; the prompt may have been sent: see session s_target") {
			t.Fatalf("dead letters = %+v, %v; want one for the lost run", es, err)
		}
		got, _ := a.Get(t.Context(), ann, sc.ID)
		if got.LastRun == nil || got.LastRun.Status != StatusDeadLetter || got.LastRun.DeadLetter != es[0].ID {
			t.Errorf("last run = %+v, want dead_letter %s", got.LastRun, es[0].ID)
		}
		if n := len(b.sessions.runs()); n != 0 {
			t.Errorf("%d prompts sent: a lost run is not re-sent automatically", n)
		}
	})
}

func TestScheduler_RunNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		a, _ := b.start("gw-a")
		sc := create(t, a, ann, Spec{Cron: "@yearly", New: true, Title: "Report", Prompt: "x"})
		if _, err := a.SetPaused(t.Context(), ann, sc.ID, true); err != nil {
			t.Fatalf("pause: %v", err)
		}
		if _, err := a.RunNow(t.Context(), bob, sc.ID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("bob runs ann's schedule: %v, want not found", err)
		}
		got, err := a.RunNow(t.Context(), admin, sc.ID)
		if err != nil || got.LastRun == nil || got.LastRun.Status != StatusRunning {
			t.Fatalf("run now = %+v, %v", got, err)
		}
		synctest.Wait()
		runs := b.sessions.runs()
		if len(runs) != 1 || runs[0].p.User != "ann" || runs[0].id != "s_new1" {
			t.Fatalf("runs %+v, want one as ann (the creator, not the admin who ran it) in a new session", runs)
		}
		after, _ := a.Get(t.Context(), ann, sc.ID)
		if after.LastRun.Status != "ok" || after.LastRun.Session != "s_new1" || !after.LastTick.Equal(sc.LastTick) {
			t.Errorf("after = %+v; want ok in s_new1 and the ticks untouched", after)
		}
	})
}
