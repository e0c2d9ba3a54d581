package gateway

import (
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestSettingsTaken: the gateway tells a node that applied a create's
// settings (its reply's Session shows them) from one that predates
// PlaceRequest.Settings (they are missing), so it sets them afterwards only
// for the latter.
func TestSettingsTaken(t *testing.T) {
	d, mem, pids, setup, zero := int64(5*time.Minute), int64(1<<30), 64, "make", int64(0)
	servers := []session.MCPServer{{Name: "files", Command: "/bin/mcp"}}
	patch := &session.SettingsPatch{TurnTimeout: &d, MemoryBytes: &mem, Pids: &pids, Setup: &setup, MCPServers: &servers}
	for name, c := range map[string]struct {
		patch *session.SettingsPatch
		have  *session.Settings
		want  bool
	}{
		"applied": {patch, &session.Settings{Agent: "claude", TurnTimeout: "5m0s", MemoryBytes: 1 << 30, Pids: 64, Setup: "make",
			MCPServers: []session.MCPServer{{Name: "files", Command: "/bin/mcp"}}}, true},
		"old node: only the harness's":   {patch, &session.Settings{Agent: "claude"}, false},
		"old node: none":                 {patch, nil, false},
		"one missing":                    {patch, &session.Settings{TurnTimeout: "5m0s", MemoryBytes: 1 << 30, Pids: 64, Setup: "make"}, false},
		"zero values show the same":      {&session.SettingsPatch{MemoryBytes: &zero}, nil, true},
		"invoke concurrency not applied": {&session.SettingsPatch{InvokeConcurrency: &pids}, &session.Settings{}, false},
	} {
		if got := settingsTaken(c.patch, c.have); got != c.want {
			t.Errorf("%s: settingsTaken = %v, want %v", name, got, c.want)
		}
	}
}
