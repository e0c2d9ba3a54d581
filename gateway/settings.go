package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// sessionSettingKeys are the keys of "settings" that PATCH /v1/sessions/{id}
// knows.
var sessionSettingKeys = []string{"harness", "agent", "permission_mode", "turn_timeout", "memory_bytes", "pids", "disk_bytes", "egress", "mcp_servers", "setup", "invoke_concurrency"}

// patchSession serves PATCH /v1/sessions/{id} {"title"?,"settings"?} → 200
// Session (owner). A title is at most session.MaxTitleBytes and shows in the
// catalog (GET /v1/sessions) at once; settings.permission_mode ("ask",
// "auto-edit" or "auto", agent sessions only) takes effect the next time the
// session's agent is started: a running agent keeps its mode.
// settings.turn_timeout (a duration such as "10m") bounds the session's turns
// from its next turn; beyond the node's turn timeout it is forbidden (403)
// naming the limit. settings.memory_bytes and settings.pids (0: the node's)
// limit the session's sandbox when it is next opened, at most the node's
// sandbox limits (403 naming the limit); settings.disk_bytes (0: the node's)
// sizes the session's workspace, at least 16 MiB (400) and at most the
// node's sandbox.workspace_disk_bytes (403 naming it, and 403 when the node
// has no workspace quota), applied when its image is made or next mounted;
// settings.mcp_servers (ACP's stdio,
// http and sse shapes) are passed to the agent, restarted with them at its
// next turn; settings.setup is a command run before a turn when the sandbox
// is new or files were written. The Session object shows them back under
// "settings". settings.invoke_concurrency caps the session's invokes
// running at once, at most the gateway's quotas.invokes_per_session (403
// beyond it). settings.harness replaces the session's harness (a template
// name, {"command":[…]} or {"agent":NAME}) from the next turn. settings.agent switches the session to another installed
// agent (started and given the conversation from the history at the next
// turn); settings.egress replaces its own egress allowlist (as PUT egress).
// Unknown settings are refused by name.
func (s *Server) patchSession(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	var body api.SessionPatch
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	patch, err := settingsPatch(body.Title, body.Settings)
	if err == nil {
		err = s.inv.checkSessionCap(patch.InvokeConcurrency)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	reply, err := s.do(r, p, id, session.ActManage, session.Command{Op: session.OpSettings, Settings: patch})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if reply.Session == nil {
		s.fail(w, r, session.Errorf(session.CodeInternal, "settings reply of session %s has no session", id))
		return
	}
	// The node wrote the catalog before it replied; read it into this
	// gateway's cache so the caller's next list shows the new title.
	s.refreshCatalog(r.Context(), id)
	writeJSON(w, http.StatusOK, reply.Session)
}

// settingsPatch checks a PATCH body's shape; the node checks the values
// against the session (an agent's permission mode needs an agent).
func settingsPatch(title *string, settings map[string]json.RawMessage) (*session.SettingsPatch, error) {
	var unknown []string
	for k := range settings {
		if !slices.Contains(sessionSettingKeys, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, session.Errorf(session.CodeBadRequest, "unknown settings: %s (known: %s)", strings.Join(unknown, ", "), strings.Join(sessionSettingKeys, ", "))
	}
	patch := &session.SettingsPatch{Title: title}
	if title != nil && len(*title) > session.MaxTitleBytes {
		return nil, session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes)
	}
	if raw, ok := settings["permission_mode"]; ok {
		var m string
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, session.Errorf(session.CodeBadRequest, `settings: permission_mode must be a string: "ask", "auto-edit" or "auto"`)
		}
		switch m {
		case session.PermissionAsk, session.PermissionAutoEdit, session.PermissionAuto:
		default:
			return nil, session.Errorf(session.CodeBadRequest, `settings: permission_mode must be "ask", "auto-edit" or "auto", not %q`, m)
		}
		patch.PermissionMode = &m
	}
	if raw, ok := settings["turn_timeout"]; ok {
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, session.Errorf(session.CodeBadRequest, `settings: turn_timeout must be a duration string such as "10m"`)
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, session.Errorf(session.CodeBadRequest, `settings: turn_timeout must be a positive duration such as "10m", not %q`, v)
		}
		n := int64(d)
		patch.TurnTimeout = &n
	}
	if raw, ok := settings["memory_bytes"]; ok {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return nil, session.Errorf(session.CodeBadRequest, "settings: memory_bytes must be a number of bytes (0: the server's)")
		}
		patch.MemoryBytes = &n
	}
	if raw, ok := settings["pids"]; ok {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return nil, session.Errorf(session.CodeBadRequest, "settings: pids must be a number of processes (0: the server's)")
		}
		patch.Pids = &n
	}
	if raw, ok := settings["disk_bytes"]; ok {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return nil, session.Errorf(session.CodeBadRequest, "settings: disk_bytes must be a number of bytes (0: the server's)")
		}
		if n > 0 && n < session.MinDiskBytes {
			return nil, session.Errorf(session.CodeBadRequest, "settings: disk_bytes %d is too small: at least %d (16 MiB), or 0 for the server's", n, session.MinDiskBytes)
		}
		patch.DiskBytes = &n
	}
	if raw, ok := settings["mcp_servers"]; ok {
		var l []session.MCPServer
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, session.Errorf(session.CodeBadRequest,
				`settings: mcp_servers must be a list of {"name","command","args","env":[{"name","value"}]} or {"name","type":"http"|"sse","url","headers":[{"name","value"}]}: %v`, err)
		}
		if l == nil {
			l = []session.MCPServer{}
		}
		if err := session.ValidateMCPServers(l); err != nil {
			return nil, err
		}
		patch.MCPServers = &l
	}
	if raw, ok := settings["harness"]; ok {
		var hn session.Harness
		if err := json.Unmarshal(raw, &hn); err != nil {
			return nil, session.Errorf(session.CodeBadRequest, `settings: harness must be a template name or {"command":[…]} or {"agent":NAME}: %v`, err)
		}
		if hn.PermissionMode != "" {
			return nil, session.Errorf(session.CodeBadRequest, `settings: give the permission mode as "permission_mode", not inside "harness"`)
		}
		if err := hn.Validate(); err != nil {
			return nil, err
		}
		patch.Harness = &hn
	}
	if raw, ok := settings["agent"]; ok {
		var v string
		if err := json.Unmarshal(raw, &v); err != nil || v == "" {
			return nil, session.Errorf(session.CodeBadRequest, "settings: agent must name an installed agent (atrium agents ls)")
		}
		patch.Agent = &v
	}
	if raw, ok := settings["egress"]; ok {
		var l []string
		if err := json.Unmarshal(raw, &l); err != nil {
			return nil, session.Errorf(session.CodeBadRequest, `settings: egress must be a list of hosts, e.g. ["github.com","*.npmjs.org"]`)
		}
		if l == nil {
			l = []string{}
		}
		patch.Egress = &l
	}
	if raw, ok := settings["invoke_concurrency"]; ok {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
			return nil, session.Errorf(session.CodeBadRequest, "settings: invoke_concurrency must be a number of invokes (0: the server's cap)")
		}
		patch.InvokeConcurrency = &n
	}
	if raw, ok := settings["setup"]; ok {
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, session.Errorf(session.CodeBadRequest, `settings: setup must be a shell command string ("" removes it)`)
		}
		if err := session.ValidateSetup(v); err != nil {
			return nil, err
		}
		patch.Setup = &v
	}
	if patch.IsEmpty() {
		return nil, session.Errorf(session.CodeBadRequest, `body needs "title" or "settings":{%s}`, `"`+strings.Join(sessionSettingKeys, `","`)+`"`)
	}
	return patch, nil
}

// checkSessionCap refuses a session's own invoke cap beyond the gateway's
// (quotas.invokes_per_session); with no gateway cap any is allowed.
func (v *invokes) checkSessionCap(n *int) error {
	if n == nil || v == nil || v.perSession <= 0 || *n <= v.perSession {
		return nil
	}
	return session.Errorf(session.CodeForbidden, "settings: invoke_concurrency %d is beyond this server's limit of %d (quotas.invokes_per_session)", *n, v.perSession)
}

// sessionCap is the cap on session e's invokes running at once: its own
// (settings.invoke_concurrency) when lower than the gateway's.
func (v *invokes) sessionCap(e *session.CatalogEntry) int {
	limit := v.perSession
	if e != nil && e.InvokeConcurrency > 0 && (limit <= 0 || e.InvokeConcurrency < limit) {
		limit = e.InvokeConcurrency
	}
	return limit
}
