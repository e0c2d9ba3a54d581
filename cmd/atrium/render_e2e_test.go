package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/session"
)

// startAgentStack runs the real stack with one agent, "scripted": the
// actor's scripted ACP agent (actor/testdata/acpagent), run in bubblewrap
// sandboxes by the agent runtime.
func startAgentStack(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap is missing: run .ci/deps")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "scripted", "1.0.0", "acpagent"), "../../actor/testdata/acpagent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the scripted agent: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := server.Start(ctx, server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), AgentsDir: dir,
		Agents: []agents.Spec{{
			Name: "scripted", Package: "atrium-scripted-agent", Version: "1.0.0", Bin: "acpagent",
			Env:             []string{"FAKE_ACP_STATE=/workspace/.fakeacp"},
			Model:           agents.Model{API: agents.APIAnthropic},
			PermissionModes: map[agents.Mode]agents.Settings{agents.ModeAsk: {}},
		}},
		// The scripted agent never calls its model; launching it needs a
		// provider of its API family.
		Models: modelgw.Config{Providers: []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: "http://127.0.0.1:9", APIKey: "unused"}}},
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
	return srv.URL()
}

// newScriptedSession creates a session of the "scripted" agent on the
// stack at url as alice and returns its id.
func newScriptedSession(t *testing.T, url string) session.ID {
	t.Helper()
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
	return s.ID
}

// TestCLI_AgentAttachAndLogs: attach shows an agent's turn as it happens —
// its text streaming in after "agent>", a tool call's title, status and diff
// stat, its completion, the agent's options when it asks — and logs shows the
// same events one line each, the message whole.
func TestCLI_AgentAttachAndLogs(t *testing.T) {
	url := startAgentStack(t)
	c := newCLI(t, url)
	id := newScriptedSession(t, url)

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var out, errs lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(cliContext(t), []string{"attach", string(id)}, stdinR, &out, &errs, c.getenv)
	}()
	eventually(t, "attached", func() bool { return strings.Contains(errs.String(), "attached to "+string(id)) })

	io.WriteString(stdinW, "chunks 6\n")
	defer func() {
		if t.Failed() {
			t.Logf("attach's stdout:\n%s\nstderr:\n%s", out.String(), errs.String())
		}
	}()
	eventually(t, "the streamed answer", func() bool {
		return strings.Contains(out.String(), "agent> w0 w1 w2 w3 w4 w5") && strings.Contains(out.String(), "-- turn 1 ok")
	})
	io.WriteString(stdinW, "tool\n")
	eventually(t, "the tool call", func() bool {
		return strings.Contains(out.String(), "⚙ [edit] Edit a.txt (pending) · /workspace/a.txt +1 −1") &&
			strings.Contains(out.String(), "call-1 → completed") && strings.Contains(out.String(), "agent> Done.")
	})
	io.WriteString(stdinW, "ask\n")
	eventually(t, "the agent's options", func() bool {
		return strings.Contains(out.String(), "the agent offers: allow (Allow), always (Always allow), reject (Reject)")
	})
	io.WriteString(stdinW, "/deny "+approvalID(t, out.String())+"\n")
	eventually(t, "the agent's reply", func() bool { return strings.Contains(out.String(), "-- turn 3 ok") })
	stdinW.Close()
	if err := <-done; err != nil {
		t.Fatalf("attach: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), `"type"`) || strings.Contains(out.String(), `{"`) {
		t.Errorf("attach printed raw JSON:\n%s", out.String())
	}

	logs := c.ok("logs", string(id))
	for _, want := range []string{"agent_message", "w0 w1 w2 w3 w4 w5", "[edit] Edit a.txt (pending) · /workspace/a.txt +1 −1", "call-1 → completed", "options: allow (Allow)"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lacks %q:\n%s", want, logs)
		}
	}
}

// approvalID returns the id in attach's "?? approval ID requested" line.
func approvalID(t *testing.T, out string) string {
	t.Helper()
	_, rest, ok := strings.Cut(out, "?? approval ")
	if !ok {
		t.Fatalf("no approval request in:\n%s", out)
	}
	return strings.Fields(rest)[0]
}
