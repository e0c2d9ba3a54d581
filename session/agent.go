package session

import "encoding/json"

// Agent event kinds (DESIGN §7 "Agent events"): what an ACP agent did in a
// turn, durable like every event. Streaming text is not an event: it travels
// as DeltaFrame, and the agent_message that follows is authoritative.
const (
	KindAgentMessage   Kind = "agent_message"
	KindAgentThought   Kind = "agent_thought"
	KindToolCall       Kind = "tool_call"
	KindToolCallUpdate Kind = "tool_call_update"
	KindPlan           Kind = "plan"
	KindUsage          Kind = "usage"
	KindFilesChanged   Kind = "files_changed"
)

// MaxToolContentBytes bounds the encoded content of one tool_call or
// tool_call_update event; larger content is stored truncated with
// TruncatedMarker, never split.
const MaxToolContentBytes = 256 << 10

// TruncatedMarker ends text that was cut to fit an event.
const TruncatedMarker = "\n… [truncated by atrium]"

// Data objects of the agent kinds. ACP's camelCase fields become snake_case.
type (
	AgentMessageData struct {
		Turn      int64  `json:"turn"`
		MessageID string `json:"message_id"`
		Text      string `json:"text"`
	}
	AgentThoughtData struct {
		Turn int64  `json:"turn"`
		Text string `json:"text"`
	}
	ToolCallData struct {
		Turn      int64             `json:"turn"`
		ID        string            `json:"id"`
		Title     string            `json:"title"`
		Kind      string            `json:"kind"`
		Status    string            `json:"status"`
		Content   []ToolCallContent `json:"content"`
		Locations []ToolLocation    `json:"locations"`
	}
	// ToolCallUpdateData carries only the fields that changed.
	ToolCallUpdateData struct {
		Turn    int64             `json:"turn"`
		ID      string            `json:"id"`
		Status  string            `json:"status,omitempty"`
		Title   string            `json:"title,omitempty"`
		Content []ToolCallContent `json:"content,omitempty"`
	}
	// ToolCallContent is one item of a tool call's content, by Type:
	// "content" (Content holds an ACP content block such as
	// {"type":"text","text":…}), "diff" (Path, OldText, NewText) or
	// "terminal" (TerminalID).
	ToolCallContent struct {
		Type       string          `json:"type"`
		Content    json.RawMessage `json:"content,omitempty"`
		Path       string          `json:"path,omitempty"`
		OldText    *string         `json:"old_text,omitempty"`
		NewText    string          `json:"new_text,omitempty"`
		TerminalID string          `json:"terminal_id,omitempty"`
	}
	ToolLocation struct {
		Path string `json:"path"`
		Line *int   `json:"line,omitempty"`
	}
	PlanData struct {
		Turn    int64       `json:"turn"`
		Entries []PlanEntry `json:"entries"`
	}
	PlanEntry struct {
		Content  string `json:"content"`
		Status   string `json:"status"`   // pending, in_progress, completed
		Priority string `json:"priority"` // high, medium, low
	}
	UsageData struct {
		Turn         int64   `json:"turn"`
		Model        string  `json:"model"`
		InputTokens  int64   `json:"input_tokens"`
		OutputTokens int64   `json:"output_tokens"`
		CachedTokens int64   `json:"cached_tokens"`
		CostUSD      float64 `json:"cost_usd"`
	}
	FilesChangedData struct {
		By    string   `json:"by"`
		Paths []string `json:"paths"`
	}
	// ApprovalOption is one of the choices an ACP agent offers with a
	// permission request; Kind is allow_once, allow_always, reject_once or
	// reject_always.
	ApprovalOption struct {
		ID   string `json:"id"`
		Name string `json:"name"`
		Kind string `json:"kind"`
	}
)

// FrameDelta is the server → client frame type of streaming agent text.
const FrameDelta = "delta"

// DeltaFrame is streaming text of the agent message being written: not
// stored, not replayed on resume (DESIGN §7). The node publishes it on
// Subjects.Delta; gateways pass it to WebSocket watchers as is and to SSE
// watchers as `event: delta`.
type DeltaFrame struct {
	Type      string `json:"type"` // "delta"
	Turn      int64  `json:"turn"`
	MessageID string `json:"message_id"`
	Text      string `json:"text"`
}
