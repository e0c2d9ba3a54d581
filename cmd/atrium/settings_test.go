package main

import (
	"strings"
	"testing"
)

// TestCLI_Settings: `atrium rename` and `atrium settings` against the real
// stack; the rename shows in `atrium ls`; bad keys and values are refused
// with the server's message.
func TestCLI_Settings(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "before"))
	if out := c.ok("rename", id, "after rename"); out != "title: after rename\n" {
		t.Errorf("rename = %q", out)
	}
	if out := c.ok("ls"); !strings.Contains(out, "after rename") || strings.Contains(out, "before") {
		t.Errorf("ls after rename = %q", out)
	}
	if out := c.ok("settings", id, "--set", "title=via settings"); out != "title: via settings\n" {
		t.Errorf("settings --set title = %q", out)
	}
	if out := c.ok("settings", id); out != "title: via settings\n" {
		t.Errorf("settings = %q", out)
	}
	if out := c.ok("settings", id, "--set", "turn_timeout=1m"); !strings.Contains(out, "turn_timeout: 1m (from the next turn)") {
		t.Errorf("settings --set turn_timeout = %q", out)
	}
	for args, want := range map[string]string{
		"--set colour=red":           "unknown settings: colour",
		"--set permission_mode=ask":  "permission_mode is for agent sessions",
		"--set permission_mode=yolo": `not "yolo"`,
		"--set nokey":                "want KEY=VALUE",
		"--set turn_timeout=48h":     "beyond this server's limit",
		"--set memory_bytes=lots":    "want a size such as",
		"--set pids=-1":              "want a number",
		"--set mcp_servers=[oops":    "mcp_servers: not JSON",
		"--set memory_bytes=64GiB":   "limit of 2147483648 (sandbox.memory_bytes)",
		"--set disk_bytes=lots":      "want a size such as",
		"--set disk_bytes=1MiB":      "disk_bytes 1048576 is too small",
		"--set disk_bytes=2GiB":      "sandbox.workspace_disk_bytes",
	} {
		if _, _, err := c.run(cliContext(t), nil, append([]string{"settings", id}, strings.Fields(args)...)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("settings %s: %v, want %q", args, err, want)
		}
	}
	if out := c.ok("settings", id, "--set", "setup=echo ready > /workspace/ready"); !strings.Contains(out, "setup: echo ready > /workspace/ready") {
		t.Errorf("settings --set setup = %q", out)
	}
	if out := c.ok("settings", id); !strings.Contains(out, "turn_timeout: 1m0s\n") || !strings.Contains(out, "setup: echo ready") {
		t.Errorf("settings shows %q, want the session's own settings", out)
	}
	if out := c.ok("settings", "--help"); !strings.Contains(out, "permission_mode") || !strings.Contains(out, "next time the agent is") {
		t.Errorf("settings --help = %q", out)
	}
}
