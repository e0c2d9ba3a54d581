package session

import "encoding/json"

// Subprotocol is the WebSocket subprotocol of the client protocol.
const Subprotocol = "atrium.v1"

// SubprotocolBatch is Subprotocol with one addition: the history a
// connection catches up on (after the hello, and when it refetches a gap) may
// come as EventsFrames, several events to a frame. A client that offers it
// alongside Subprotocol gets it from a gateway that has it and plain
// atrium.v1 from one that does not; the subprotocol the handshake chose says
// which. Ordering and gap-freedom are those of atrium.v1: the events of an
// events frame follow one another and the events before it.
const SubprotocolBatch = "atrium.v1+batch"

// Server → client WebSocket frame types.
const (
	FrameHello    = "hello"
	FrameEvent    = "event"
	FrameEvents   = "events" // only with SubprotocolBatch
	FramePresence = "presence"
	FrameAck      = "ack"
	FrameError    = "error"
)

// Client → server WebSocket frame types.
const (
	FramePrompt  = "prompt"
	FrameCancel  = "cancel"
	FrameApprove = "approve"
	// FrameTyping says the sender (a driver) is typing a prompt. It is
	// repeated while typing, counts for the gateway's typing TTL, and shows
	// as "typing":true on the sender's watcher in presence frames. A prompt
	// ends it. An addition to DESIGN §7: old clients never send it and
	// ignore the new field.
	FrameTyping = "typing"
)

// You is the caller in a hello frame.
type You struct {
	User string `json:"user"`
	Role Role   `json:"role"`
}

// HelloFrame is the first frame on a WebSocket.
type HelloFrame struct {
	Type    string  `json:"type"` // "hello"
	Session Session `json:"session"`
	You     You     `json:"you"`
	LastSeq Seq     `json:"last_seq"`
}

// EventFrame carries one event. Event holds the event's encoded bytes.
type EventFrame struct {
	Type  string          `json:"type"` // "event"
	Event json.RawMessage `json:"event"`
}

// AppendEventFrame appends the encoding of {"type":"event","event":ev} to b,
// without re-encoding ev. Gateways build each frame once and share it.
func AppendEventFrame(b []byte, ev json.RawMessage) []byte {
	b = append(b, `{"type":"event","event":`...)
	b = append(b, ev...)
	return append(b, '}')
}

// EventsFrame carries several consecutive events, oldest first (only with
// SubprotocolBatch). Events hold the events' encoded bytes.
type EventsFrame struct {
	Type   string            `json:"type"` // "events"
	Events []json.RawMessage `json:"events"`
}

// EventsFrameHead and EventsFrameTail enclose an events frame's events,
// separated by commas: gateways append events to a frame as they go.
const (
	EventsFrameHead = `{"type":"events","events":[`
	EventsFrameTail = `]}`
)

// Watcher is one connection watching a session.
type Watcher struct {
	User  string `json:"user"`
	Conn  string `json:"conn"`
	Since Time   `json:"since"`
	// Typing is set while the watcher's connection is typing a prompt
	// (FrameTyping); omitted otherwise.
	Typing bool `json:"typing,omitempty"`
}

// PresenceFrame lists who is watching now.
type PresenceFrame struct {
	Type     string    `json:"type"` // "presence"
	Watchers []Watcher `json:"watchers"`
}

// AckFrame says a prompt is durable at Seq.
type AckFrame struct {
	Type     string `json:"type"` // "ack"
	ClientID string `json:"client_id"`
	Seq      Seq    `json:"seq"`
}

// ErrorFrame reports a problem with a frame or the session.
type ErrorFrame struct {
	Type     string `json:"type"` // "error"
	Code     Code   `json:"code"`
	Message  string `json:"message"`
	ClientID string `json:"client_id,omitempty"`
}

// ClientFrame is any client → server frame; Type selects which fields apply.
type ClientFrame struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ClientID string `json:"client_id,omitempty"`
	ID       string `json:"id,omitempty"`
	Allow    *bool  `json:"allow,omitempty"`
	// OptionID answers an agent's approval with one of its options
	// (approval_requested.options); it may replace Allow.
	OptionID string `json:"option_id,omitempty"`
	// Typing false in a typing frame says the sender stopped typing
	// (cleared the prompt box); absent or true, that it is typing.
	Typing *bool `json:"typing,omitempty"`
}

// ErrorBody is the body of a REST error response.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// EventsPage is the body of GET /v1/sessions/{id}/events.
type EventsPage struct {
	Events  []json.RawMessage `json:"events"`
	LastSeq Seq               `json:"last_seq"`
	Epoch   string            `json:"epoch"`
}

// Close codes and reasons the gateway uses on WebSockets.
const (
	CloseSlowConsumer = 1008 // policy violation, reason "slow consumer"
	CloseTooBig       = 1009 // message too big
	CloseGoingAway    = 1001 // server shutting down: reconnect and resume
)
