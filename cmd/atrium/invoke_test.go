package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
)

func TestCLI_Invoke(t *testing.T) {
	server := startRealStack(t)
	c := newCLI(t, server)
	id := strings.TrimSpace(c.ok("new", "--title", "invoke"))

	out, errs, err := c.run(cliContext(t), nil, "invoke", id, "echo out; echo err >&2; exit 3")
	if exitCode(err) != 3 || out != "out\n" || !strings.Contains(errs, "err\n") {
		t.Fatalf("invoke of 'exit 3': exit %d (%v), stdout %q, stderr %q", exitCode(err), err, out, errs)
	}
	if out := c.ok("invoke", id, "echo fine"); out != "fine\n" {
		t.Fatalf("invoke ok: stdout %q", out)
	}

	// --json: one event per line, start first and exit last.
	out = c.ok("invoke", id, "echo json", "--json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var evs []struct {
		Event string         `json:"event"`
		Data  map[string]any `json:"data"`
	}
	for _, l := range lines {
		var ev struct {
			Event string         `json:"event"`
			Data  map[string]any `json:"data"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("--json line %q: %v", l, err)
		}
		evs = append(evs, ev)
	}
	if len(evs) != 3 || evs[0].Event != "start" || evs[0].Data["turn"] != float64(3) ||
		evs[1].Event != "stdout" || evs[1].Data["text"] != "json\n" ||
		evs[2].Event != "exit" || evs[2].Data["status"] != "ok" {
		t.Fatalf("--json:\n%s", out)
	}

	// Ctrl-C cancels the turn.
	ctx, cancel := context.WithCancel(cliContext(t))
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan error, 1)
	go func() { // owned: the test waits on done.
		done <- run(ctx, []string{"invoke", id, "echo started; sleep 60"}, strings.NewReader(""), stdout, stderr, c.getenv)
	}()
	eventually(t, "the turn's output", func() bool { return stdout.String() == "started\n" })
	cancel()
	if err := <-done; exitCode(err) != exitCancelled {
		t.Fatalf("interrupted invoke: %v, want exit %d", err, exitCancelled)
	}
	api := sdk(t, server, "alice")
	eventually(t, "turn 4 to finish cancelled", func() bool {
		page, err := api.Events(cliContext(t), session.ID(id), 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Events {
			var d session.TurnFinishedData
			if ev.Kind == session.KindTurnFinished && json.Unmarshal(ev.Data, &d) == nil && d.Turn == 4 {
				if d.Status != session.TurnCancelled {
					t.Fatalf("turn 4 finished %s, want cancelled", d.Status)
				}
				return true
			}
		}
		return false
	})

	// Usage mistakes.
	if _, _, err := c.run(cliContext(t), nil, "invoke", id); exitCode(err) != 2 {
		t.Fatalf("invoke without TEXT: %v", err)
	}
	_, _, err = c.run(cliContext(t), nil, "invoke", "s_nosuchsession", "true")
	if err == nil || !strings.Contains(err.Error(), "atrium ls") {
		t.Fatalf("invoke of an unknown session: %v", err)
	}
}

// Over a quota the command fails at once with the server's message.
func TestCLI_InvokeQuota(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap is not installed: run .ci/deps (make test does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := server.Start(ctx, server.Config{
		Listen: "127.0.0.1:0", DataDir: t.TempDir(), Quotas: gateway.Quotas{TurnsPerHour: 1},
	})
	if err != nil {
		t.Fatalf("start the stack: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("close the stack: %v", err)
		}
	})
	c := newCLI(t, srv.URL())
	id := strings.TrimSpace(c.ok("new", "--title", "quota"))
	c.ok("invoke", id, "true")
	out, _, err := c.run(cliContext(t), nil, "invoke", id, "echo never")
	if exitCode(err) != 1 || out != "" || !strings.Contains(err.Error(), "limit of 1 turns per hour") || !strings.Contains(err.Error(), "hint:") {
		t.Fatalf("invoke over the quota: %v (stdout %q)", err, out)
	}
}
