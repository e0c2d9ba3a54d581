package server_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// TestServer_ClaudeAgentHomeMoves runs the real Claude Code on node a, stops
// a, and continues the session on node b, which has a fresh data directory
// (no agent home, no sandbox, no history file) and shares only NATS and the
// object store with a: the agent's home was saved with the session when a
// put the sandbox to sleep (after Claude Code had time to exit and write its
// transcript), so b restores it and the agent resumes by session/load, not
// by re-hydration from the history.
func TestServer_ClaudeAgentHomeMoves(t *testing.T) {
	requireCachedAgent(t, "claude")
	up := modeltest.New(t)
	up.Match(modeltest.HasTools)
	_, url := startNATSServer(t)
	objects := t.TempDir()
	dirs := map[string]string{}
	node := func(id string) *stack {
		return startStack(t, func(c *server.Config) {
			dirs[id] = c.DataDir
			c.NodeID = id
			c.NATS.URLs = []string{url}
			c.Storage = server.Storage{Type: server.StorageDir, Dir: objects}
			c.AgentsDir, c.AgentMode = agentsCache(), "auto"
			c.Models.Providers = []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-real-upstream"}}
		})
	}

	a := node("node-a")
	ann := a.as("ann")
	var s session.Session
	ann.must(201, "POST", "/v1/sessions", map[string]any{"title": "claude moves", "agent": "claude"}, &s)
	up.Push(modeltest.Tool("Write", map[string]any{"file_path": "/workspace/hello.txt", "content": "hello from claude\n"}),
		modeltest.Text("I wrote hello.txt for you."))
	ann.prompt(s.ID, "Please write hello.txt.")
	if d := waitTurnWithin(ann, s.ID, 1, agentTurnWait); d.Status != session.TurnOK {
		t.Fatalf("turn 1 finished %+v\n%s", d, dump(ann.events(s.ID, 0)))
	}

	// Node a stops right after the turn (no waiting for the transcript:
	// the sleep before the stop lets the agent exit and write it).
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := a.srv.Close(ctx); err != nil {
		t.Fatalf("close node a: %v", err)
	}
	if kind, ok := transcriptHolds(filepath.Join(dirs["node-a"], "agent-homes", string(s.ID)), "I wrote hello.txt for you."); !ok {
		t.Fatalf("after node a stopped, claude's transcript in its agent home does not hold turn 1's answer (%s)", kind)
	}

	b := node("node-b")
	bHome := filepath.Join(dirs["node-b"], "agent-homes", string(s.ID))
	if _, err := os.Stat(bHome); !os.IsNotExist(err) {
		t.Fatalf("node b holds an agent home for the session before it ran it: %v", err)
	}
	ann = b.as("ann")
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
			// A loaded conversation holds turn 1's tool call as it was;
			// a re-hydrated one tells of it in text.
			loaded = bytes.Contains(r.Body, []byte(`"type":"tool_use"`))
		}
	}
	if !carried {
		t.Fatalf("on node b the model's request does not carry the first prompt: the conversation was not continued")
	}
	if !loaded {
		t.Fatalf("on node b the conversation was re-hydrated, not loaded: the agent home did not move with the session\n%s", dump(ann.events(s.ID, 0)))
	}
	if _, ok := transcriptHolds(bHome, "You asked me to write hello.txt."); !ok {
		// Written after the answer: poll.
		eventuallyTrue(t, 60*time.Second, "claude's transcript on node b to hold turn 2's answer", func() bool {
			_, ok := transcriptHolds(bHome, "You asked me to write hello.txt.")
			return ok
		})
	}
	ws := filepath.Join(dirs["node-b"], "sandboxes", string(s.ID), "workspace", "hello.txt")
	if got, err := os.ReadFile(ws); err != nil || string(got) != "hello from claude\n" {
		t.Errorf("node b's workspace hello.txt holds %q, %v", got, err)
	}
}

// transcriptHolds reports whether a .jsonl file under home contains text;
// what says what was found when it does not.
func transcriptHolds(home, text string) (what string, ok bool) {
	var files []string
	filepath.WalkDir(home, func(p string, d os.DirEntry, err error) error {
		if err != nil || ok || d.IsDir() || !strings.HasSuffix(p, ".jsonl") {
			return nil
		}
		files = append(files, p)
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(text)) {
			ok = true
		}
		return nil
	})
	return strings.Join(files, ", "), ok
}
