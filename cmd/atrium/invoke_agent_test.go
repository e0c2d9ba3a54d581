package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCLI_InvokeAgent: invoke of an agent session prints the agent's final
// message to stdout, its earlier message and tool calls readably to stderr,
// and --json passes the agent events through.
func TestCLI_InvokeAgent(t *testing.T) {
	url := startAgentStack(t)
	c := newCLI(t, url)
	id := string(newScriptedSession(t, url))

	out, errs, err := c.run(cliContext(t), nil, "invoke", id, "tool")
	if err != nil || out != "Done.\n" {
		t.Fatalf("invoke tool: %v, stdout %q (want the final message), stderr %q", err, out, errs)
	}
	for _, want := range []string{"agent> Editing a.txt.", "⚙ [edit] Edit a.txt (pending)", "call-1 → completed"} {
		if !strings.Contains(errs, want) {
			t.Fatalf("stderr %q: want %q", errs, want)
		}
	}
	if strings.Contains(errs, "Done.") || strings.Contains(out+errs, `{"`) {
		t.Fatalf("stdout %q, stderr %q: the final message once, on stdout, no raw JSON", out, errs)
	}

	out = c.ok("invoke", id, "plan", "--json")
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev struct {
			Event string          `json:"event"`
			Data  json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("--json line %q: %v", l, err)
		}
		names = append(names, ev.Event)
	}
	if strings.Join(names, " ") != "start plan exit" || !strings.Contains(out, `"content":"step"`) {
		t.Fatalf("--json of a plan:\n%s", out)
	}
}
