package session

import (
	"encoding/json"
	"strings"
)

// DefaultPrefix is the default NATS subject prefix.
const DefaultPrefix = "atrium"

// Subjects names the NATS subjects and KV buckets under one prefix (DESIGN §5).
// The zero value uses DefaultPrefix.
type Subjects struct {
	Prefix string
}

func (s Subjects) p() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Cmd is the request/reply subject of the actor that owns id.
func (s Subjects) Cmd(id ID) string { return s.p() + ".session." + string(id) + ".cmd" }

// Events is where id's events reach watchers: the EventsStream republishes
// on it each event the owner captured (Capture), once stored.
func (s Subjects) Events(id ID) string { return s.p() + ".session." + string(id) + ".events" }

// Presence is where gateways publish who watches id. Never persisted.
func (s Subjects) Presence(id ID) string { return s.p() + ".session." + string(id) + ".presence" }

// Place is the queue-group subject of nodes: create or activate a session.
func (s Subjects) Place() string { return s.p() + ".place" }

// PlaceOn is node's own place subject, e.g. "atrium.place.node.node-a": a
// node with a NodeID subscribes to it (not in a queue group) besides Place,
// so that a gateway can activate a session on the node that last held it,
// whose disk has its history file (CatalogEntry.Node), and fall back to
// Place when nobody answers. It is "" when node is empty.
//
// Node IDs from the server config are letters, digits, '-' and '_' only, and
// are used as they are. Any other byte (a '.', '*' or '>' would break the
// subject) is escaped as '%' and two upper-case hex digits, so that every
// node ID names its own single-token subject and both sides derive the same
// subject from the same ID.
func (s Subjects) PlaceOn(node string) string {
	if node == "" {
		return ""
	}
	return s.p() + ".place.node." + subjectToken(node)
}

// subjectToken escapes s into one NATS subject token (see PlaceOn).
func subjectToken(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

// PlaceQueue is the queue group nodes join on Place.
func (s Subjects) PlaceQueue() string { return s.p() + "-nodes" }

// CatalogBucket is the KV bucket of the session catalog.
func (s Subjects) CatalogBucket() string { return s.p() + "_sessions" }

// OwnersBucket is the KV bucket of ownership leases.
func (s Subjects) OwnersBucket() string { return s.p() + "_owners" }

// NATS headers. Only gateways set the principal headers; nodes trust them.
const (
	HeaderUser   = "Atrium-User"
	HeaderTenant = "Atrium-Tenant"
	// HeaderAdmin is "1" when the caller is an admin of its tenant.
	HeaderAdmin = "Atrium-Admin"
	// HeaderCap is the caller's cap (Principal.Cap), when it has one.
	HeaderCap = "Atrium-Cap"
	// HeaderControl on a message of the Events subject marks a control
	// message rather than an event. Its value is a ControlKind.
	HeaderControl = "Atrium-Control"
)

// ControlKind is the value of HeaderControl.
type ControlKind string

// Control messages on the Events subject.
const (
	// ControlDeleted: the session was deleted; gateways close its watchers.
	ControlDeleted ControlKind = "deleted"
)

// Op is a command to a session actor.
type Op string

// Command ops on the Cmd subject.
const (
	OpPrompt  Op = "prompt"  // Text, ClientID → Seq
	OpCancel  Op = "cancel"  // PromptSeq? → ok
	OpApprove Op = "approve" // ApprovalID, Allow → ok
	OpHistory Op = "history" // After, Limit, MaxBytes → Events, LastSeq, Epoch, More
	OpInfo    Op = "info"    // → Session (Role of the caller)
	OpMember  Op = "member"  // User, Role → ok (RoleNone removes)
	OpDelete  Op = "delete"  // → ok
	// OpPrompts appends several prompts of one caller in one request,
	// in order, each as OpPrompt would (Prompts → Results: one Reply per
	// prompt, its Seq or its Error). Gateways send it when a WebSocket's
	// prompt frames queue up (at most MaxPromptsPerCommand); the client's
	// frames are the same. A node that predates it answers bad_request
	// "unknown op", and the gateway then sends the prompts one by one.
	OpPrompts Op = "prompts"
	// OpSecretSet sets secret Name to Value (owner) → ok.
	OpSecretSet Op = "secret_set"
	// OpSecretDelete removes secret Name (owner) → ok; not_found if unset.
	OpSecretDelete Op = "secret_delete"
	// OpSecrets lists the secrets' names (owner) → Secrets, never values.
	OpSecrets Op = "secrets"
	// OpEgress replaces the session's own egress allowlist with Egress
	// (owner) → Session. It takes effect when the sandbox is next opened.
	OpEgress Op = "egress"
	// OpPROpened records that a pull request was opened for the session's
	// work (driver): PR → ok, once the pr_opened event is durable.
	OpPROpened Op = "pr_opened"
	// OpSettings changes the session's title and settings (owner):
	// Settings → Session. A permission mode takes effect at the agent's
	// next start.
	OpSettings Op = "settings"
)

// SettingsPatch is the change of OpSettings; nil fields stay as they are.
type SettingsPatch struct {
	Title          *string `json:"title,omitempty"`
	PermissionMode *string `json:"permission_mode,omitempty"`
	// TurnTimeout (nanoseconds) bounds the session's turns from its next
	// turn; at most the node's turn timeout (else forbidden).
	TurnTimeout *int64 `json:"turn_timeout_ns,omitempty"`
	// MemoryBytes and Pids (0: the node's) apply when the sandbox is next
	// opened; at most the node's limits (else forbidden).
	MemoryBytes *int64 `json:"memory_bytes,omitempty"`
	Pids        *int   `json:"pids,omitempty"`
	// DiskBytes (0: the node's) is the size of the sandbox's workspace,
	// applied when its image is made or next mounted; at least
	// MinDiskBytes and at most the node's sandbox.workspace_disk_bytes.
	DiskBytes *int64 `json:"disk_bytes,omitempty"`
	// MCPServers replace the session's MCP servers; the agent is
	// restarted with them at its next turn.
	MCPServers *[]MCPServer `json:"mcp_servers,omitempty"`
	// Setup replaces the setup command ("" removes it).
	Setup *string `json:"setup,omitempty"`
	// Egress replaces the session's own egress allowlist (as OpEgress).
	Egress *[]string `json:"egress,omitempty"`
	// Agent switches the session to another agent, started (and given the
	// conversation from the history) at the next turn.
	Agent *string `json:"agent,omitempty"`
	// Harness replaces the session's harness (a template, a command, or
	// an agent), from the next turn.
	Harness *Harness `json:"harness,omitempty"`
	// InvokeConcurrency caps the session's invokes running at once (0:
	// the gateways' cap); the gateway checks it against its cap.
	InvokeConcurrency *int `json:"invoke_concurrency,omitempty"`
}

// IsEmpty reports whether p changes nothing.
func (p *SettingsPatch) IsEmpty() bool {
	return p == nil || p.Title == nil && p.PermissionMode == nil && p.TurnTimeout == nil && p.MemoryBytes == nil &&
		p.Pids == nil && p.DiskBytes == nil && p.MCPServers == nil && p.Setup == nil && p.Egress == nil && p.Agent == nil && p.Harness == nil && p.InvokeConcurrency == nil
}

// Command is the JSON body of a request on the Cmd subject. The caller is in
// the HeaderUser/HeaderTenant headers.
type Command struct {
	Op         Op     `json:"op"`
	Text       string `json:"text,omitempty"`
	ClientID   string `json:"client_id,omitempty"`
	ApprovalID string `json:"approval_id,omitempty"`
	Allow      bool   `json:"allow,omitempty"`
	// OptionID, on OpApprove, is the chosen option of an agent's
	// approval; without it Allow picks the first allow_once or
	// reject_once option.
	OptionID string `json:"option_id,omitempty"`
	User     string `json:"user,omitempty"`
	Role     Role   `json:"role,omitempty"`
	After    Seq    `json:"after,omitempty"`
	Limit    int    `json:"limit,omitempty"`
	// MaxBytes bounds the encoded size of a history reply's events; the
	// owner stops early (More=true) rather than exceed it.
	MaxBytes int `json:"max_bytes,omitempty"`
	// Name and Value are a secret's (OpSecretSet, OpSecretDelete).
	Name  string `json:"name,omitempty"`
	Value string `json:"value,omitempty"`
	// Egress is the allowlist of OpEgress.
	Egress []string `json:"egress,omitempty"`
	// PromptSeq, on OpCancel, cancels only the turn of the prompt at that
	// seq, whether it runs or still waits in the queue (see
	// Turns.CancelPrompt); zero cancels the running turn.
	PromptSeq Seq `json:"prompt_seq,omitempty"`
	// PR is the pull request of OpPROpened.
	PR *PROpenedData `json:"pr,omitempty"`
	// Files and Fork are the requests of OpFiles and OpFork (files.go).
	Files *FilesRequest `json:"files,omitempty"`
	Fork  *ForkRequest  `json:"fork,omitempty"`
	// Settings is the change of OpSettings.
	Settings *SettingsPatch `json:"settings,omitempty"`
	// Prompts are the prompts of OpPrompts, in order.
	Prompts []PromptItem `json:"prompts,omitempty"`
}

// PromptItem is one prompt of OpPrompts: OpPrompt's Text and ClientID.
type PromptItem struct {
	Text     string `json:"text"`
	ClientID string `json:"client_id,omitempty"`
}

// MaxPromptsPerCommand bounds the prompts of one OpPrompts.
const MaxPromptsPerCommand = 64

// DefaultHistoryMaxBytes keeps a history reply well under NATS's default
// 1 MiB max payload.
const DefaultHistoryMaxBytes = 512 << 10

// Reply is the JSON body of every reply on the Cmd and Place subjects. When
// Error is set nothing else is.
type Reply struct {
	Error   *Error            `json:"error,omitempty"`
	Seq     Seq               `json:"seq,omitempty"`
	Session *Session          `json:"session,omitempty"`
	Events  []json.RawMessage `json:"events,omitempty"`
	LastSeq Seq               `json:"last_seq,omitempty"`
	Epoch   string            `json:"epoch,omitempty"`
	More    bool              `json:"more,omitempty"`
	// Secrets answers OpSecrets: names and times, never values.
	Secrets []SecretInfo `json:"secrets,omitempty"`
	// Files and Fork answer OpFiles and OpFork (files.go).
	Files *FilesReply `json:"files,omitempty"`
	Fork  *ForkReply  `json:"fork,omitempty"`
	// Results answers OpPrompts: one Reply per prompt, in order.
	Results []Reply `json:"results,omitempty"`
}

// Err returns the reply's error or nil.
func (r *Reply) Err() error {
	if r.Error == nil {
		return nil
	}
	return r.Error
}

// PlaceOp is a request to the Place queue group.
type PlaceOp string

// Place ops.
const (
	// PlaceCreate creates a session (ID chosen by the gateway) and activates it.
	PlaceCreate PlaceOp = "create"
	// PlaceActivate activates an existing session so its Cmd subject has a
	// responder. Replies after the subscription is live.
	PlaceActivate PlaceOp = "activate"
)

// PlaceRequest is the JSON body of a request on the Place subject. The caller
// is in the principal headers.
type PlaceRequest struct {
	Op      PlaceOp `json:"op"`
	Session ID      `json:"session"`
	Title   string  `json:"title,omitempty"`
	Harness Harness `json:"harness,omitzero"`
	// Egress is the new session's own egress allowlist; the node checks
	// it against its sandbox.egress_permit.
	Egress []string `json:"egress,omitempty"`
	// Fork, on PlaceCreate, makes the new session a fork: its history is
	// the parent's up to Fork.Seq (files.go).
	Fork *ForkedFrom `json:"fork,omitempty"`
	// Settings, on PlaceCreate, are the new session's own settings, as
	// OpSettings takes them. The node checks them before it writes
	// anything, so a refused setting creates nothing; the Session in the
	// reply has them. (A node that predates this field ignores it: its
	// reply's Session has no Settings.)
	Settings *SettingsPatch `json:"settings,omitempty"`
}

// PresenceMessage is what a gateway publishes on the Presence subject: the
// full list of its watchers of a session. Gateways merge the lists of all
// gateways; a list expires when not refreshed within PresenceTTL.
type PresenceMessage struct {
	Gateway  string    `json:"gateway"`
	Watchers []Watcher `json:"watchers"`
}

// Meta is where the owner publishes id's metadata (Meta, secrets included)
// after each change; the events stream captures it so that a node taking
// the session over restores metadata changed since the last checkpoint.
// Only nodes may read it: it carries secrets.
func (s Subjects) Meta(id ID) string { return s.p() + ".session." + string(id) + ".meta" }

// EventsStream is the JetStream stream that captures every session's
// Capture and Meta subjects, e.g. ATRIUM_EVENTS; events are stored under
// their Events subject.
func (s Subjects) EventsStream() string { return strings.ToUpper(s.p()) + "_EVENTS" }

// AllEvents is the wildcard of every session's Events subject: the subject
// the EventsStream stores events under, and republishes them on.
func (s Subjects) AllEvents() string { return s.p() + ".session.*.events" }

// Capture is where the owner publishes id's events and control messages for
// the EventsStream, e.g. "atrium.capture.<id>.events". The stream stores
// them under Events(id) and republishes each one it stored on Events(id)
// (JetStream RePublish); nobody else should subscribe to Capture: a message
// the stream refuses (a duplicate Nats-Msg-Id) reaches its subscribers too.
func (s Subjects) Capture(id ID) string { return s.p() + ".capture." + string(id) + ".events" }

// AllCapture is the wildcard of every session's Capture subject.
func (s Subjects) AllCapture() string { return s.p() + ".capture.*.events" }

// AllMeta is the wildcard of every session's Meta subject.
func (s Subjects) AllMeta() string { return s.p() + ".session.*.meta" }

// LeaseKey is id's ownership record key in the OwnersBucket.
func LeaseKey(id ID) string { return "lease." + string(id) }

// NodeLeaseKey is the key of node's lease in the OwnersBucket.
func NodeLeaseKey(node string) string { return "node." + node }

// Lease is the value of a LeaseKey (a session's ownership record: the node
// that owns the session, the incarnation of that node's lease that holds it,
// and when it acquired it; the entry's revision is the owner's fencing token)
// and of a NodeLeaseKey (the node, its current incarnation and when it took
// it). A record is held while its node's lease names its incarnation.
type Lease struct {
	Node     string `json:"node"`
	Inc      string `json:"inc,omitempty"`
	Acquired Time   `json:"acquired"`
}

// Delta is the subject of a session's streaming agent text (DeltaFrame),
// published by the owner and never stored.
func (s Subjects) Delta(id ID) string { return s.p() + ".session." + string(id) + ".delta" }
