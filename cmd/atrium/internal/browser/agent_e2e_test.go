package browser

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/session"
)

// scriptedAgent is the actor's scripted ACP agent (actor/testdata/acpagent),
// built once and installed as agent "scripted" version 1.0.0 in a directory
// of agents (Config.AgentsDir).
var scriptedAgent struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

func installScriptedAgent(t *testing.T) string {
	t.Helper()
	scriptedAgent.once.Do(func() {
		dir, err := os.MkdirTemp("", "atrium-browser-agents-")
		if err != nil {
			scriptedAgent.err = err
			return
		}
		bin := filepath.Join(dir, "scripted", "1.0.0", "acpagent")
		cmd := exec.Command("go", "build", "-o", bin, "../../../../actor/testdata/acpagent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		scriptedAgent.out, scriptedAgent.err = cmd.CombinedOutput()
		scriptedAgent.dir = dir
	})
	if scriptedAgent.err != nil {
		t.Fatalf("build the scripted ACP agent: %v: %s", scriptedAgent.err, scriptedAgent.out)
	}
	return scriptedAgent.dir
}

// TestBrowser_AgentEndToEnd drives a real agent session: the node runs the
// scripted ACP agent in a bubblewrap sandbox (the agent runtime, compute/acp)
// and two people watch it in their browsers. It checks, in both: a plan as
// a checklist, a tool call's card with its diff completed by its update, the
// agent's messages, streaming text shown before the message is final and
// replaced by it, and an approval whose options are buttons: bob's click on
// "Always allow" reaches the agent as that option.
func TestBrowser_AgentEndToEnd(t *testing.T) {
	t.Parallel()
	dir := installScriptedAgent(t)
	st := startStack(t, func(c *server.Config) {
		c.AgentsDir = dir
		c.Agents = []agents.Spec{{
			Name: "scripted", Package: "atrium-scripted-agent", Version: "1.0.0", Bin: "acpagent",
			Env:             []string{"FAKE_ACP_STATE=/workspace/.fakeacp"},
			Model:           agents.Model{API: agents.APIAnthropic},
			PermissionModes: map[agents.Mode]agents.Settings{agents.ModeAsk: {}, agents.ModeAutoEdit: {}, agents.ModeAuto: {}},
		}}
		// The scripted agent never calls its model; the node only needs a
		// provider of the agent's API family to launch it.
		c.Models = modelgw.Config{Providers: []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: "http://127.0.0.1:9", APIKey: "unused"}}}
	})
	var s session.Session
	st.api("alice", 201, "POST", "/v1/sessions", map[string]any{"title": "scripted agent", "agent": "scripted"}, &s)
	st.api("alice", 200, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "driver"}, nil)
	alice := st.open("alice")
	alice.openSession(s.ID)
	bob := st.open("bob")
	bob.openSession(s.ID)

	alice.send("plan")
	alice.send("tool")
	for _, tb := range []*tab{alice, bob} {
		tb.waitRow("the plan", ".k-plan .checklist", "step")
		tb.waitJS("the edit's card completed", `document.querySelector('.k-tool_call .tool[data-status="completed"] .diffview .dl.add')`)
		tb.waitRow("the diff's path", ".k-tool_call .diff summary", "/workspace/a.txt")
		tb.waitRow("the message after the tool call", ".k-agent_message", "Done.")
		tb.waitRow("turn 2 finished", ".k-turn_finished", "Turn 2 finished")
	}

	// A turn that waits for a cancel shows its text streaming before any
	// agent_message holds it.
	bob.send("sleep")
	for _, tb := range []*tab{alice, bob} {
		tb.waitRow("the streaming text", "#live .agent-msg.streaming", "sleeping")
	}
	if n := eval[int](alice, `[...document.querySelectorAll('.k-agent_message')].filter((e) => e.textContent.includes('sleeping')).length`); n != 0 {
		t.Fatalf("%d durable messages hold the text still streaming", n)
	}
	bob.click("#cancel-turn") // his own turn: no confirmation
	for _, tb := range []*tab{alice, bob} {
		tb.waitRow("the cancelled turn", ".k-turn_finished", "Turn 3 was cancelled")
		tb.waitRow("the durable message", ".k-agent_message", "sleeping")
		tb.waitJS("the streaming message replaced", `document.querySelectorAll('#live .agent-msg').length === 0`)
	}

	// The agent asks; bob picks one of its options.
	alice.send("ask")
	for _, tb := range []*tab{alice, bob} {
		tb.waitJS("the agent's options", `document.querySelectorAll('.k-approval_requested button[data-option]').length === 3`)
		tb.waitJS("the tab title", `document.title.startsWith('(!) Approval needed')`)
	}
	bob.click(`.k-approval_requested button[data-option="always"]`)
	for _, tb := range []*tab{alice, bob} {
		tb.waitRow("the answer", ".k-approval_requested .outcome", "Allowed by bob: Always allow")
		tb.waitRow("the agent's reply", ".k-agent_message", "chose always")
	}
	st.waitEvent("alice", s.ID, "the approval resolved with option always", func(ev event) bool {
		return ev.Kind == session.KindApprovalResolved && ev.field("option_id") == "always"
	})
	alice.checkA11y("an agent session")
}
