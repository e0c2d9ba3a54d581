package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/client"
)

// TestCLI_DLQ: a scheduled run whose turn fails becomes a dead letter;
// `atrium dlq` lists it, a retry that fails again keeps it with the new
// reason, a retry after the cause is fixed removes it, and drop deletes one.
func TestCLI_DLQ(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "flaky"))
	sid := strings.TrimSpace(c.ok("schedule", "create", "--cron", "@daily", "--session", id,
		"--prompt", "test -f ready || { echo not ready; exit 3; }"))

	_, _, err := c.run(cliContext(t), nil, "schedule", "run", sid, "--wait")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "the run failed") || !strings.Contains(err.Error(), "atrium dlq retry dl_") {
		t.Fatalf("schedule run --wait: %v, want a failure naming its dead letter", err)
	}
	dead := regexp.MustCompile(`dl_[a-z0-9]+`).FindString(err.Error())

	out := c.ok("dlq", "ls")
	if !strings.Contains(out, dead) || !strings.Contains(out, "schedule") || !strings.Contains(out, sid) || !strings.Contains(out, "permanent") ||
		!strings.Contains(out, "exit code 3") {
		t.Errorf("dlq ls = %q", out)
	}
	var list []client.DeadLetter
	if err := json.Unmarshal([]byte(c.ok("dlq", "ls", "--json")), &list); err != nil || len(list) != 1 || list[0].ID != dead || list[0].User != "alice" {
		t.Fatalf("dlq ls --json: %v %+v", err, list)
	}

	_, _, err = c.run(cliContext(t), nil, "dlq", "retry", dead, "--wait")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "the retry failed") || !strings.Contains(err.Error(), "atrium dlq drop "+dead) {
		t.Fatalf("dlq retry --wait (still failing): %v", err)
	}
	if err := json.Unmarshal([]byte(c.ok("dlq", "ls", "--json")), &list); err != nil || len(list) != 1 || list[0].Attempts != 2 {
		t.Fatalf("after a failed retry: %v %+v, want the entry with 2 attempts", err, list)
	}

	// The cause is fixed: the retry runs the prompt again and succeeds.
	c.ok("send", id, "touch ready", "--wait")
	if out := c.ok("dlq", "retry", dead, "--wait"); !strings.Contains(out, "it succeeded") {
		t.Errorf("dlq retry --wait = %q", out)
	}
	if _, errs, _ := c.run(cliContext(t), nil, "dlq", "ls"); !strings.Contains(errs, "no dead letters") {
		t.Errorf("dlq ls after the retry: %q", errs)
	}

	// Another failure, dropped by hand.
	c.ok("send", id, "rm ready", "--wait")
	if _, _, err := c.run(cliContext(t), nil, "schedule", "run", sid, "--wait", "--json"); exitCode(err) != 1 {
		t.Fatalf("schedule run --wait: %v, want a failure", err)
	}
	if err := json.Unmarshal([]byte(c.ok("dlq", "ls", "--json")), &list); err != nil || len(list) != 1 {
		t.Fatalf("dlq ls --json: %v %+v, want the new dead letter", err, list)
	}
	if out := c.ok("dlq", "drop", list[0].ID); !strings.Contains(out, "dropped") {
		t.Errorf("dlq drop = %q", out)
	}
	_, _, err = c.run(cliContext(t), nil, "dlq", "drop", list[0].ID)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "atrium dlq ls") {
		t.Errorf("drop twice: %v, want not found with a hint", err)
	}
}
