package main

import (
	"bytes"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// killAgentTurnWait bounds a real agent's turn in a subprocess server: a
// cold agent start (or session/load) and a model call.
const killAgentTurnWait = 3 * time.Minute

// agentsCacheDir is where .ci/deps installs the pinned agents, or
// ATRIUM_AGENTS_CACHE.
func agentsCacheDir() string {
	if d := os.Getenv("ATRIUM_AGENTS_CACHE"); d != "" {
		return d
	}
	return "/var/cache/atrium-agents"
}

// TestDev_ClaudeAgentKill9 runs `atrium dev` as a real process with the real
// Claude Code as a session's agent, its model a scripted Anthropic API
// configured as the config file's models.providers entry (the key from
// api_key_env). Two turns, then SIGKILL of the server, a restart on the same
// data dir, and a third prompt: the model's request for turn 3 carries turn
// 1's prompt, so the conversation continued across the kill -9.
func TestDev_ClaudeAgentKill9(t *testing.T) {
	requireClaude(t)
	up := modeltest.New(t)
	up.Match(modeltest.HasTools) // Claude Code's side requests (titles) get the default answer.

	dir := t.TempDir()
	data := agentDataDir(t, dir) // The node's agents directory is <data>/agents: the cached install.
	cfg := writeConfig(t, anthropicModels(t, up.URL, "sk-kill9-upstream"))

	p := startDev(t, data, "--config", cfg)
	a := api{t: t, base: p.url, user: "ann"}
	var s session.Session
	a.must(http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": "claude", "agent": "claude"}, &s)

	turn := func(a api, n int64, prompt, reply string) {
		t.Helper()
		up.Push(modeltest.Text(reply))
		a.prompt(s.ID, prompt)
		fin := waitTurnFor(a, s.ID, n, killAgentTurnWait)
		if fin.field("status") != string(session.TurnOK) {
			t.Fatalf("turn %d: %s, want ok", n, fin.raw)
		}
		var got string
		for _, ev := range a.events(s.ID) {
			if ev.Kind == session.KindAgentMessage && ev.turn() == n {
				got += ev.field("text")
			}
		}
		if !strings.Contains(got, reply) {
			t.Fatalf("turn %d agent messages %q, want %q", n, got, reply)
		}
	}
	begin := time.Now()
	turn(a, 1, "Remember the word periwinkle.", "I will remember periwinkle.")
	turn(a, 2, "Now remember the number 42.", "Noted: 42.")
	t.Logf("turns 1 and 2 took %v", time.Since(begin).Round(time.Millisecond))

	p.signal(syscall.SIGKILL)
	if code := p.wait(); code != -1 {
		t.Fatalf("killed atrium dev exited with %d", code)
	}

	p2 := startDev(t, data, "--config", cfg)
	a2 := api{t: t, base: p2.url, user: "ann"}
	n := len(up.Requests())
	begin = time.Now()
	turn(a2, 3, "What did I ask you two turns ago?", "You asked me to remember periwinkle.")
	t.Logf("turn 3 after kill -9 took %v", time.Since(begin).Round(time.Millisecond))

	var carried, loaded bool
	for _, r := range up.Requests()[n:] {
		if r.Scripted && bytes.Contains(r.Body, []byte("Remember the word periwinkle.")) {
			carried = true
			// A re-hydrated conversation opens the new prompt with
			// the transcript's marker (actor/agent_turn.go); a loaded
			// one holds the earlier turns as the model's own messages.
			loaded = !bytes.Contains(r.Body, []byte("could not load this conversation")) &&
				bytes.Contains(r.Body, []byte("I will remember periwinkle."))
			t.Logf("turn 3's model request carries turn 1's prompt; session/load: %v", loaded)
		}
		if got := r.Header.Get("X-Api-Key"); got != "sk-kill9-upstream" {
			t.Errorf("upstream request %s carried key %q, want the configured key", r.Path, got)
		}
	}
	if !carried {
		t.Fatalf("after kill -9 the model's request for turn 3 does not carry turn 1's prompt: the conversation was not continued")
	}
	if !loaded {
		t.Errorf("after kill -9 the conversation was re-hydrated, not loaded: claude's session/load should work from its agent home")
	}
}

// waitTurnFor returns the turn_finished event of turn n, polling up to wait.
func waitTurnFor(a api, id session.ID, n int64, wait time.Duration) e2eEvent {
	a.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		for _, ev := range a.events(id) {
			if ev.Kind == session.KindTurnFinished && ev.turn() == n {
				return ev
			}
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("session %s: no turn_finished of turn %d within %v", id, n, wait)
		}
		time.Sleep(100 * time.Millisecond) // Polling interval, not synchronization.
	}
}
