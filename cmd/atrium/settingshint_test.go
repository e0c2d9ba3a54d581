package main

import (
	"strings"
	"testing"
)

// TestCLI_SettingsLimitHints: a setting beyond the operator's limits is
// refused with the limit named and a hint about the limit, never the hint
// for a missing role (the caller owns the session).
func TestCLI_SettingsLimitHints(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "limits"))
	for args, want := range map[string]string{
		`egress=["github.com"]`: "ask them to add it to sandbox.egress_permit",
		"turn_timeout=48h":      "choose a value within the limit",
	} {
		_, _, err := c.run(cliContext(t), nil, "settings", id, "--set", args)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "atrium share") {
			t.Errorf("settings --set %s: %v, want a hint containing %q", args, err, want)
		}
	}
	if _, _, err := c.run(cliContext(t), nil, "egress", "set", id, "github.com"); err == nil ||
		!strings.Contains(err.Error(), "(sandbox.egress_permit)\n  hint: a session may allow only hosts") {
		t.Errorf("egress set beyond the permit list: %v", err)
	}
}

// TestCLI_SettingsHarness: `atrium settings ID --set harness=JSON` shows the
// harness back, and so does `atrium settings ID`.
func TestCLI_SettingsHarness(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "harness"))
	const want = `harness: command ["bash","-c","cat"] (stdin text)` + "\n"
	if out := c.ok("settings", id, "--set", `harness={"command":["bash","-c","cat"],"stdin":"text"}`); !strings.Contains(out, want) {
		t.Errorf("settings --set harness = %q, want %q", out, want)
	}
	if out := c.ok("settings", id); !strings.Contains(out, want) {
		t.Errorf("settings = %q, want %q", out, want)
	}
}
