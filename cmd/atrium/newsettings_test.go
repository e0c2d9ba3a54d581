package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestCLI_NewSettings: `atrium new --set KEY=VALUE` creates the session
// with those settings (shown by `atrium settings`); a setting the server
// refuses is named and creates no session.
func TestCLI_NewSettings(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	var created session.Session
	out := c.ok("new", "--title", "set", "--set", "turn_timeout=1m", "--set", "setup=echo ready", "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.Settings == nil ||
		created.Settings.TurnTimeout != "1m0s" || created.Settings.Setup != "echo ready" {
		t.Fatalf("new --set: %s (%v)", out, err)
	}
	if out := c.ok("settings", string(created.ID)); !strings.Contains(out, "turn_timeout: 1m0s\n") || !strings.Contains(out, "setup: echo ready") {
		t.Errorf("settings of the new session = %q", out)
	}
	for args, want := range map[string]string{
		"--set colour=red":          "unknown settings: colour",
		"--set nokey":               "want KEY=VALUE",
		"--set title=x":             "give the title with --title",
		"--set pids=-1":             "want a number",
		"--set turn_timeout=48h":    "beyond this server's limit",
		"--set memory_bytes=64GiB":  "limit of 2147483648 (sandbox.memory_bytes)",
		"--set permission_mode=ask": "permission_mode is for agent sessions",
	} {
		if _, _, err := c.run(cliContext(t), nil, append([]string{"new"}, strings.Fields(args)...)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("new %s: %v, want %q", args, err, want)
		}
	}
	if lines := strings.Split(strings.TrimSpace(c.ok("ls")), "\n"); len(lines) != 2 {
		t.Errorf("refused creates left sessions:\n%s", strings.Join(lines, "\n"))
	}
}
