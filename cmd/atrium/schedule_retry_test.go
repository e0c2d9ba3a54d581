package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/client"
)

// TestCLI_ScheduleRetry: `atrium schedule create --retry-attempts` stores
// the schedule's retry policy, `schedule show` tells it, and the server
// refuses one beyond its limits.
func TestCLI_ScheduleRetry(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "scheduled"))
	sid := strings.TrimSpace(c.ok("schedule", "create", "--cron", "@daily", "--session", id, "--prompt", "true",
		"--retry-attempts", "3", "--retry-backoff", "1m", "--retry-max-backoff", "5m"))
	var sc client.Schedule
	if err := json.Unmarshal([]byte(c.ok("schedule", "show", sid, "--json")), &sc); err != nil || sc.Retry == nil ||
		sc.Retry.Attempts != 3 || sc.Retry.Backoff != "1m0s" || sc.Retry.MaxBackoff != "5m0s" {
		t.Fatalf("show --json: %v %+v", err, sc.Retry)
	}
	if out := c.ok("schedule", "show", sid); !strings.Contains(out, "retries   3 attempts, failed or timed-out turns too, backoff 1m0s up to 5m0s") {
		t.Errorf("show:\n%s", out)
	}
	_, errs, err := c.run(cliContext(t), nil, "schedule", "create", "--cron", "@daily", "--session", id, "--prompt", "true",
		"--retry-attempts", "3", "--retry-backoff", "10m", "--retry-max-backoff", "1m")
	if err == nil || !strings.Contains(err.Error()+errs, "retry.max_backoff 1m0s is shorter than retry.backoff 10m0s") {
		t.Errorf("a cap below the backoff: %v %s", err, errs)
	}
}
