package actor

import (
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestHost_SettingsSandboxLimits: a session's own memory limit, within the
// node's, applies when its sandbox is next opened (a turn that allocates
// beyond it fails naming the memory limit, while the node's would allow
// it); beyond the node's limit, or on a node that sets none, it is
// forbidden naming the setting. The Session object shows it back.
func TestHost_SettingsSandboxLimits(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SandboxSpec.MemoryBytes, c.SandboxSpec.Pids = 1<<30, 256 })
	id := e.create("alice", shell())
	w := e.watch(id)
	n := func(v int64) *int64 { return &v }
	i := func(v int) *int { return &v }
	rep := e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{MemoryBytes: n(2 << 30)}})
	wantCode(t, "beyond", rep, session.CodeForbidden, "memory_bytes 2147483648 is beyond this server's limit of 1073741824 (sandbox.memory_bytes)")
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Pids: i(1000)}})
	wantCode(t, "pids beyond", rep, session.CodeForbidden, "(sandbox.pids)")
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{MemoryBytes: n(-1)}})
	wantCode(t, "negative", rep, session.CodeBadRequest, "must not be negative")

	// The first turn runs with the node's 1 GiB: 300 MB fit.
	const alloc = "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo survived ${#x}"
	e.prompt(id, "alice", alloc)
	if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(1))); fin.Status != session.TurnOK {
		t.Fatalf("turn 1 with the node's limit: %+v%s", fin, summarize(w.evs))
	}
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{MemoryBytes: n(64 << 20), Pids: i(128)}})
	if rep.Error != nil || rep.Session == nil || rep.Session.Settings == nil ||
		rep.Session.Settings.MemoryBytes != 64<<20 || rep.Session.Settings.Pids != 128 {
		t.Fatalf("settings reply %+v", rep)
	}
	e.prompt(id, "alice", alloc)
	if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(2))); fin.Status != session.TurnFailed {
		t.Fatalf("turn 2 with the session's 64 MiB: %+v, want failed", fin)
	}
	found := false
	for _, ev := range w.evs {
		if ev.Kind == session.KindError && strings.Contains(data[session.ErrorData](t, ev).Message, "memory limit") {
			found = true
		}
	}
	if !found {
		t.Errorf("no error event naming the memory limit:%s", summarize(w.evs))
	}
	if info := e.cmd(id, "alice", session.Command{Op: session.OpInfo}); info.Session == nil || info.Session.Settings == nil || info.Session.Settings.MemoryBytes != 64<<20 {
		t.Errorf("info: %+v", info.Session)
	}
	// Back to the node's (0): the allocation fits again.
	e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{MemoryBytes: n(0), Pids: i(0)}})
	e.prompt(id, "alice", alloc)
	if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(3))); fin.Status != session.TurnOK {
		t.Fatalf("turn 3 back at the node's limit: %+v", fin)
	}
	if info := e.cmd(id, "alice", session.Command{Op: session.OpInfo}); info.Session == nil || info.Session.Settings != nil {
		t.Errorf("info without settings of its own shows %+v", info.Session.Settings)
	}

	unlimited := newEnv(t)
	other := unlimited.create("alice", shell())
	rep = unlimited.cmd(other, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{MemoryBytes: n(64 << 20)}})
	wantCode(t, "no node limit", rep, session.CodeForbidden, "sets no limit a session may choose within (sandbox.memory_bytes)")
}

// TestAgent_SettingsMCPServers: the session's MCP servers reach the agent
// in session/new, a change restarts the agent, which loads its session with
// the new servers; an http server whose host the sandbox may not reach is
// forbidden naming the egress allowlist; env values never show in the
// Session object.
func TestAgent_SettingsMCPServers(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: true}
	e := newEnv(t, withAgents(agents, &fakeModels{}), func(c *Config) { c.SandboxSpec.Egress = []string{"mcp.example.com"} })
	id := e.create("alice", agentSession())
	w := e.watch(id)
	set := func(l []session.MCPServer) session.Reply {
		return e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{MCPServers: &l}})
	}
	rep := set([]session.MCPServer{{Name: "far", Type: session.MCPHTTP, URL: "https://elsewhere.example.org/mcp"}})
	wantCode(t, "unreachable", rep, session.CodeForbidden, "elsewhere.example.org:443 is not in the session's egress allowlist")
	rep = set([]session.MCPServer{{Name: "a b", Command: "x"}})
	wantCode(t, "bad name", rep, session.CodeBadRequest, "name must be")
	rep = set([]session.MCPServer{
		{Name: "files", Command: "/bin/mcp-files", Env: []session.NameValue{{Name: "TOKEN", Value: "s3cret"}}},
		{Name: "docs", Type: session.MCPHTTP, URL: "https://mcp.example.com/mcp"},
	})
	if rep.Error != nil || rep.Session == nil || rep.Session.Settings == nil || len(rep.Session.Settings.MCPServers) != 2 {
		t.Fatalf("settings reply %+v", rep)
	}
	if got := rep.Session.Settings.MCPServers[0].Env; len(got) != 1 || got[0].Value != session.RedactedValue {
		t.Errorf("the Session object shows env %+v, want the value hidden", got)
	}
	if fin := agentRun(t, e, w, id, 1, "mcp"); fin.Status != session.TurnOK {
		t.Fatalf("turn 1: %+v", fin)
	}
	if got := lastMessage(t, turnEvents(t, w, 1)); got != "mcp: files(stdio:/bin/mcp-files) docs(http)" {
		t.Errorf("turn 1: the agent got %q", got)
	}
	rep = set([]session.MCPServer{{Name: "only", Command: "/bin/only"}})
	if rep.Error != nil {
		t.Fatalf("settings: %+v", rep.Error)
	}
	if fin := agentRun(t, e, w, id, 2, "mcp"); fin.Status != session.TurnOK {
		t.Fatalf("turn 2: %+v", fin)
	}
	if got := lastMessage(t, turnEvents(t, w, 2)); got != "mcp: only(stdio:/bin/only)" {
		t.Errorf("turn 2: the agent got %q", got)
	}
	if n := agents.launches.Load(); n != 2 {
		t.Errorf("agent launched %d times, want twice (restarted for the new servers)", n)
	}
	for _, ev := range w.evs {
		if strings.Contains(string(ev.Data), "s3cret") {
			t.Errorf("an event carries the MCP server's env value: %s", ev.Data)
		}
	}
	plain := e.create("alice", shell())
	l := []session.MCPServer{{Name: "x", Command: "x"}}
	rep = e.cmd(plain, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{MCPServers: &l}})
	wantCode(t, "no agent", rep, session.CodeBadRequest, "mcp_servers are for agent sessions")
}

// TestAgent_SettingsAgentAndEgress: settings.agent switches the session to
// another installed agent, started at the next turn and given the
// conversation from the history (it cannot load the other agent's
// session); an agent that is not installed is refused naming the install
// command. settings.egress replaces the session's own allowlist within the
// operator's permit list, in the same patch as an http MCP server on the
// newly allowed host.
func TestAgent_SettingsAgentAndEgress(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: true}
	e := newEnv(t, withAgents(agents, &fakeModels{}), func(c *Config) { c.EgressPermit = []string{"*.example.com"} })
	id := e.create("alice", agentSession())
	w := e.watch(id)
	if fin := agentRun(t, e, w, id, 1, "hello there"); fin.Status != session.TurnOK {
		t.Fatalf("turn 1: %+v", fin)
	}
	str := func(s string) *string { return &s }
	rep := e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Agent: str("nope")}})
	wantCode(t, "not installed", rep, session.CodeBadRequest, "atrium agents install nope")
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Agent: str("fake2")}})
	if rep.Error != nil || rep.Session == nil || rep.Session.Settings == nil || rep.Session.Settings.Agent != "fake2" {
		t.Fatalf("switch agent: %+v", rep)
	}
	if fin := agentRun(t, e, w, id, 2, "recall"); fin.Status != session.TurnOK {
		t.Fatalf("turn 2: %+v", fin)
	}
	if got := agents.lastName.Load(); got == nil || *got != "fake2" {
		t.Errorf("turn 2 launched %v, want fake2", got)
	}
	if got := lastMessage(t, turnEvents(t, w, 2)); !strings.Contains(got, "User alice: hello there") {
		t.Errorf("the new agent was not given the conversation: %q", got)
	}

	egress := []string{"docs.example.com"}
	mcp := []session.MCPServer{{Name: "docs", Type: session.MCPHTTP, URL: "https://docs.example.com/mcp"}}
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Egress: &egress, MCPServers: &mcp}})
	if rep.Error != nil || rep.Session == nil || len(rep.Session.Egress) != 1 || rep.Session.Settings == nil || len(rep.Session.Settings.MCPServers) != 1 {
		t.Fatalf("egress and mcp_servers: %+v", rep)
	}
	bad := []string{"evil.test"}
	rep = e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &session.SettingsPatch{Egress: &bad}})
	wantCode(t, "egress not permitted", rep, session.CodeForbidden, "sandbox.egress_permit")
}

// TestAgent_SettingsHarness: settings.harness turns an agent session into a
// shell session (the agent process stops; the next turn runs the shell
// template) and back into an agent session (a new agent, given the
// conversation from the history); an unknown template is refused by name,
// and a harness without an agent refuses the session's MCP servers.
func TestAgent_SettingsHarness(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: true}
	e := newEnv(t, withAgents(agents, &fakeModels{}))
	id := e.create("alice", agentSession())
	w := e.watch(id)
	if fin := agentRun(t, e, w, id, 1, "hello there"); fin.Status != session.TurnOK {
		t.Fatalf("turn 1: %+v", fin)
	}
	set := func(p session.SettingsPatch) session.Reply {
		return e.cmd(id, "alice", session.Command{Op: session.OpSettings, Settings: &p})
	}
	wantCode(t, "unknown template", set(session.SettingsPatch{Harness: &session.Harness{Template: "nope"}}), session.CodeBadRequest, `harness template "nope" is not configured`)
	mcp := []session.MCPServer{{Name: "files", Command: "/bin/true"}}
	if rep := set(session.SettingsPatch{MCPServers: &mcp}); rep.Error != nil {
		t.Fatalf("mcp_servers: %+v", rep.Error)
	}
	wantCode(t, "mcp without agent", set(session.SettingsPatch{Harness: &session.Harness{Template: "shell"}}), session.CodeBadRequest, "takes no mcp_servers")
	none := []session.MCPServer{}
	rep := set(session.SettingsPatch{Harness: &session.Harness{Template: "shell"}, MCPServers: &none})
	if rep.Error != nil || rep.Session == nil || rep.Session.Settings != nil {
		t.Fatalf("to shell: %+v (settings %+v)", rep.Error, rep.Session)
	}
	e.prompt(id, "alice", "echo from the shell")
	if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(2))); fin.Status != session.TurnOK {
		t.Fatalf("turn 2: %+v%s", fin, summarize(w.evs))
	}
	var out string
	for _, ev := range w.evs {
		if ev.Kind == session.KindOutput {
			if d := data[session.OutputData](t, ev); d.Turn == 2 && d.Stream == "stdout" {
				out += d.Text
			}
		}
	}
	if out != "from the shell\n" {
		t.Errorf("turn 2 stdout %q", out)
	}
	if rep := set(session.SettingsPatch{Harness: &session.Harness{Agent: "fake"}}); rep.Error != nil || rep.Session.Settings == nil || rep.Session.Settings.Agent != "fake" {
		t.Fatalf("back to the agent: %+v", rep)
	}
	if fin := agentRun(t, e, w, id, 3, "recall"); fin.Status != session.TurnOK {
		t.Fatalf("turn 3: %+v", fin)
	}
	if got := lastMessage(t, turnEvents(t, w, 3)); !strings.Contains(got, "User alice: hello there") {
		t.Errorf("turn 3's new agent was not given the conversation: %q", got)
	}
	if n := agents.launches.Load(); n != 2 {
		t.Errorf("agent launched %d times, want twice", n)
	}
}
