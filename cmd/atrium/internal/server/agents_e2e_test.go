package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// agentsCache is where .ci/deps installs the pinned agents (the layout of
// an agents directory), or ATRIUM_AGENTS_CACHE.
func agentsCache() string {
	if d := os.Getenv("ATRIUM_AGENTS_CACHE"); d != "" {
		return d
	}
	return "/var/cache/atrium-agents"
}

// requireCachedAgent skips the test loudly when the pinned agent name is
// not in the cache, and fails it in CI, where .ci/deps installs it.
func requireCachedAgent(t *testing.T, name string) {
	t.Helper()
	cat, err := agents.New(agents.Config{Dir: agentsCache()})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := cat.Spec(name)
	if in, err := cat.Lookup(name); err != nil || in.Version != spec.Version {
		msg := "SKIPPING REAL-AGENT TEST: " + name + " " + spec.Version + " is not in the agents cache " + agentsCache() + " (run .ci/deps)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// agentTurnWait bounds a real agent's turn: a cold agent start, model
// calls and tool runs, beside the other tests of the package.
const agentTurnWait = 3 * time.Minute

// waitWithin polls the session's history for up to wait until pred holds
// for an event, and returns it.
func waitWithin(c *client, id session.ID, what string, wait time.Duration, pred func(event) bool) event {
	c.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		for _, ev := range c.events(id, 0) {
			if pred(ev) {
				return ev
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("session %s: no %s within %v\n%s", id, what, wait, dump(c.events(id, 0)))
		}
		time.Sleep(100 * time.Millisecond) // Polling interval, not synchronization.
	}
}

// waitTurnWithin waits up to wait for turn_finished of turn n and returns
// its data.
func waitTurnWithin(c *client, id session.ID, n int64, wait time.Duration) session.TurnFinishedData {
	c.t.Helper()
	ev := waitWithin(c, id, "turn_finished", wait, func(ev event) bool {
		return ev.Kind == session.KindTurnFinished && ev.turn() == n
	})
	var d session.TurnFinishedData
	ev.decode(c.t, &d)
	return d
}

// TestServer_ClaudeAgent runs the real Claude Code (claude-agent-acp from
// npm, in a bubblewrap sandbox) as a session's agent through the whole
// server, its model a scripted Anthropic API behind the node's model
// gateway: a session created with {"agent":"claude"} takes a prompt, the
// agent asks to write a file, a driver approves, the file is in the
// workspace and the events show the tool call and the answer. After the
// server restarts, a second prompt continues the same conversation.
func TestServer_ClaudeAgent(t *testing.T) {
	requireCachedAgent(t, "claude")
	up := modeltest.New(t)
	up.Match(modeltest.HasTools) // Claude Code's side requests (titles) get the default answer.
	logs := &testWriter{t: t}
	t.Cleanup(logs.stop)
	cfg := server.Config{
		Listen:         "127.0.0.1:0",
		DataDir:        t.TempDir(),
		HibernateAfter: time.Hour,
		CancelGrace:    2 * time.Second,
		DrainGrace:     2 * time.Second,
		AgentsDir:      agentsCache(),
		AgentMode:      "ask",
		Models:         modelgw.Config{Providers: []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-real-upstream"}}},
		Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	start := func() *stack {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		srv, err := server.Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start server: %v", err)
		}
		return &stack{t: t, srv: srv, url: srv.URL()}
	}
	stop := func(st *stack) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		if err := st.srv.Close(ctx); err != nil {
			t.Errorf("close server: %v", err)
		}
	}

	st := start()
	ann := st.as("ann")
	var s session.Session
	ann.must(201, "POST", "/v1/sessions", map[string]any{"title": "claude", "agent": "claude"}, &s)

	up.Push(modeltest.Tool("Write", map[string]any{"file_path": "/workspace/hello.txt", "content": "hello from claude\n"}),
		modeltest.Text("I wrote hello.txt for you."))
	begin := time.Now()
	ann.prompt(s.ID, "Please write hello.txt.")
	ev := waitWithin(ann, s.ID, "approval_requested", agentTurnWait, func(ev event) bool { return ev.Kind == session.KindApprovalRequested })
	var ap session.ApprovalRequestedData
	ev.decode(t, &ap)
	if len(ap.Options) == 0 || ap.Title == "" {
		t.Errorf("approval_requested %s: want the tool call's title and the agent's options", ev.Data)
	}
	ann.approve(s.ID, ap.ID, true)
	if d := waitTurnWithin(ann, s.ID, 1, agentTurnWait); d.Status != session.TurnOK {
		t.Fatalf("turn 1 finished %+v\n%s", d, dump(ann.events(s.ID, 0)))
	}
	t.Logf("turn 1 (cold agent start, tool call, approval, answer) took %v", time.Since(begin).Round(time.Millisecond))
	evs := ann.events(s.ID, 0)
	kinds := map[session.Kind]int{}
	var message string
	for _, ev := range evs {
		kinds[ev.Kind]++
		if ev.Kind == session.KindAgentMessage {
			var m session.AgentMessageData
			ev.decode(t, &m)
			message += m.Text
		}
	}
	if kinds[session.KindToolCall] == 0 || kinds[session.KindAgentMessage] == 0 || kinds[session.KindApprovalResolved] == 0 {
		t.Errorf("turn 1 events %v: want tool_call, approval_resolved and agent_message\n%s", kinds, dump(evs))
	}
	if !strings.Contains(message, "I wrote hello.txt for you.") {
		t.Errorf("agent messages %q", message)
	}
	ws := filepath.Join(cfg.DataDir, "sandboxes", string(s.ID), "workspace", "hello.txt")
	if b, err := os.ReadFile(ws); err != nil || string(b) != "hello from claude\n" {
		t.Errorf("the workspace's hello.txt holds %q, %v", b, err)
	}
	// The agent's key was the session's token; upstream got the real key.
	for _, r := range up.Requests() {
		if got := r.Header.Get("X-Api-Key"); got != "sk-real-upstream" {
			t.Errorf("upstream request %s carried key %q, want the configured key", r.Path, got)
		}
	}

	// Claude Code writes its transcript into the agent home after it
	// answers; a server stopped before that gets a re-hydrated agent (the
	// designed fallback, seen once in CI when the restart came 130 ms after
	// the turn). This test is about load, so it restarts once the transcript
	// holds turn 1's answer.
	home := filepath.Join(cfg.DataDir, "agent-homes", string(s.ID))
	eventuallyTrue(t, 60*time.Second, "claude's transcript in "+home+" to hold turn 1's answer", func() bool {
		found := false
		filepath.WalkDir(home, func(p string, d os.DirEntry, err error) error {
			if err != nil || found || d.IsDir() || !strings.HasSuffix(p, ".jsonl") {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("I wrote hello.txt for you.")) {
				found = true
			}
			return nil
		})
		return found
	})

	// The server restarts: the second prompt goes to a new agent process,
	// which continues the conversation (session/load, or re-hydration).
	stop(st)
	st = start()
	t.Cleanup(func() { stop(st) })
	ann = st.as("ann")
	n := len(up.Requests())
	up.Push(modeltest.Text("You asked me to write hello.txt."))
	ann.prompt(s.ID, "What did I ask you before?")
	if d := waitTurnWithin(ann, s.ID, 2, agentTurnWait); d.Status != session.TurnOK {
		t.Fatalf("turn 2 finished %+v\n%s", d, dump(ann.events(s.ID, 0)))
	}
	var carried, loaded bool
	for _, r := range up.Requests()[n:] {
		if r.Scripted && bytes.Contains(r.Body, []byte("Please write hello.txt.")) {
			carried = true
			// A loaded conversation holds turn 1's messages as they
			// were, the tool call included; a re-hydrated one tells
			// of it in text.
			loaded = bytes.Contains(r.Body, []byte(`"type":"tool_use"`))
		}
	}
	if carried && !loaded {
		t.Errorf("after the restart the conversation was re-hydrated, not loaded: claude's session/load should work from its agent home")
	}
	if !carried {
		t.Errorf("after the restart the model's request does not carry the first prompt: the conversation was not continued")
	}
	var last string
	for _, ev := range ann.events(s.ID, 0) {
		if ev.Kind == session.KindAgentMessage && ev.turn() == 2 {
			var m session.AgentMessageData
			ev.decode(t, &m)
			last += m.Text
		}
	}
	if !strings.Contains(last, "You asked me to write hello.txt.") {
		t.Errorf("turn 2 agent messages %q", last)
	}
}

// TestServer_Agents runs the other built-in agents through the whole server
// in mode auto, each reaching the scripted model through the node's model
// gateway in its own API family, base URL form and key header: a tool-using
// turn writes a file in the workspace and ends with the model's answer.
func TestServer_Agents(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write modeltest.Reply
	}{
		{"codex", modeltest.Tool("exec_command", map[string]any{"cmd": "printf 'hello from the agent\\n' > /workspace/hello.txt"})},
		{"gemini", modeltest.Tool("write_file", map[string]any{"file_path": "/workspace/hello.txt", "content": "hello from the agent\n"})},
		// OpenCode is left to compute/agents' real-agent test: it takes
		// ~10 s to answer initialize on an idle machine, and a whole-server
		// run beside the other tests of this package races the runtime's
		// 30 s bound on it.
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireCachedAgent(t, tc.name)
			up := modeltest.New(t)
			up.Match(modeltest.HasTools)
			var dataDir string
			st := startStack(t, func(c *server.Config) {
				dataDir = c.DataDir
				c.AgentsDir, c.AgentMode = agentsCache(), "auto"
				c.Models.Providers = []modelgw.Provider{
					{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-ant-real"},
					{Name: "openai", Kind: modelgw.KindOpenAI, BaseURL: up.URL + "/v1", APIKey: "sk-oai-real"},
					{Name: "gemini", Kind: modelgw.KindGemini, BaseURL: up.URL, APIKey: "gm-real"},
				}
			})
			ann := st.as("ann")
			var s session.Session
			ann.must(201, "POST", "/v1/sessions", map[string]any{"title": tc.name, "agent": tc.name}, &s)
			up.Push(tc.write, modeltest.Text("Done: hello.txt is written."))
			ann.prompt(s.ID, "Please write hello.txt.")
			d := waitTurnWithin(ann, s.ID, 1, agentTurnWait)
			evs := ann.events(s.ID, 0)
			if d.Status != session.TurnOK {
				t.Fatalf("turn 1 finished %+v\n%s", d, dump(evs))
			}
			var message string
			tools := 0
			for _, ev := range evs {
				switch ev.Kind {
				case session.KindAgentMessage:
					var m session.AgentMessageData
					ev.decode(t, &m)
					message += m.Text
				case session.KindToolCall:
					tools++
				}
			}
			if tools == 0 || !strings.Contains(message, "Done: hello.txt is written.") {
				t.Errorf("%d tool calls, agent messages %q\n%s", tools, message, dump(evs))
			}
			ws := filepath.Join(dataDir, "sandboxes", string(s.ID), "workspace", "hello.txt")
			if b, err := os.ReadFile(ws); err != nil || string(b) != "hello from the agent\n" {
				t.Errorf("the workspace's hello.txt holds %q, %v", b, err)
			}
			if up.Pending() != 0 {
				t.Errorf("%d scripted replies were not asked for", up.Pending())
			}
		})
	}
}

// eventuallyTrue polls cond until it holds or the deadline passes.
func eventuallyTrue(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
