package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/schedule"
	"github.com/atriumhq/atrium/session"
)

// fastRetries makes a gateway retry scheduled runs quickly.
func fastRetries(c *gateway.Config) {
	c.Automation.Schedule.Retry = dlq.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond, Attempts: 3}
}

// newAutomationE2E is a real node (unless noNode) and a gateway that knows
// identities.
func newAutomationE2E(t *testing.T, noNode bool) *env {
	t.Helper()
	ns := startNATS(t)
	if !noNode {
		startNode(t, ns, time.Minute)
	}
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns, func(c *gateway.Config) {
		c.Auth = auth.Chain(identities{}, &auth.Dev{})
	}, fastRetries)
	return e
}

func (e *env) schedule(c cred, id string) schedule.Schedule {
	e.t.Helper()
	var sc schedule.Schedule
	e.must(200, "GET", "/v1/schedules/"+id, c, nil, &sc)
	return sc
}

// lastRun waits until schedule id's last run has ended and returns it.
func (e *env) lastRun(c cred, id string) schedule.Run {
	e.t.Helper()
	var run schedule.Run
	eventually(e.t, "the run of schedule "+id+" to end", func() bool {
		sc := e.schedule(c, id)
		if sc.LastRun == nil || sc.LastRun.Status == schedule.StatusRunning {
			return false
		}
		run = *sc.LastRun
		return true
	})
	return run
}

func (e *env) deadLetters(c cred) []dlq.Entry {
	e.t.Helper()
	var got struct {
		DeadLetters []dlq.Entry `json:"dead_letters"`
	}
	e.must(200, "GET", "/v1/dlq", c, nil, &got)
	return got.DeadLetters
}

func TestAutomation_ScheduleREST(t *testing.T) {
	e := newIDEnv(t)
	ann, bob, carl, dave := as("ann", "acme"), as("bob", "acme"), as("carl", "acme"), as("dave", "acme")
	ada, gil := admin("ada", "acme"), as("gil", "globex")
	sid := e.sessionOf(ann, map[string]session.Role{"bob": session.RoleDriver, "carl": session.RoleViewer})
	spec := map[string]any{"cron": "0 9 * * 1-5", "tz": "Europe/Paris", "session": sid, "prompt": "make report"}

	t.Run("bad requests", func(t *testing.T) {
		for name, tc := range map[string]struct {
			body any
			want string
		}{
			"no cron":       {map[string]any{"session": sid, "prompt": "x"}, "give a cron expression"},
			"bad cron":      {map[string]any{"cron": "61 * * * *", "session": sid, "prompt": "x"}, "cron expression"},
			"unknown field": {map[string]any{"cron": "@daily", "session": sid, "prompt": "x", "when": "now"}, "unknown field"},
			"no target":     {map[string]any{"cron": "@daily", "prompt": "x"}, "--session ID"},
			"bad missed":    {map[string]any{"cron": "@daily", "session": sid, "prompt": "x", "missed": "all"}, "missed must be"},
			"not json":      {"{", "invalid JSON"},
		} {
			t.Run(name, func(t *testing.T) {
				code, body := e.req("POST", "/v1/schedules", bob, tc.body)
				if code != 400 || errCode(t, body) != session.CodeBadRequest || !strings.Contains(string(body), tc.want) {
					t.Errorf("got %d %s, want 400 saying %q", code, body, tc.want)
				}
			})
		}
	})
	t.Run("needs the driver role, as oneself", func(t *testing.T) {
		for name, tc := range map[string]struct {
			c    cred
			want int
		}{
			"viewer":       {carl, 403},
			"stranger":     {dave, 404},
			"tenant admin": {ada, 403},
			"other tenant": {gil, 404},
		} {
			t.Run(name, func(t *testing.T) {
				code, body := e.req("POST", "/v1/schedules", tc.c, spec)
				if code != tc.want {
					t.Errorf("got %d %s, want %d", code, body, tc.want)
				}
			})
		}
		if got := e.listSchedules(ada); len(got) != 0 {
			t.Errorf("refused creations left schedules: %+v", got)
		}
	})

	var sc schedule.Schedule
	e.must(201, "POST", "/v1/schedules", bob, spec, &sc)
	if !strings.HasPrefix(sc.ID, "sc_") || sc.Creator != "bob" || sc.Session != sid || sc.Missed != schedule.MissedSkip ||
		sc.TZ != "Europe/Paris" || sc.NextRun == nil || sc.Paused {
		t.Fatalf("created %+v", sc)
	}
	if wd := sc.NextRun.In(time.UTC).Weekday(); wd == time.Saturday || wd == time.Sunday {
		t.Errorf("next run %v is on a weekend", sc.NextRun)
	}

	t.Run("who sees it", func(t *testing.T) {
		for name, tc := range map[string]struct {
			c    cred
			want int
		}{"creator": {bob, 1}, "tenant admin": {ada, 1}, "session owner": {ann, 0}, "other tenant": {gil, 0}} {
			if got := e.listSchedules(tc.c); len(got) != tc.want {
				t.Errorf("%s sees %d schedules, want %d", name, len(got), tc.want)
			}
		}
		if code, body := e.req("GET", "/v1/schedules/"+sc.ID, ann, nil); code != 404 || errCode(t, body) != session.CodeNotFound {
			t.Errorf("ann gets bob's schedule: %d %s", code, body)
		}
		if code, _ := e.req("DELETE", "/v1/schedules/"+sc.ID, carl, nil); code != 404 {
			t.Errorf("carl deletes bob's schedule: %d", code)
		}
	})
	t.Run("pause and resume", func(t *testing.T) {
		var got schedule.Schedule
		e.must(200, "POST", "/v1/schedules/"+sc.ID+"/pause", bob, nil, &got)
		if !got.Paused || got.NextRun != nil {
			t.Errorf("paused: %+v", got)
		}
		e.must(200, "POST", "/v1/schedules/"+sc.ID+"/resume", ada, nil, &got)
		if got.Paused || got.NextRun == nil {
			t.Errorf("resumed: %+v", got)
		}
	})
	t.Run("delete", func(t *testing.T) {
		e.must(204, "DELETE", "/v1/schedules/"+sc.ID, bob, nil, nil)
		if code, _ := e.req("GET", "/v1/schedules/"+sc.ID, bob, nil); code != 404 {
			t.Errorf("get after delete: %d", code)
		}
		if code, _ := e.req("POST", "/v1/schedules/"+sc.ID+"/run", bob, nil); code != 404 {
			t.Errorf("run after delete: %d", code)
		}
	})
	t.Run("dead letters", func(t *testing.T) {
		if got := e.deadLetters(bob); len(got) != 0 {
			t.Errorf("dead letters: %+v", got)
		}
		for _, m := range []string{"POST /v1/dlq/dl_nope/retry", "DELETE /v1/dlq/dl_nope", "DELETE /v1/dlq/..%2f"} {
			method, path, _ := strings.Cut(m, " ")
			if code, body := e.req(method, path, bob, nil); code != 404 || errCode(t, body) != session.CodeNotFound {
				t.Errorf("%s: %d %s, want 404", m, code, body)
			}
		}
	})
}

func (e *env) listSchedules(c cred) []schedule.Schedule {
	e.t.Helper()
	var got struct{ Schedules []schedule.Schedule }
	e.must(200, "GET", "/v1/schedules", c, nil, &got)
	return got.Schedules
}

// TestAutomation_ScheduledRuns runs schedules on a real node: a run
// prompts the session as its creator and follows the turn; a creator who
// lost access gets a dead letter instead of a prompt; retried by hand once
// access is back, it runs; a failed turn is a dead letter too.
func TestAutomation_ScheduledRuns(t *testing.T) {
	e := newAutomationE2E(t, false)
	ann, bob, carl, ada := as("ann", "acme"), as("bob", "acme"), as("carl", "acme"), admin("ada", "acme")
	sid := e.sessionOf(ann, map[string]session.Role{"bob": session.RoleDriver})
	var sc schedule.Schedule
	e.must(201, "POST", "/v1/schedules", bob, map[string]any{
		"cron": "0 9 * * 1-5", "session": sid, "prompt": "echo scheduled-hello",
	}, &sc)

	messagesBy := func(user string) int {
		n := 0
		for _, raw := range e.pageAs(sid, ann) {
			var ev session.Event
			if json.Unmarshal(raw, &ev) == nil && ev.Kind == session.KindMessage && ev.By == user {
				n++
			}
		}
		return n
	}

	t.Run("a run prompts as the creator and follows the turn", func(t *testing.T) {
		e.must(202, "POST", "/v1/schedules/"+sc.ID+"/run", bob, nil, nil)
		run := e.lastRun(bob, sc.ID)
		if run.Status != "ok" || run.Session != sid || run.Seq == 0 || run.Turn == 0 || run.ExitCode == nil || *run.ExitCode != 0 {
			t.Fatalf("run = %+v, want ok in %s", run, sid)
		}
		var sawOutput bool
		for _, raw := range e.pageAs(sid, ann) {
			var ev session.Event
			_ = json.Unmarshal(raw, &ev)
			if ev.Kind == session.KindMessage && ev.Seq == run.Seq && ev.By != "bob" {
				t.Errorf("the prompt is by %q, want bob", ev.By)
			}
			if ev.Kind == session.KindOutput && strings.Contains(string(ev.Data), "scheduled-hello") {
				sawOutput = true
			}
		}
		if !sawOutput {
			t.Error("the turn's output is not in the session")
		}
	})

	var dead dlq.Entry
	t.Run("a creator who lost access gets a dead letter, not a prompt", func(t *testing.T) {
		before := messagesBy("bob")
		e.must(200, "PUT", "/v1/sessions/"+string(sid)+"/members/bob", ann, map[string]string{"role": "viewer"}, nil)
		e.must(202, "POST", "/v1/schedules/"+sc.ID+"/run", bob, nil, nil)
		run := e.lastRun(bob, sc.ID)
		if run.Status != schedule.StatusDeadLetter || run.DeadLetter == "" {
			t.Fatalf("run = %+v, want a dead letter", run)
		}
		if n := messagesBy("bob"); n != before {
			t.Fatalf("bob's prompts: %d, was %d: a prompt was sent without access", n, before)
		}
		got := e.deadLetters(bob)
		if len(got) != 1 {
			t.Fatalf("bob's dead letters: %+v, want one", got)
		}
		dead = got[0]
		if dead.ID != run.DeadLetter || dead.Kind != "schedule" || dead.Ref != sc.ID || dead.User != "bob" || !dead.Permanent ||
			!strings.Contains(dead.Reason, "bob, who created schedule "+sc.ID+", can no longer drive session "+string(sid)) {
			t.Errorf("dead letter = %+v", dead)
		}
		if got := e.deadLetters(ada); len(got) != 1 {
			t.Errorf("the tenant admin sees %d dead letters, want 1", len(got))
		}
		if got := e.deadLetters(carl); len(got) != 0 {
			t.Errorf("carl sees %d dead letters, want none", len(got))
		}
		if code, _ := e.req("POST", "/v1/dlq/"+dead.ID+"/retry", carl, nil); code != 404 {
			t.Errorf("carl retries bob's dead letter: %d, want 404", code)
		}
	})
	t.Run("retried by hand once access is back", func(t *testing.T) {
		e.must(200, "PUT", "/v1/sessions/"+string(sid)+"/members/bob", ann, map[string]string{"role": "driver"}, nil)
		var got struct{ ID, Status string }
		e.must(202, "POST", "/v1/dlq/"+dead.ID+"/retry", bob, nil, &got)
		if got.ID != dead.ID || got.Status != "retrying" {
			t.Errorf("retry answered %+v", got)
		}
		eventually(t, "the dead letter to go", func() bool { return len(e.deadLetters(bob)) == 0 })
		run := e.lastRun(bob, sc.ID)
		if run.Status != "ok" || run.DeadLetter != "" {
			t.Errorf("run = %+v, want ok", run)
		}
	})
	t.Run("a failed turn is a dead letter, dropped by hand", func(t *testing.T) {
		var nightly schedule.Schedule
		e.must(201, "POST", "/v1/schedules", bob, map[string]any{
			"cron": "@daily", "new": true, "title": "Nightly", "prompt": "echo broken; exit 3",
		}, &nightly)
		e.must(202, "POST", "/v1/schedules/"+nightly.ID+"/run", bob, nil, nil)
		run := e.lastRun(bob, nightly.ID)
		if run.Status != schedule.StatusDeadLetter || run.ExitCode == nil || *run.ExitCode != 3 || run.Session == "" || run.Session == sid {
			t.Fatalf("run = %+v, want a dead letter of a new session's failed turn", run)
		}
		var s session.Session
		e.must(200, "GET", "/v1/sessions/"+string(run.Session), bob, nil, &s)
		if !strings.HasPrefix(s.Title, "Nightly 20") || s.Owner != "bob" {
			t.Errorf("new session %+v, want bob's, titled Nightly <date>", s)
		}
		got := e.deadLetters(bob)
		if len(got) != 1 || !got[0].Permanent || !strings.Contains(got[0].Reason, "ended failed with exit code 3") {
			t.Fatalf("dead letters = %+v", got)
		}
		e.must(204, "DELETE", "/v1/dlq/"+got[0].ID, bob, nil, nil)
		if got := e.deadLetters(bob); len(got) != 0 {
			t.Errorf("dead letters after drop: %+v", got)
		}
	})
}

// TestAutomation_NoNodeRetriedThenByHand: with no node, a run is retried
// with backoff and ends as a dead letter whose retries were exhausted; once
// a node is up, retrying it by hand runs it.
func TestAutomation_NoNodeRetriedThenByHand(t *testing.T) {
	e := newAutomationE2E(t, true)
	bob := as("bob", "acme")
	var sc schedule.Schedule
	e.must(201, "POST", "/v1/schedules", bob, map[string]any{
		"cron": "@hourly", "new": true, "title": "Hourly", "prompt": "echo back",
	}, &sc)
	e.must(202, "POST", "/v1/schedules/"+sc.ID+"/run", bob, nil, nil)
	run := e.lastRun(bob, sc.ID)
	if run.Status != schedule.StatusDeadLetter || run.Attempts != 3 {
		t.Fatalf("run = %+v, want a dead letter after 3 attempts", run)
	}
	got := e.deadLetters(bob)
	if len(got) != 1 || got[0].Permanent || got[0].Attempts != 3 || !strings.Contains(got[0].Reason, "no node is available") {
		t.Fatalf("dead letters = %+v, want one whose retries ran out", got)
	}
	startNode(t, e.ns, time.Minute)
	e.must(202, "POST", "/v1/dlq/"+got[0].ID+"/retry", bob, nil, nil)
	eventually(t, "the dead letter to go", func() bool { return len(e.deadLetters(bob)) == 0 })
	run = e.lastRun(bob, sc.ID)
	if run.Status != "ok" || run.Session == "" {
		t.Fatalf("run = %+v, want ok", run)
	}
}

// pageAs returns the events of id as c.
func (e *env) pageAs(id session.ID, c cred) []json.RawMessage {
	e.t.Helper()
	var page struct{ Events []json.RawMessage }
	e.must(http.StatusOK, "GET", "/v1/sessions/"+string(id)+"/events?limit=1000", c, nil, &page)
	return page.Events
}
