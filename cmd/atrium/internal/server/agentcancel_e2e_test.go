package server_test

import (
	"bytes"
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

// TestServer_AgentCancel cancels a real agent's turn while the command it
// runs is still running (DESIGN §6: codex-acp 0.16 leaves a cancelled
// command running in its own process group; claude-agent-acp 0.23 answers
// later prompts with stale replies). The turn ends cancelled, the command
// is gone from the host soon after (not left to finish), and the next
// prompt gets the model's next answer, not a stale one, in the same
// conversation (the turn-1 prompt reaches the model again).
func TestServer_AgentCancel(t *testing.T) {
	for _, tc := range []struct {
		name, sleep string
		run         func(cmd string) modeltest.Reply
	}{
		{"claude", "sleep 317", func(cmd string) modeltest.Reply {
			return modeltest.Tool("Bash", map[string]any{"command": cmd, "description": "Run the slow command"})
		}},
		{"codex", "sleep 318", func(cmd string) modeltest.Reply {
			return modeltest.Tool("exec_command", map[string]any{"cmd": cmd})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireCachedAgent(t, tc.name)
			up := modeltest.New(t)
			up.Match(modeltest.HasTools)
			st := startStack(t, func(c *server.Config) {
				c.AgentsDir, c.AgentMode = agentsCache(), "auto"
				c.CancelGrace = 2 * time.Second
				c.Models.Providers = []modelgw.Provider{
					{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-ant-real"},
					{Name: "openai", Kind: modelgw.KindOpenAI, BaseURL: up.URL + "/v1", APIKey: "sk-oai-real"},
				}
			})
			ann := st.as("ann")
			var s session.Session
			ann.must(201, "POST", "/v1/sessions", map[string]any{"title": tc.name, "agent": tc.name}, &s)

			// The command outlives the test unless something stops it;
			// the file it would leave says so to a later look.
			cmd := tc.sleep + " && touch /workspace/late"
			up.Push(tc.run(cmd), modeltest.Text("stale: the slow command finished."))
			ann.prompt(s.ID, "Run the slow command for me.")
			eventuallyTrue(t, agentTurnWait, "the agent's command ("+tc.sleep+") running on the host", func() bool {
				return len(processesWith(tc.sleep)) > 0
			})
			cancelled := time.Now()
			ann.must(202, "POST", "/v1/sessions/"+string(s.ID)+"/cancel", nil, nil)
			if d := waitTurnWithin(ann, s.ID, 1, agentTurnWait); d.Status != session.TurnCancelled {
				t.Fatalf("turn 1 finished %+v, want cancelled\n%s", d, dump(ann.events(s.ID, 0)))
			}
			eventuallyTrue(t, 20*time.Second, "the cancelled command gone from the host", func() bool {
				return len(processesWith(tc.sleep)) == 0
			})
			t.Logf("cancel → turn cancelled and its command gone: %v", time.Since(cancelled).Round(time.Millisecond))

			up.Reset()
			up.Push(modeltest.Text("fresh: you asked me to run the slow command."))
			begin := time.Now()
			ann.prompt(s.ID, "What did I ask you to do?")
			d := waitTurnWithin(ann, s.ID, 2, agentTurnWait)
			t.Logf("turn 2 (a new agent process, session/load, the answer): %v", time.Since(begin).Round(time.Millisecond))
			evs := ann.events(s.ID, 0)
			if d.Status != session.TurnOK {
				t.Fatalf("turn 2 finished %+v\n%s", d, dump(evs))
			}
			var message string
			for _, ev := range evs {
				if ev.Kind == session.KindAgentMessage && ev.turn() == 2 {
					var m session.AgentMessageData
					ev.decode(t, &m)
					message += m.Text
				}
			}
			if !strings.Contains(message, "fresh: you asked me to run the slow command.") || strings.Contains(message, "stale") {
				t.Errorf("turn 2's agent messages %q, want the model's answer to turn 2 alone", message)
			}
			carried := false
			for _, r := range up.Requests() {
				if r.Scripted && bytes.Contains(r.Body, []byte("What did I ask you to do?")) {
					carried = bytes.Contains(r.Body, []byte("Run the slow command for me."))
				}
			}
			if !carried {
				t.Errorf("turn 2's model request does not carry turn 1's prompt: the conversation was not continued after the cancel")
			}
		})
	}
}

// processesWith returns the pids of this machine's processes whose command
// line contains s.
func processesWith(s string) []string {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []string
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})), s) {
			pids = append(pids, filepath.Base(d))
		}
	}
	return pids
}
