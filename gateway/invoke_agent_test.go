package gateway_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats-server/v2/server"
)

// scriptedAgent builds the actor's scripted ACP agent
// (actor/testdata/acpagent) once.
var scriptedAgent struct {
	once sync.Once
	dir  string
	err  error
}

func scriptedAgentDir(t testing.TB) string {
	t.Helper()
	scriptedAgent.once.Do(func() {
		dir, err := os.MkdirTemp("", "atrium-gw-acpagent-")
		if err != nil {
			scriptedAgent.err = err
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "acpagent"), "../actor/testdata/acpagent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			scriptedAgent.err = err
			t.Logf("go build: %s", out)
			return
		}
		scriptedAgent.dir = dir
	})
	if scriptedAgent.err != nil {
		t.Fatalf("build the scripted agent: %v", scriptedAgent.err)
	}
	return scriptedAgent.dir
}

// scriptedAgents is a node's Agents catalog of one agent, "fake": the
// scripted ACP agent.
type scriptedAgents struct{ dir string }

func (f scriptedAgents) Check(name string) error {
	if name != "fake" {
		return session.Errorf(session.CodeBadRequest, "agent %s is not installed on this node; run: atrium agents install %s", name, name)
	}
	return nil
}

func (f scriptedAgents) Launch(name string, _ session.ID, ep compute.ModelEndpoints, _ string) (actor.AgentLaunch, error) {
	if err := f.Check(name); err != nil {
		return actor.AgentLaunch{}, err
	}
	return actor.AgentLaunch{
		Argv:   []string{"/opt/fakeagent/acpagent"},
		Env:    []string{"FAKE_ACP_STATE=/workspace/.fakeacp", "FAKE_TOKEN=" + ep.Token},
		Mounts: []compute.Mount{{Host: f.dir, Sandbox: "/opt/fakeagent", ReadOnly: true}},
	}, nil
}

// startAgentNode is startNode with the scripted agent installed as "fake".
func startAgentNode(t testing.TB, ns *server.Server) {
	t.Helper()
	startNodeWith(t, ns, func(c *actor.Config) { c.Agents = scriptedAgents{dir: scriptedAgentDir(t)} })
}

// TestInvoke_AgentEvents: an invoke of an agent session streams the agent
// kinds of its turn, named by kind with the event's data, between start and
// exit.
func TestInvoke_AgentEvents(t *testing.T) {
	ns := startNATS(t)
	startAgentNode(t, ns)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	code, body := e.call("POST", "/v1/sessions", "alice", map[string]any{"title": "agent invoke", "agent": "fake"})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var s session.Session
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("decode session: %v", err)
	}

	evs := mustInvoke(t, e.srv.URL, s.ID, "alice", "tool").untilExit()
	if evs[0].name != "start" {
		t.Fatalf("first event %s %s, want start", evs[0].name, evs[0].data)
	}
	var names []string
	var messages []string
	var call session.ToolCallData
	var update session.ToolCallUpdateData
	for _, ev := range evs[1 : len(evs)-1] {
		names = append(names, ev.name)
		switch ev.name {
		case "agent_message":
			var d session.AgentMessageData
			if err := json.Unmarshal(ev.data, &d); err != nil || d.Turn != 1 {
				t.Fatalf("agent_message data %s: %v", ev.data, err)
			}
			messages = append(messages, d.Text)
		case "tool_call":
			if err := json.Unmarshal(ev.data, &call); err != nil {
				t.Fatalf("tool_call data %s: %v", ev.data, err)
			}
		case "tool_call_update":
			if err := json.Unmarshal(ev.data, &update); err != nil {
				t.Fatalf("tool_call_update data %s: %v", ev.data, err)
			}
		}
	}
	if got := strings.Join(names, " "); got != "agent_message tool_call tool_call_update agent_message" {
		t.Fatalf("events between start and exit: %s", got)
	}
	if strings.Join(messages, "|") != "Editing a.txt.|Done." {
		t.Fatalf("messages %q", messages)
	}
	if call.ID != "call-1" || call.Title != "Edit a.txt" || call.Kind != "edit" || call.Turn != 1 {
		t.Fatalf("tool_call %+v", call)
	}
	if update.ID != "call-1" || update.Status != "completed" {
		t.Fatalf("tool_call_update %+v", update)
	}
	if code, status := exitOf(t, evs[len(evs)-1]); code != 0 || status != session.TurnOK {
		t.Fatalf("exit %d %s, want 0 ok", code, status)
	}

	// A plan, in the session's second turn.
	evs = mustInvoke(t, e.srv.URL, s.ID, "alice", "plan").untilExit()
	if len(evs) != 3 || evs[1].name != "plan" {
		t.Fatalf("plan invoke: %q", evs)
	}
	var plan session.PlanData
	if err := json.Unmarshal(evs[1].data, &plan); err != nil || plan.Turn != 2 || len(plan.Entries) != 1 || plan.Entries[0].Content != "step" {
		t.Fatalf("plan data %s: %v", evs[1].data, err)
	}
}
