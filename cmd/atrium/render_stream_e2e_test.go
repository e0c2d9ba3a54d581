package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestCLI_AttachStreamsDeltas: attach prints an agent's text as its deltas
// arrive, before the durable agent_message exists (the scripted agent says
// "sleeping" and waits for a cancel; the message ends with the turn), and
// does not print it again when the message comes. `logs --json` prints the
// server's events unchanged.
func TestCLI_AttachStreamsDeltas(t *testing.T) {
	url := startAgentStack(t)
	c := newCLI(t, url)
	id := string(newScriptedSession(t, url))

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var out, errs lockedBuffer
	done := make(chan error, 1)
	go func() { done <- run(cliContext(t), []string{"attach", id}, stdinR, &out, &errs, c.getenv) }()
	defer func() {
		if t.Failed() {
			t.Logf("attach's stdout:\n%s\nstderr:\n%s", out.String(), errs.String())
		}
	}()
	eventually(t, "attached", func() bool { return strings.Contains(errs.String(), "attached to "+id) })

	io.WriteString(stdinW, "sleep\n")
	eventually(t, "the streamed text", func() bool { return strings.Contains(out.String(), "agent> sleeping") })
	if logs := c.ok("logs", id); strings.Contains(logs, "agent_message") {
		t.Fatalf("attach showed the text from a durable message, not its deltas; logs:\n%s", logs)
	}
	io.WriteString(stdinW, "/cancel\n")
	eventually(t, "the cancelled turn", func() bool { return strings.Contains(out.String(), "-- turn 1 cancelled") })
	eventually(t, "the durable message", func() bool { return strings.Contains(c.ok("logs", id), "agent_message") })
	stdinW.Close()
	<-done
	if n := strings.Count(out.String(), "sleeping"); n != 1 {
		t.Errorf("attach printed the text %d times, want once", n)
	}

	// --json: one server event per line, as the server sent it.
	for _, line := range strings.Split(strings.TrimSpace(c.ok("logs", id, "--json")), "\n") {
		var ev session.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Seq == 0 || ev.Kind == "" {
			t.Fatalf("logs --json line %q: %v", line, err)
		}
		if ev.Kind == session.KindAgentMessage && !strings.Contains(line, `"text":"sleeping"`) {
			t.Errorf("logs --json agent_message %q", line)
		}
	}
}
