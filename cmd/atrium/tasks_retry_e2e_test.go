package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/gateway/task"
	"github.com/atriumhq/atrium/session"
)

// flaky is a shell prompt whose turn fails the first time and succeeds the
// next: the marker lives in .git, which persists in the workspace and is
// never committed.
const flaky = `test -f .git/tried || { touch .git/tried; echo "first try fails" >&2; exit 1; }; echo retried > RETRIED`

// TestTasks_RetryPolicy: with --retry-attempts a task whose turn failed is
// tried again in the same session and opens its pull request; without a
// policy the same failure is final (a permanent dead letter). Each run's end
// is an audit entry with the tries it took.
func TestTasks_RetryPolicy(t *testing.T) {
	st := startTaskStack(t, forge.TypeGitHub)
	alice := api{t: t, base: st.srv.URL(), user: "alice"}
	log, err := audit.New(audit.Config{NATS: st.srv.NATS()})
	if err != nil {
		t.Fatal(err)
	}
	auditOf := func(taskID string) audit.Entry {
		t.Helper()
		es, _, err := log.List(context.Background(), "", audit.Filter{Action: task.ActRun, Actor: "alice"})
		if err != nil {
			t.Fatalf("read the audit log: %v", err)
		}
		for _, e := range es {
			if e.Target == taskID {
				return e
			}
		}
		t.Fatalf("no %s audit entry of %s in %+v", task.ActRun, taskID, es)
		return audit.Entry{}
	}

	t.Run("retried under the policy", func(t *testing.T) {
		out, errs, err := st.alice.run(cliContext(t), nil, "task", "run", "--repo", st.repo, "--title", "Flaky",
			"--retry-attempts", "2", "--retry-backoff", "10ms", "--json", flaky)
		if err != nil {
			t.Fatalf("task run: %v\n%s\n%s", err, out, errs)
		}
		var got struct {
			ID       string
			Status   string
			Attempts int
			Branch   string
			Session  session.ID
			Retry    struct{ Attempts int }
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("--json output %q: %v", out, err)
		}
		if got.Status != "pr_opened" || got.Attempts != 2 || got.Retry.Attempts != 2 {
			t.Fatalf("task %+v, want pr_opened after 2 attempts under a 2-attempt policy", got)
		}
		if v := st.git.Git("acme/widgets", "show", got.Branch+":RETRIED"); v != "retried" {
			t.Errorf("RETRIED on the branch = %q", v)
		}
		if n := len(st.events(t, got.Session, "turn_finished")); n != 2 {
			t.Errorf("%d turns in the session, want 2 (one failed, one retried)", n)
		}
		if e := auditOf(got.ID); e.Outcome != audit.OK || e.Session != string(got.Session) ||
			!strings.Contains(e.Detail, "pr_opened after 2 attempt(s)") || strings.Contains(e.Detail, "tried") {
			t.Errorf("audit entry %+v", e)
		}
		show := st.alice.ok("task", "show", got.ID)
		if !strings.Contains(show, "2 attempts, failed or timed-out turns too") || !strings.Contains(show, "2 attempt(s) made") {
			t.Errorf("task show:\n%s", show)
		}
	})

	t.Run("no policy: a failed turn is final", func(t *testing.T) {
		var started struct{ Task string }
		alice.must(http.StatusAccepted, "POST", "/v1/tasks", map[string]any{"repo": st.repo, "base": "main", "prompt": flaky}, &started)
		got := st.waitTask(t, "alice", started.Task)
		if got["status"] != "failed" || got["attempts"] != float64(1) {
			t.Fatalf("task %v, want failed after 1 attempt", got)
		}
		e, err := st.cfg.Tasks.Service.DLQ.Get(context.Background(), got["dead_letter"].(string))
		if err != nil || !e.Permanent {
			t.Fatalf("dead letter %+v, %v: want a permanent one", e, err)
		}
		if a := auditOf(started.Task); a.Outcome != audit.Failed || !strings.Contains(a.Detail, "dead letter "+e.ID) {
			t.Errorf("audit entry %+v", a)
		}
	})

	t.Run("bad policy", func(t *testing.T) {
		code, body := alice.do("POST", "/v1/tasks", map[string]any{"repo": st.repo, "base": "main", "prompt": "true",
			"retry": map[string]any{"attempts": 50}})
		if code != http.StatusBadRequest || !strings.Contains(string(body), "retry.attempts must be from 1 to 10") {
			t.Errorf("50 attempts: %d %s", code, body)
		}
		_, errs, err := st.alice.run(cliContext(t), nil, "task", "run", "--repo", st.repo, "--retry-backoff", "1m", "true")
		if err == nil || !strings.Contains(err.Error()+errs, "need --retry-attempts") {
			t.Errorf("--retry-backoff alone: %v %s", err, errs)
		}
	})
}
