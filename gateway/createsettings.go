package gateway

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/atriumhq/atrium/session"
)

// createSettings checks the "settings" of POST /v1/sessions as PATCH
// /v1/sessions/{id} does (settingsPatch: unknown keys and malformed values
// are refused by name) and moves those that shape the new session into its
// create request: permission_mode, agent and harness into harness (unless
// the body gives a different one: refused), egress into egress. What is
// left (limits, MCP servers, setup, …) is returned for the node to check and
// apply once the session exists; nil when nothing is left.
func createSettings(settings map[string]json.RawMessage, h *session.Harness, egress *[]string) (*session.SettingsPatch, error) {
	if len(settings) == 0 {
		return nil, nil
	}
	patch, err := settingsPatch(nil, settings)
	if err != nil {
		return nil, err
	}
	if v := patch.Harness; v != nil {
		hn := *v
		hn.PermissionMode = h.PermissionMode
		given := h.Template != "" || h.Command != nil || h.Agent != "" || h.Stdin != ""
		same := h.Template == hn.Template && h.Agent == hn.Agent && h.Stdin == hn.Stdin && slices.Equal(h.Command, hn.Command)
		if given && !same {
			return nil, session.Errorf(session.CodeBadRequest, `"harness" and "settings":{"harness"} give different harnesses: give one`)
		}
		*h = hn
		patch.Harness = nil
	}
	if v := patch.Agent; v != nil {
		if h.Agent != "" && h.Agent != *v {
			return nil, session.Errorf(session.CodeBadRequest, `"agent" and "settings":{"agent"} name different agents`)
		}
		if h.Template != "" || len(h.Command) > 0 {
			return nil, session.Errorf(session.CodeBadRequest, `"settings":{"agent"} and a harness template or command: give one`)
		}
		h.Agent = *v
		patch.Agent = nil
	}
	if m := patch.PermissionMode; m != nil {
		h.PermissionMode = *m // validated with the harness
		patch.PermissionMode = nil
	}
	if v := patch.Egress; v != nil {
		if *egress != nil && !slices.Equal(*egress, *v) {
			return nil, session.Errorf(session.CodeBadRequest, `"egress" and "settings":{"egress"} give different allowlists: give one`)
		}
		*egress = *v
		patch.Egress = nil
	}
	if patch.IsEmpty() {
		return nil, nil
	}
	return patch, nil
}

// settingsTaken reports whether the Settings of a session just created show
// every setting of p, the settings its create request gave the node. A node
// that predates session.PlaceRequest.Settings ignores them; a setting that
// is its zero value shows the same either way, and setting it again changes
// nothing.
func settingsTaken(p *session.SettingsPatch, s *session.Settings) bool {
	if s == nil {
		s = &session.Settings{}
	}
	same := func(v *int64, have int64) bool { return v == nil || *v == have }
	names := func(l []session.MCPServer) []string {
		out := make([]string, len(l))
		for i, m := range l {
			out[i] = m.Name
		}
		return out
	}
	return (p.TurnTimeout == nil || *p.TurnTimeout == 0 && s.TurnTimeout == "" || time.Duration(*p.TurnTimeout).String() == s.TurnTimeout) &&
		same(p.MemoryBytes, s.MemoryBytes) && same(p.DiskBytes, s.DiskBytes) &&
		(p.Pids == nil || *p.Pids == s.Pids) &&
		(p.InvokeConcurrency == nil || *p.InvokeConcurrency == s.InvokeConcurrency) &&
		(p.Setup == nil || *p.Setup == s.Setup) &&
		(p.MCPServers == nil || slices.Equal(names(*p.MCPServers), names(s.MCPServers)))
}
