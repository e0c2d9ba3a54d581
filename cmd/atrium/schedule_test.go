package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/client"
)

// TestCLI_Schedule: `atrium schedule` against the real stack: create, list,
// run now and wait, pause, resume, delete.
func TestCLI_Schedule(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "scheduled"))

	out, errs, err := c.run(cliContext(t), nil, "schedule", "create", "--cron", "0 9 * * 1-5", "--tz", "Europe/Paris",
		"--session", id, "--prompt", "echo from-the-schedule")
	sid := strings.TrimSpace(out)
	if err != nil || !strings.HasPrefix(sid, "sc_") {
		t.Fatalf("create: %v, printed %q, want a schedule id", err, out)
	}
	if !strings.Contains(errs, "next run ") || !strings.Contains(errs, " 09:00 CE") { // CET or CEST: Paris time
		t.Errorf("create said %q, want the next run at 09:00 Paris time", errs)
	}
	if out := c.ok("schedule", "ls"); !strings.Contains(out, sid) || !strings.Contains(out, "0 9 * * 1-5") || !strings.Contains(out, "Europe/Paris") {
		t.Errorf("schedule ls = %q", out)
	}
	var list []client.Schedule
	if err := json.Unmarshal([]byte(c.ok("schedule", "ls", "--json")), &list); err != nil || len(list) != 1 || list[0].ID != sid || list[0].Creator != "alice" {
		t.Fatalf("schedule ls --json: %v %+v", err, list)
	}

	out, errs, err = c.run(cliContext(t), nil, "schedule", "run", sid, "--wait")
	if err != nil || !strings.Contains(out, "last run") || !strings.Contains(out, ": ok (exit code 0)") || !strings.Contains(errs, "is running") {
		t.Fatalf("schedule run --wait: %v\nstdout: %s\nstderr: %s", err, out, errs)
	}
	if out, _, err := c.run(cliContext(t), nil, "logs", id); err != nil || !strings.Contains(out, "from-the-schedule") {
		t.Errorf("the session's logs do not show the run: %v %q", err, out)
	}

	if out := c.ok("schedule", "pause", sid); !strings.Contains(out, "paused") {
		t.Errorf("pause = %q", out)
	}
	var sc client.Schedule
	if err := json.Unmarshal([]byte(c.ok("schedule", "show", sid, "--json")), &sc); err != nil || !sc.Paused || sc.NextRun != nil {
		t.Errorf("show after pause: %v %+v", err, sc)
	}
	if out := c.ok("schedule", "resume", sid); !strings.Contains(out, "resumed: next run") {
		t.Errorf("resume = %q", out)
	}
	c.ok("schedule", "delete", sid)
	_, _, err = c.run(cliContext(t), nil, "schedule", "show", sid)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "atrium schedule ls") {
		t.Errorf("show after delete: %v, want not found with a hint", err)
	}
	if _, errs, _ := c.run(cliContext(t), nil, "schedule", "ls"); !strings.Contains(errs, "no schedules") {
		t.Errorf("ls of none: %q", errs)
	}
}

func TestCLI_ScheduleUsage(t *testing.T) {
	c := newCLI(t, "http://127.0.0.1:1")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no cron":      {[]string{"schedule", "create", "--session", "s_1", "--prompt", "x"}, "--cron is required"},
		"no prompt":    {[]string{"schedule", "create", "--cron", "@daily", "--session", "s_1"}, "--prompt is required"},
		"no target":    {[]string{"schedule", "create", "--cron", "@daily", "--prompt", "x"}, "--session ID"},
		"both targets": {[]string{"schedule", "create", "--cron", "@daily", "--session", "s_1", "--new", "--prompt", "x"}, "not both"},
		"title alone":  {[]string{"schedule", "create", "--cron", "@daily", "--session", "s_1", "--title", "t", "--prompt", "x"}, "needs --new"},
		"show no id":   {[]string{"schedule", "show"}, "takes 1 argument"},
		"retry no id":  {[]string{"dlq", "retry"}, "takes 1 argument"},
		"ls with args": {[]string{"dlq", "ls", "x"}, "takes no arguments"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := c.run(cliContext(t), nil, tc.args...)
			if exitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("atrium %s: %v, want a usage error saying %q", strings.Join(tc.args, " "), err, tc.want)
			}
		})
	}
	for _, name := range [][]string{{"schedule", "create"}, {"schedule", "ls"}, {"schedule", "run"}, {"dlq", "ls"}, {"dlq", "retry"}, {"dlq", "drop"}} {
		out := c.ok(append(name, "--help")...)
		for _, want := range []string{"Examples:", "--server", "--token"} {
			if !strings.Contains(out, want) {
				t.Errorf("atrium %s --help does not mention %q", strings.Join(name, " "), want)
			}
		}
	}
}
