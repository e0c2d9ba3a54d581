package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestPatchSession: the owner renames an agent session and sets its
// permission mode; the rename shows in GET /v1/sessions and GET
// /v1/sessions/{id}; drivers and viewers get 403 with the error shape;
// unknown settings are named in a 400; permission_mode is refused on a
// session without an agent.
func TestPatchSession(t *testing.T) {
	ns := startNATS(t)
	startAgentNode(t, ns)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	create := func(body any) session.Session {
		t.Helper()
		code, b := e.call("POST", "/v1/sessions", "alice", body)
		if code != http.StatusCreated {
			t.Fatalf("create: %d %s", code, b)
		}
		var s session.Session
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := create(map[string]any{"title": "before", "agent": "fake", "settings": map[string]any{"permission_mode": "auto"}})
	path := "/v1/sessions/" + string(s.ID)
	e.member(s.ID, "alice", "bob", session.RoleDriver)
	e.member(s.ID, "alice", "carol", session.RoleViewer)

	for _, who := range []string{"bob", "carol"} {
		code, body := e.call("PATCH", path, who, `{"title":"mine"}`)
		if code != http.StatusForbidden || errCode(t, body) != session.CodeForbidden {
			t.Errorf("%s renames: %d %s", who, code, body)
		}
	}
	for name, c := range map[string]struct{ body, want string }{
		"unknown settings":    {`{"settings":{"colour":"red","permission_mode":"ask","budget":1}}`, "unknown settings: budget, colour (known: harness, agent, permission_mode, turn_timeout, memory_bytes, pids, disk_bytes, egress, mcp_servers, setup, invoke_concurrency)"},
		"mcp server shape":    {`{"settings":{"mcp_servers":[{"name":"x","cmd":"y"}]}}`, `unknown field "cmd"`},
		"mcp server type":     {`{"settings":{"mcp_servers":[{"name":"x","type":"ws","url":"wss://h/"}]}}`, `type must be "stdio", "http" or "sse", not "ws"`},
		"mcp without url":     {`{"settings":{"mcp_servers":[{"name":"x","type":"http"}]}}`, "needs an http:// or https:// url"},
		"negative memory":     {`{"settings":{"memory_bytes":-5}}`, "memory_bytes must be a number of bytes"},
		"pids not a number":   {`{"settings":{"pids":"many"}}`, "pids must be a number"},
		"disk too small":      {`{"settings":{"disk_bytes":1048576}}`, "disk_bytes 1048576 is too small: at least 16777216"},
		"negative disk":       {`{"settings":{"disk_bytes":-1}}`, "disk_bytes must be a number of bytes"},
		"setup not a string":  {`{"settings":{"setup":["pip","install"]}}`, "setup must be a shell command string"},
		"harness shape":       {`{"settings":{"harness":{"command":"ls"}}}`, "settings: harness must be"},
		"harness mode":        {`{"settings":{"harness":{"agent":"fake","permission_mode":"ask"}}}`, `as "permission_mode", not inside "harness"`},
		"agent not a name":    {`{"settings":{"agent":""}}`, "agent must name an installed agent"},
		"agent not installed": {`{"settings":{"agent":"nope"}}`, "atrium agents install nope"},
		"egress not a list":   {`{"settings":{"egress":"github.com"}}`, "egress must be a list of hosts"},
		"unknown field":       {`{"name":"x"}`, `unknown field "name"`},
		"bad mode":            {`{"settings":{"permission_mode":"yolo"}}`, `not "yolo"`},
		"mode not a string":   {`{"settings":{"permission_mode":1}}`, "must be a string"},
		"long title":          {`{"title":"` + strings.Repeat("t", session.MaxTitleBytes+1) + `"}`, "title is longer than"},
		"nothing":             {`{}`, `body needs "title"`},
	} {
		code, body := e.call("PATCH", path, "alice", c.body)
		var eb session.ErrorBody
		if code != http.StatusBadRequest || json.Unmarshal(body, &eb) != nil || eb.Error == nil ||
			eb.Error.Code != session.CodeBadRequest || !strings.Contains(eb.Error.Message, c.want) {
			t.Errorf("%s: %d %s, want 400 containing %q", name, code, body, c.want)
		}
	}
	plain := create(map[string]any{"title": "plain"})
	if code, body := e.call("PATCH", "/v1/sessions/"+string(plain.ID), "alice", `{"settings":{"permission_mode":"ask"}}`); code != http.StatusBadRequest || !strings.Contains(string(body), "agent sessions") {
		t.Errorf("mode of a session without an agent: %d %s", code, body)
	}

	code, body := e.call("PATCH", path, "alice", `{"settings":{"turn_timeout":"2h"}}`)
	var eb session.ErrorBody
	if code != http.StatusForbidden || json.Unmarshal(body, &eb) != nil || eb.Error == nil || !strings.Contains(eb.Error.Message, "limit of 30m0s (node.turn_timeout)") {
		t.Errorf("turn_timeout beyond the node's: %d %s", code, body)
	}
	if code, body := e.call("PATCH", path, "alice", `{"settings":{"turn_timeout":"soon"}}`); code != http.StatusBadRequest {
		t.Errorf("turn_timeout soon: %d %s", code, body)
	}
	code, body = e.call("PATCH", path, "alice", `{"title":"after","settings":{"permission_mode":"ask","turn_timeout":"5m"}}`)
	var got session.Session
	if code != http.StatusOK || json.Unmarshal(body, &got) != nil || got.ID != s.ID || got.Title != "after" || got.Role != session.RoleOwner {
		t.Fatalf("patch: %d %s", code, body)
	}
	if code, body := e.call("GET", path, "bob", nil); code != 200 || !strings.Contains(string(body), `"title":"after"`) {
		t.Errorf("get after rename: %d %s", code, body)
	}
	code, body = e.call("GET", "/v1/sessions", "alice", nil)
	if code != 200 || !strings.Contains(string(body), `"title":"after"`) || strings.Contains(string(body), `"title":"before"`) {
		t.Errorf("list after rename: %d %s", code, body)
	}

	// MCP servers and a setup command, shown back under "settings" with
	// env values hidden; memory beyond the node's (none set) is 403.
	code, body = e.call("PATCH", path, "alice", `{"settings":{"mcp_servers":[{"name":"files","command":"/bin/mcp","env":[{"name":"TOKEN","value":"s3cret"}]}],"setup":"true"}}`)
	if code != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Settings == nil || len(got.Settings.MCPServers) != 1 ||
		got.Settings.Setup != "true" || got.Settings.PermissionMode != "ask" || got.Settings.TurnTimeout != "5m0s" {
		t.Fatalf("patch mcp_servers: %d %s", code, body)
	}
	if code, body := e.call("GET", path, "bob", nil); code != 200 || strings.Contains(string(body), "s3cret") ||
		!strings.Contains(string(body), `"settings":{"agent":"fake","permission_mode":"ask","turn_timeout":"5m0s","mcp_servers":[{"name":"files","command":"/bin/mcp","env":[{"name":"TOKEN","value":"(hidden)"}]}],"setup":"true"}`) {
		t.Errorf("get with settings: %d %s", code, body)
	}
	if code, body := e.call("PATCH", path, "alice", `{"settings":{"memory_bytes":1048576}}`); code != http.StatusForbidden || !strings.Contains(string(body), "sandbox.memory_bytes") {
		t.Errorf("memory_bytes on a node without a limit: %d %s", code, body)
	}
	if code, body := e.call("PATCH", path, "alice", `{"settings":{"disk_bytes":33554432}}`); code != http.StatusForbidden ||
		!strings.Contains(string(body), "sets no limit a session may choose within (sandbox.workspace_disk_bytes)") {
		t.Errorf("disk_bytes on a node without a workspace quota: %d %s", code, body)
	}
	// An egress allowlist beyond the operator's permit list (this node
	// permits nothing) is a limit too: 403 naming it.
	if code, body := e.call("PATCH", path, "alice", `{"settings":{"egress":["github.com"]}}`); code != http.StatusForbidden ||
		errCode(t, body) != session.CodeForbidden || !strings.Contains(string(body), "not permitted on this server (sandbox.egress_permit)") {
		t.Errorf("egress beyond the permit list: %d %s", code, body)
	}
	if code, body := e.call("GET", "/v1/sessions/"+string(plain.ID), "alice", nil); code != 200 || strings.Contains(string(body), `"settings"`) {
		t.Errorf("a session without settings of its own shows them: %d %s", code, body)
	}
}
