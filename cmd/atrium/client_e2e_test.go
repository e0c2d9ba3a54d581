package main

import (
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// startRealStack runs the whole in-process deployment (embedded NATS, node
// with SQLite histories and bubblewrap sandboxes, gateway) on a free port.
func startRealStack(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		tb.Skip("bubblewrap is not installed (make test installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := server.Start(ctx, server.Config{Listen: "127.0.0.1:0", DataDir: tb.TempDir()})
	if err != nil {
		tb.Fatalf("start the stack: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			tb.Errorf("close the stack: %v", err)
		}
	})
	return srv.URL()
}

func TestCLI_RealStack(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "real"))

	out, errs, err := c.run(cliContext(t), nil, "send", id, "echo to stdout; echo to stderr >&2", "--wait")
	if err != nil || out != "to stdout\n" || !strings.Contains(errs, "to stderr\n") {
		t.Fatalf("send --wait: err %v, stdout %q, stderr %q", err, out, errs)
	}
	_, _, err = c.run(cliContext(t), nil, "send", id, "exit 3", "--wait")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "turn 2 failed (exit code 3)") {
		t.Fatalf("send --wait of 'exit 3' = %v, want exit 1 naming status and exit code", err)
	}

	// logs --json is one server event per line, seqs 1, 2, 3 …
	lines := strings.Split(strings.TrimSpace(c.ok("logs", id, "--json")), "\n")
	for i, line := range lines {
		var ev session.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Seq != session.Seq(i+1) {
			t.Fatalf("logs --json line %d = %s (%v)", i+1, line, err)
		}
	}
	if human := c.ok("logs", id); !strings.Contains(human, "turn 2 failed (exit 3") || !strings.Contains(human, "to stdout") {
		t.Fatalf("logs:\n%s", human)
	}
	if table := c.ok("ls"); !strings.Contains(table, id) || !strings.Contains(table, "real") {
		t.Fatalf("ls:\n%s", table)
	}

	// attach: type a prompt, see its output, detach with EOF.
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var aout, aerr lockedBuffer
	done := make(chan error, 1)
	go func() { done <- run(cliContext(t), []string{"attach", id}, stdinR, &aout, &aerr, c.getenv) }()
	eventually(t, "attached", func() bool { return strings.Contains(aerr.String(), "attached to "+id) })
	io.WriteString(stdinW, "echo typed in attach\n")
	eventually(t, "the typed prompt's output", func() bool {
		return strings.Contains(aout.String(), "typed in attach\n") && strings.Contains(aout.String(), "turn 3 ok")
	})
	eventually(t, "the ack", func() bool { return strings.Contains(aerr.String(), "✓ prompt queued as seq") })
	stdinW.Close()
	if err := <-done; err != nil {
		t.Fatalf("attach: %v", err)
	}

	c.ok("rm", id)
	if _, _, err := c.run(cliContext(t), nil, "logs", id); exitCode(err) != 1 || !strings.Contains(err.Error(), "atrium ls") {
		t.Fatalf("logs after rm = %v", err)
	}
}

// TestCLI_FailedTurnSaysWhy is issue 23's `send --wait` that printed only
// "turn 1 failed (exit code -1)" when a turn could not start: send --wait,
// invoke and attach now print the turn's last error and exit non-zero.
func TestCLI_FailedTurnSaysWhy(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "broken", "--command", `["/nonexistent/harness"]`))
	evs := func() string { return c.ok("logs", id) }
	_, _, err := c.run(cliContext(t), nil, "send", id, "hello", "--wait")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "turn 1 failed") {
		t.Fatalf("send --wait = %v, want exit 1 and turn 1 failed\nlogs:\n%s", err, evs())
	}
	const why = "the harness could not be run"
	if !strings.Contains(err.Error(), "turn 1 failed (exit code 127): "+why) {
		t.Fatalf("send --wait = %q, want the reason\nlogs:\n%s", err, evs())
	}
	_, _, err = c.run(cliContext(t), nil, "invoke", id, "again")
	if exitCode(err) != 127 || !strings.Contains(err.Error(), why) {
		t.Fatalf("invoke = %v, want exit 127 and the reason", err)
	}
	// attach: a prompt typed, its turn fails while attached, then Ctrl-D.
	stdinR, stdinW := io.Pipe()
	var aout, aerr lockedBuffer
	done := make(chan error, 1)
	go func() { done <- run(cliContext(t), []string{"attach", id}, stdinR, &aout, &aerr, c.getenv) }()
	eventually(t, "attached", func() bool { return strings.Contains(aerr.String(), "attached to "+id) })
	io.WriteString(stdinW, "once more\n")
	eventually(t, "the failed turn", func() bool { return strings.Contains(aout.String(), "turn 3 failed") })
	if out := aout.String(); !strings.Contains(out[strings.Index(out, "turn 3 failed"):], "could not be run") {
		t.Fatalf("attach shows the failure without its reason:\n%s", out)
	}
	stdinW.Close()
	if err := <-done; exitCode(err) != 1 {
		t.Fatalf("attach after a failed turn = %v, want exit 1", err)
	}
}
