package session

import "encoding/json"

// State is whether a session's actor is running.
type State string

// Session states.
const (
	StateActive     State = "active"
	StateHibernated State = "hibernated"
)

// Sandbox is the sandbox part of the Session object.
type SandboxInfo struct {
	State SandboxState `json:"state"`
	// Kind says what runs the sandbox (an extension): SandboxKindLocal,
	// SandboxKindVM or SandboxKindRemote; absent when unknown or when the
	// session has no sandbox (state none).
	Kind string `json:"kind,omitempty"`
}

// Kinds of SandboxInfo.Kind.
const (
	SandboxKindLocal  = "local"  // bubblewrap on the node's host
	SandboxKindVM     = "vm"     // a VM on an atrium vmhost
	SandboxKindRemote = "remote" // a machine made by the operator's hook
)

// NewSandboxInfo is the sandbox part of a Session object: kind is left out
// while the session has no sandbox.
func NewSandboxInfo(state SandboxState, kind string) SandboxInfo {
	if state == SandboxNone || state == "" {
		kind = ""
	}
	return SandboxInfo{State: state, Kind: kind}
}

// Session is the Session object of the wire contract. Role is the caller's
// role and is filled in per caller.
type Session struct {
	ID        ID          `json:"id"`
	Title     string      `json:"title"`
	Owner     string      `json:"owner"`
	CreatedAt Time        `json:"created_at"`
	LastSeq   Seq         `json:"last_seq"`
	Epoch     string      `json:"epoch"`
	State     State       `json:"state"`
	Sandbox   SandboxInfo `json:"sandbox"`
	Role      Role        `json:"role"`
	// LastActivity is when the session's last event was committed (an
	// extension); absent if unknown.
	LastActivity *Time `json:"last_activity,omitempty"`
	// Members lists the session's members and their roles (an extension);
	// only owners see it.
	Members Members `json:"members,omitempty"`
	// Egress is the session's own egress allowlist (an extension): hosts
	// its sandbox may reach besides the node's default allowlist.
	Egress []string `json:"egress,omitempty"`
	// Usage totals the session's usage events (an extension); absent
	// while there are none.
	Usage *UsageTotals `json:"usage,omitempty"`
	// Settings are the session's own settings (an extension); absent
	// while it has none.
	Settings *Settings `json:"settings,omitempty"`
}

// UsageTotals sums a session's usage events (UsageData).
type UsageTotals struct {
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

// Add adds u to t.
func (t *UsageTotals) Add(u UsageData) {
	t.InputTokens += u.InputTokens
	t.OutputTokens += u.OutputTokens
	t.CachedTokens += u.CachedTokens
	t.CostUSD += u.CostUSD
}

// Harness says what runs once per turn in the sandbox: a named template from
// config (Template) or an explicit argv (Command). The zero value means the
// default template.
type Harness struct {
	Template string   `json:"template,omitempty"`
	Command  []string `json:"command,omitempty"`
	// Agent names an ACP agent (DESIGN §6 "Agents") that runs in the
	// sandbox across turns instead of a per-turn harness.
	Agent string `json:"agent,omitempty"`
	// Stdin is how a harness gets its turn: "json" (the default: a JSON
	// line, then approval answers) or "text" (the prompt alone, then end of
	// input). Not used with Agent.
	Stdin string `json:"stdin,omitempty"`
	// PermissionMode is an agent session's permission mode (DESIGN §6:
	// PermissionAsk, PermissionAutoEdit or PermissionAuto); "" is the
	// node's agent_mode. It comes from POST /v1/sessions
	// {"settings":{"permission_mode"}} and is kept in the Meta.
	PermissionMode string `json:"permission_mode,omitempty"`
}

// Permission modes of an agent session (DESIGN §6).
const (
	PermissionAsk      = "ask"
	PermissionAutoEdit = "auto-edit"
	PermissionAuto     = "auto"
)

// UnmarshalJSON accepts the wire forms: "shell" or {"command":[…]}.
func (h *Harness) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		*h = Harness{Template: name}
		return nil
	}
	type plain Harness
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return Errorf(CodeBadRequest, `harness must be a template name or {"command":[...]}`)
	}
	*h = Harness(p)
	return nil
}

// Harness stdin modes (DESIGN §6 harness contract).
const (
	HarnessStdinJSON = "json"
	HarnessStdinText = "text"
)

func validAgentName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// DefaultTemplate is the harness template used when none is given.
const DefaultTemplate = "shell"

// Validate checks the harness shape (not whether the template exists).
func (h Harness) Validate() error {
	if h.Template != "" && len(h.Command) > 0 {
		return Errorf(CodeBadRequest, "harness: give a template or a command, not both")
	}
	if h.Agent != "" && (h.Template != "" || len(h.Command) > 0) {
		return Errorf(CodeBadRequest, "harness: give an agent, a template or a command, not several")
	}
	if h.Agent != "" && !validAgentName(h.Agent) {
		return Errorf(CodeBadRequest, "harness: agent name %q is not valid (letters, digits, '-' and '_', at most 64)", h.Agent)
	}
	switch h.PermissionMode {
	case "":
	case PermissionAsk, PermissionAutoEdit, PermissionAuto:
		if h.Agent == "" {
			return Errorf(CodeBadRequest, "settings: permission_mode is for agent sessions (give an agent)")
		}
	default:
		return Errorf(CodeBadRequest, `settings: permission_mode must be "ask", "auto-edit" or "auto", not %q`, h.PermissionMode)
	}
	switch h.Stdin {
	case "", HarnessStdinJSON, HarnessStdinText:
	default:
		return Errorf(CodeBadRequest, `harness: stdin must be "json" or "text", not %q`, h.Stdin)
	}
	if h.Command != nil && len(h.Command) == 0 {
		return Errorf(CodeBadRequest, "harness: command must not be empty")
	}
	for _, a := range h.Command {
		if len(a) > 64<<10 {
			return Errorf(CodeBadRequest, "harness: command argument too long")
		}
	}
	return nil
}

// CatalogEntry is a session's record in the catalog (NATS KV
// "<prefix>_sessions"), readable from any gateway for listing and
// authorization without waking the session. Only the owning node writes it.
type CatalogEntry struct {
	ID        ID           `json:"id"`
	Title     string       `json:"title"`
	Owner     string       `json:"owner"`
	Tenant    string       `json:"tenant,omitempty"`
	Members   Members      `json:"members"`
	CreatedAt Time         `json:"created_at"`
	Epoch     string       `json:"epoch"`
	State     State        `json:"state"`
	LastSeq   Seq          `json:"last_seq"`
	Sandbox   SandboxState `json:"sandbox"`
	// SandboxKind is what runs the sandbox (SandboxInfo.Kind); "" if
	// unknown.
	SandboxKind string `json:"sandbox_kind,omitempty"`
	// LastActivity is when the last event was committed; nil if unknown.
	LastActivity *Time `json:"last_activity,omitempty"`
	// Node is the ID of the node that last held the session, whose disk has
	// its history file; "" if unknown (e.g. an entry written at creation).
	// Gateways activate the session there first (Subjects.PlaceOn).
	Node string `json:"node,omitempty"`
	// Usage totals the session's usage events; nil while there are none.
	Usage *UsageTotals `json:"usage,omitempty"`
	// InvokeConcurrency is the session's own cap on its invokes running
	// at once (settings.invoke_concurrency); 0: the gateways' cap.
	InvokeConcurrency int `json:"invoke_concurrency,omitempty"`
}

// SessionFor returns the Session object as user sees it.
func (c *CatalogEntry) SessionFor(user string) Session {
	return Session{
		ID: c.ID, Title: c.Title, Owner: c.Owner, CreatedAt: c.CreatedAt,
		LastSeq: c.LastSeq, Epoch: c.Epoch, State: c.State,
		Sandbox: NewSandboxInfo(c.Sandbox, c.SandboxKind), Role: c.Members.RoleOf(user),
		LastActivity: c.LastActivity, Usage: c.Usage,
	}
}

// WithRole returns s as a caller with role sees it: the role set, and the
// members and the harness setting shown to owners only.
func (s Session) WithRole(role Role, m Members) Session {
	s.Role = role
	s.Members = nil
	if role == RoleOwner {
		s.Members = m
	} else if s.Settings != nil && s.Settings.Harness != nil {
		// The harness command is the owner's to see: it may name things
		// (hosts, paths, arguments) the owner did not mean to share.
		st := *s.Settings
		st.Harness = nil
		s.Settings = &st
		if st.IsZero() {
			s.Settings = nil
		}
	}
	return s
}
