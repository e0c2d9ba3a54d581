package acp

import (
	"context"
	"encoding/json"
	"testing"
)

// TestClient_MCPServers: session/new and session/load carry the MCP servers
// in ACP's shapes (stdio with every list present, http with its type, url
// and headers), and initialize's mcpCapabilities say which transports the
// agent supports.
func TestClient_MCPServers(t *testing.T) {
	s := newScript(t, Config{})
	servers := []MCPServer{
		{Name: "files", Command: "/usr/bin/mcp-files", Env: []EnvVar{{Name: "ROOT", Value: "/workspace"}}},
		{Name: "docs", Type: "http", URL: "https://docs.example.com/mcp", Headers: []EnvVar{{Name: "Authorization", Value: "Bearer x"}}},
	}
	type opened struct {
		info AgentInfo
		err  error
	}
	done := make(chan opened, 1)
	go func() {
		info, err := s.c.Initialize(context.Background())
		if err == nil {
			_, err = s.c.NewSession(context.Background(), "/workspace", servers)
		}
		if err == nil {
			err = s.c.LoadSession(context.Background(), "s1", "/workspace", servers)
		}
		done <- opened{info, err}
	}()
	s.answer(s.expect("initialize"), map[string]any{"protocolVersion": 1,
		"agentCapabilities": map[string]any{"loadSession": true, "mcpCapabilities": map[string]any{"http": true}}})
	want := `[{"name":"files","command":"/usr/bin/mcp-files","args":[],"env":[{"name":"ROOT","value":"/workspace"}]},` +
		`{"type":"http","name":"docs","url":"https://docs.example.com/mcp","headers":[{"name":"Authorization","value":"Bearer x"}]}]`
	for _, method := range []string{"session/new", "session/load"} {
		r := s.expect(method)
		var p struct {
			MCPServers json.RawMessage `json:"mcpServers"`
		}
		if err := json.Unmarshal(r.Params, &p); err != nil || string(p.MCPServers) != want {
			t.Errorf("%s mcpServers = %s, want %s", method, p.MCPServers, want)
		}
		if method == "session/new" {
			s.answer(r, map[string]any{"sessionId": "s1"})
		} else {
			s.answer(r, nil)
		}
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("open: %v", o.err)
	}
	c := o.info.Capabilities
	if !c.Supports("") || !c.Supports("stdio") || !c.Supports("http") || c.Supports("sse") || c.Supports("ws") {
		t.Errorf("capabilities %+v: want stdio and http, not sse", c)
	}
}
