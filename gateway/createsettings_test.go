package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestCreateSession_Settings: POST /v1/sessions takes every setting PATCH
// takes, refuses the same way (400 naming unknown keys and bad values, 403
// naming the operator's limit) and a refused create leaves no session.
func TestCreateSession_Settings(t *testing.T) {
	ns := startNATS(t)
	startAgentNode(t, ns)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	count := func() int {
		t.Helper()
		code, b := e.call("GET", "/v1/sessions", "alice", nil)
		var l struct{ Sessions []session.Session }
		if code != http.StatusOK || json.Unmarshal(b, &l) != nil {
			t.Fatalf("list: %d %s", code, b)
		}
		return len(l.Sessions)
	}

	code, body := e.call("POST", "/v1/sessions", "alice", `{"title":"set","settings":{"agent":"fake","permission_mode":"ask","turn_timeout":"5m","setup":"true","invoke_concurrency":2,
		"mcp_servers":[{"name":"files","command":"/bin/mcp","env":[{"name":"TOKEN","value":"s3cret"}]}]}}`)
	var got session.Session
	if code != http.StatusCreated || json.Unmarshal(body, &got) != nil || got.Settings == nil {
		t.Fatalf("create with settings: %d %s", code, body)
	}
	if s := got.Settings; s.Agent != "fake" || s.PermissionMode != "ask" || s.TurnTimeout != "5m0s" || s.Setup != "true" || len(s.MCPServers) != 1 {
		t.Errorf("created session's settings: %s", body)
	}
	if strings.Contains(string(body), "s3cret") {
		t.Errorf("an MCP server's env value is in the reply: %s", body)
	}
	code, body = e.call("GET", "/v1/sessions/"+string(got.ID), "alice", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"settings":{"agent":"fake","permission_mode":"ask","turn_timeout":"5m0s","mcp_servers":[{"name":"files","command":"/bin/mcp","env":[{"name":"TOKEN","value":"(hidden)"}]}],"setup":"true"`) {
		t.Errorf("get the created session: %d %s", code, body)
	}
	before := count()

	for name, c := range map[string]struct {
		body string
		code int
		want string
	}{
		"unknown settings":          {`{"agent":"fake","settings":{"colour":"red","budget":1}}`, 400, "unknown settings: budget, colour (known: harness, agent, permission_mode,"},
		"bad mode":                  {`{"agent":"fake","settings":{"permission_mode":"yolo"}}`, 400, `not "yolo"`},
		"mode without agent":        {`{"settings":{"permission_mode":"ask"}}`, 400, "permission_mode is for agent sessions"},
		"bad timeout":               {`{"settings":{"turn_timeout":"soon"}}`, 400, "turn_timeout must be a positive duration"},
		"setup not a string":        {`{"settings":{"setup":["pip"]}}`, 400, "setup must be a shell command string"},
		"two agents":                {`{"agent":"fake","settings":{"agent":"other"}}`, 400, "name different agents"},
		"agent not installed":       {`{"settings":{"agent":"nope"}}`, 400, "atrium agents install nope"},
		"timeout beyond the node's": {`{"agent":"fake","settings":{"turn_timeout":"2h"}}`, 403, "limit of 30m0s (node.turn_timeout)"},
		"memory beyond the node's":  {`{"settings":{"memory_bytes":1048576}}`, 403, "sandbox.memory_bytes"},
	} {
		code, body := e.call("POST", "/v1/sessions", "alice", c.body)
		var eb session.ErrorBody
		if code != c.code || json.Unmarshal(body, &eb) != nil || eb.Error == nil || !strings.Contains(eb.Error.Message, c.want) {
			t.Errorf("%s: %d %s, want %d containing %q", name, code, body, c.code, c.want)
		}
	}
	if n := count(); n != before {
		t.Errorf("refused creates left sessions: %d sessions, want %d", n, before)
	}
}
