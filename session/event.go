package session

import (
	"encoding/json"
	"time"
)

// Seq is the position of an event in a session's log: 1, 2, 3 … with no gaps,
// never reused.
type Seq = int64

// Kind names an event kind (DESIGN §7).
type Kind string

// The event kinds of the wire contract.
const (
	KindSessionCreated    Kind = "session_created"
	KindMessage           Kind = "message"
	KindTurnStarted       Kind = "turn_started"
	KindOutput            Kind = "output"
	KindAgent             Kind = "agent"
	KindApprovalRequested Kind = "approval_requested"
	KindApprovalResolved  Kind = "approval_resolved"
	KindTurnFinished      Kind = "turn_finished"
	KindSandbox           Kind = "sandbox"
	KindMemberChanged     Kind = "member_changed"
	KindPROpened          Kind = "pr_opened"
	KindError             Kind = "error"
)

// BySystem is the "by" of events that no user caused.
const BySystem = "system"

// TimeLayout is the wire format of times: RFC 3339 with nanoseconds, UTC.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// Time is a time.Time that marshals as TimeLayout in UTC.
type Time struct{ time.Time }

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, len(TimeLayout)+2)
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, TimeLayout)
	return append(b, '"'), nil
}

// UnmarshalJSON implements json.Unmarshaler; it accepts any RFC 3339 time.
func (t *Time) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return err
	}
	t.Time = v.UTC()
	return nil
}

// Event is one entry of a session's log. Data holds the kind's object below,
// already encoded; events are encoded once by the owner and the same bytes are
// stored, published and delivered to every client.
type Event struct {
	Seq   Seq             `json:"seq"`
	Epoch string          `json:"epoch"`
	Time  Time            `json:"time"`
	Kind  Kind            `json:"kind"`
	By    string          `json:"by"`
	Data  json.RawMessage `json:"data"`
}

// Data objects of each kind.
type (
	SessionCreatedData struct {
		Title string `json:"title"`
		// ForkedFrom is set on a fork's first event (files.go).
		ForkedFrom *ForkedFrom `json:"forked_from,omitempty"`
	}
	MessageData struct {
		Text     string `json:"text"`
		ClientID string `json:"client_id"`
	}
	TurnStartedData struct {
		Turn      int64 `json:"turn"`
		PromptSeq Seq   `json:"prompt_seq"`
	}
	OutputData struct {
		Turn   int64  `json:"turn"`
		Stream string `json:"stream"` // "stdout" or "stderr"
		Text   string `json:"text"`
	}
	ApprovalRequestedData struct {
		Turn    int64  `json:"turn"`
		ID      string `json:"id"`
		Summary string `json:"summary"`
		// Agent approvals (ACP permission requests) also carry the tool
		// call and the agent's options; a driver answers with an option.
		Title   string            `json:"title,omitempty"`
		Kind    string            `json:"kind,omitempty"`
		Content []ToolCallContent `json:"content,omitempty"`
		Options []ApprovalOption  `json:"options,omitempty"`
	}
	ApprovalResolvedData struct {
		Turn     int64  `json:"turn"`
		ID       string `json:"id"`
		Allow    bool   `json:"allow"`
		OptionID string `json:"option_id,omitempty"`
	}
	TurnFinishedData struct {
		Turn       int64      `json:"turn"`
		Status     TurnStatus `json:"status"`
		ExitCode   int        `json:"exit_code"`
		DurationMS int64      `json:"duration_ms"`
	}
	SandboxData struct {
		State  SandboxState `json:"state"`
		Detail string       `json:"detail"`
	}
	MemberChangedData struct {
		User string `json:"user"`
		Role Role   `json:"role"` // RoleNone when the member was removed.
	}
	PROpenedData struct {
		URL    string `json:"url"`
		Branch string `json:"branch"`
	}
	ErrorData struct {
		Code    Code   `json:"code"`
		Message string `json:"message"`
	}
)

// AgentData builds the data of an agent event: the harness object with the
// turn number added as "turn" (a "turn" the harness set is replaced).
func AgentData(turn int64, obj map[string]json.RawMessage) json.RawMessage {
	t, _ := json.Marshal(turn)
	obj["turn"] = t
	b, _ := json.Marshal(obj) // a map of RawMessage that came from valid JSON always encodes.
	return b
}

// TurnStatus is how a turn ended.
type TurnStatus string

// Turn statuses.
const (
	TurnOK        TurnStatus = "ok"
	TurnFailed    TurnStatus = "failed"
	TurnCancelled TurnStatus = "cancelled"
	TurnTimeout   TurnStatus = "timeout"
)

// SandboxState is the state of a session's sandbox.
type SandboxState string

// Sandbox states.
const (
	SandboxNone         SandboxState = "none" // never provisioned
	SandboxProvisioning SandboxState = "provisioning"
	SandboxRestoring    SandboxState = "restoring"
	SandboxReady        SandboxState = "ready"
	SandboxSaving       SandboxState = "saving"
	SandboxSleeping     SandboxState = "sleeping"
	SandboxStopped      SandboxState = "stopped"
	SandboxFailed       SandboxState = "failed"
)

// MustData encodes v as event data. v must be one of the data types above.
func MustData(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("session: encode event data: " + err.Error())
	}
	return b
}

// Limits of the protocol.
const (
	// MaxFrameBytes is the largest client→server WebSocket frame and REST body.
	MaxFrameBytes = 1 << 20
	// MaxTextBytes is the largest prompt text.
	MaxTextBytes = 256 << 10
	// MaxClientIDBytes is the longest client_id.
	MaxClientIDBytes = 128
	// MaxOutputEventBytes is the most text one output event carries.
	MaxOutputEventBytes = 64 << 10
	// MaxTitleBytes is the longest session title.
	MaxTitleBytes = 256
)
