package main

import (
	"strings"
	"testing"
)

// TestCLI_SendWaitAgent: `atrium send --wait` on an agent session prints
// what the agent did — its tool calls as notes on stderr and its messages
// on stdout — not nothing (the README's agent tour follows turns with it).
func TestCLI_SendWaitAgent(t *testing.T) {
	url := startAgentStack(t)
	c := newCLI(t, url)
	s := newScriptedSession(t, url)

	out, errs, err := c.run(cliContext(t), nil, "send", string(s), "tool", "--wait")
	if err != nil {
		t.Fatalf("send --wait: %v\nstdout: %s\nstderr: %s", err, out, errs)
	}
	if !strings.Contains(out, "Done.") {
		t.Errorf("send --wait's stdout lacks the agent's message %q:\n%s", "Done.", out)
	}
	if !strings.Contains(errs, "[edit] Edit a.txt") || !strings.Contains(errs, "call-1 → completed") {
		t.Errorf("send --wait's stderr lacks the tool call and its completion:\n%s", errs)
	}
	if strings.Contains(out+errs, `{"`) {
		t.Errorf("send --wait printed raw JSON:\nstdout: %s\nstderr: %s", out, errs)
	}
}

// TestCLI_ApproveOption: `atrium approve --option` answers an agent's
// request with the option named, which reaches the agent; an option the
// agent did not offer is refused; --option and --deny do not go together.
func TestCLI_ApproveOption(t *testing.T) {
	url := startAgentStack(t)
	c := newCLI(t, url)
	id := strings.TrimSpace(c.ok("new", "--agent", "scripted", "--title", "options"))

	done := make(chan error, 1)
	var out, errs string
	go func() {
		var err error
		out, errs, err = c.run(cliContext(t), nil, "send", id, "ask", "--wait")
		done <- err
	}()
	if _, _, err := c.run(cliContext(t), nil, "approve", id, "t1-p1", "--option", "nope"); err == nil {
		t.Errorf("approve --option nope succeeded: the agent offered no such option")
	}
	if _, _, err := c.run(cliContext(t), nil, "approve", id, "t1-p1", "--option", "always", "--deny"); err == nil {
		t.Errorf("approve --option with --deny succeeded")
	}
	if got := c.ok("approve", id, "t1-p1", "--option", "always"); !strings.Contains(got, "t1-p1 answered with option always") {
		t.Errorf("approve --option printed %q", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("send --wait: %v\nstdout: %s\nstderr: %s", err, out, errs)
	}
	if !strings.Contains(out, "chose always") {
		t.Errorf("the agent's answer %q, want it to have got option always", out)
	}
	if logs := c.ok("logs", id); !strings.Contains(logs, "with option always") {
		t.Errorf("logs do not show the approval resolved with option always:\n%s", logs)
	}
}
