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
