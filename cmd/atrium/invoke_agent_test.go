package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestCLI_InvokeAgent: invoke of an agent session prints the agent's final
// message to stdout, its earlier message and tool calls readably to stderr,
// and --json passes the agent events through.
func TestCLI_InvokeAgent(t *testing.T) {
	url := startAgentStack(t)
	c := newCLI(t, url)
	req, _ := http.NewRequestWithContext(cliContext(t), "POST", url+"/v1/sessions", strings.NewReader(`{"title":"agent","agent":"scripted"}`))
	req.Header.Set("Authorization", "Bearer dev:alice")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var s session.Session
	err = json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create an agent session: %d %v", resp.StatusCode, err)
	}
	id := string(s.ID)

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
