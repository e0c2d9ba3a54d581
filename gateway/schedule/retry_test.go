package schedule

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// scriptedTurns is a Sessions whose turns end with the statuses of script,
// in order (ok once it runs out), and which records when each ran.
type scriptedTurns struct {
	fakeSessions
	mu     sync.Mutex
	script []session.TurnStatus // guarded by mu
	at     []time.Time          // guarded by mu
}

func (f *scriptedTurns) Run(ctx context.Context, p session.Principal, id session.ID, text string) (Outcome, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := session.TurnOK
	if len(f.script) > 0 {
		st, f.script = f.script[0], f.script[1:]
	}
	f.at = append(f.at, time.Now())
	return Outcome{Seq: int64(len(f.at)), Turn: int64(len(f.at)), Status: st, ExitCode: 1}, nil
}

func (f *scriptedTurns) times() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.at...)
}

// audits collects audit entries.
type audits struct {
	mu sync.Mutex
	es []audit.Entry // guarded by mu
}

func (a *audits) record(_ context.Context, e audit.Entry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.es = append(a.es, e)
}

func (a *audits) entries() []audit.Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]audit.Entry(nil), a.es...)
}

// startWith opens and starts a scheduler over sessions, recording its
// audit entries in rec.
func (b *bubble) startWith(sessions Sessions, rec *audits) *Scheduler {
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
		JetStream: js, Prefix: "test", Sessions: sessions, DLQ: b.dlq, Instance: "gw-r", LeaseTTL: b.leaseTTL,
		Retry: dlq.Backoff{Base: time.Second, Max: 10 * time.Second, Attempts: 3},
		Audit: rec.record, Logger: quiet(),
	})
	if err != nil {
		b.t.Fatalf("open scheduler: %v", err)
	}
	s.Start()
	b.t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			b.t.Errorf("close: %v", err)
		}
		nc.Close()
	})
	return s
}

// TestScheduler_RetryPolicy: a schedule with a retry policy tries a turn
// that failed or timed out again (the agent's failure, not only the
// infrastructure's), waiting at most the policy's backoff, doubling, between
// tries; each run's end is one audit entry with the tries it took.
func TestScheduler_RetryPolicy(t *testing.T) {
	t.Run("failed then timeout then ok", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBubble(t)
			turns := &scriptedTurns{script: []session.TurnStatus{session.TurnFailed, session.TurnTimeout}}
			rec := &audits{}
			s := b.startWith(turns, rec)
			sc := create(t, s, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x",
				Retry: &api.RetryPolicy{Attempts: 3, Backoff: "1m", MaxBackoff: "90s"}})
			wait(time.Hour + 10*time.Minute)
			at := turns.times()
			if len(at) != 3 {
				t.Fatalf("%d tries, want 3 (failed, timeout, ok)", len(at))
			}
			if d := at[1].Sub(at[0]); d > time.Minute {
				t.Errorf("first wait %v, want at most the backoff 1m", d)
			}
			if d := at[2].Sub(at[1]); d > 90*time.Second {
				t.Errorf("second wait %v, want at most the cap 90s", d)
			}
			got, _ := s.Get(t.Context(), ann, sc.ID)
			if got.LastRun == nil || got.LastRun.Status != "ok" || got.LastRun.Attempts != 3 {
				t.Fatalf("last run %+v, want ok after 3 attempts", got.LastRun)
			}
			if es, _ := b.dlq.List(t.Context(), "acme"); len(es) != 0 {
				t.Errorf("dead letters %+v, want none", es)
			}
			es := rec.entries()
			if len(es) != 1 || es[0].Action != ActRun || es[0].Outcome != audit.OK || es[0].Actor != "ann" ||
				es[0].Session != "s_target" || es[0].Target != sc.ID || !strings.Contains(es[0].Detail, "ok after 3 attempt(s)") {
				t.Fatalf("audit entries %+v, want one ok run after 3 attempts", es)
			}
		})
	})
	t.Run("exhausted: dead letter", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBubble(t)
			turns := &scriptedTurns{script: []session.TurnStatus{session.TurnFailed, session.TurnFailed, session.TurnFailed}}
			rec := &audits{}
			s := b.startWith(turns, rec)
			sc := create(t, s, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x",
				Retry: &api.RetryPolicy{Attempts: 2, Backoff: "10s"}})
			wait(time.Hour + 10*time.Minute)
			if n := len(turns.times()); n != 2 {
				t.Fatalf("%d tries, want the policy's 2", n)
			}
			dl, _ := b.dlq.List(t.Context(), "acme")
			if len(dl) != 1 || dl[0].Permanent || dl[0].Attempts != 2 || !strings.Contains(dl[0].Reason, "ended failed") {
				t.Fatalf("dead letters %+v, want one, retries exhausted after 2", dl)
			}
			es := rec.entries()
			if len(es) != 1 || es[0].Outcome != audit.Failed || !strings.Contains(es[0].Detail, "dead letter "+dl[0].ID) {
				t.Fatalf("audit entries %+v, want one failed run naming its dead letter", es)
			}
			got, _ := s.Get(t.Context(), ann, sc.ID)
			if got.Retry == nil || got.Retry.Attempts != 2 {
				t.Errorf("the schedule does not show its retry policy: %+v", got.Retry)
			}
		})
	})
	t.Run("no policy: a failed turn is not retried", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBubble(t)
			turns := &scriptedTurns{script: []session.TurnStatus{session.TurnFailed}}
			s := b.startWith(turns, &audits{})
			create(t, s, ann, Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x"})
			wait(time.Hour + 10*time.Minute)
			if n := len(turns.times()); n != 1 {
				t.Fatalf("%d tries, want 1", n)
			}
		})
	})
}

// TestSpec_RetryPolicy: a bad retry policy is refused, saying which field.
func TestSpec_RetryPolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		p    api.RetryPolicy
		want string
	}{
		"zero attempts":   {api.RetryPolicy{}, "retry.attempts must be from 1 to 10"},
		"too many":        {api.RetryPolicy{Attempts: 11}, "retry.attempts must be from 1 to 10"},
		"bad backoff":     {api.RetryPolicy{Attempts: 2, Backoff: "soon"}, `retry.backoff "soon" must be a duration`},
		"negative":        {api.RetryPolicy{Attempts: 2, Backoff: "-1s"}, "retry.backoff"},
		"cap below first": {api.RetryPolicy{Attempts: 2, Backoff: "1m", MaxBackoff: "10s"}, "shorter than retry.backoff"},
		"too long":        {api.RetryPolicy{Attempts: 2, MaxBackoff: "7h"}, "at most 6h0m0s"},
	} {
		t.Run(name, func(t *testing.T) {
			sp := Spec{Cron: "0 * * * *", Session: "s_target", Prompt: "x", Retry: &tc.p}
			_, err := validateSpec(&sp)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
