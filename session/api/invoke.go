package api

import "github.com/atriumhq/atrium/session"

// The data of the Server-Sent Events of POST /v1/sessions/{id}/invoke
// (docs/automation.md): "start", then "stdout"/"stderr", the turn's agent
// events under their kind, and "exit". Its body is a Message.

// InvokeStart is the data of the "start" event: the prompt is durable at
// Seq and its turn has started.
type InvokeStart struct {
	InvokeID string      `json:"invoke_id"`
	Session  session.ID  `json:"session"`
	Seq      session.Seq `json:"seq"`
	Turn     int64       `json:"turn"`
}

// InvokeText is the data of a "stdout" or "stderr" event.
type InvokeText struct {
	Text string `json:"text"`
}

// InvokeExit is the data of the "exit" event, the stream's last.
type InvokeExit struct {
	ExitCode   int                `json:"exit_code"`
	Status     session.TurnStatus `json:"status"`
	DurationMS int64              `json:"duration_ms"`
}

// InvokeCancel is the body of POST /v1/sessions/{id}/invoke/cancel.
type InvokeCancel struct {
	InvokeID string `json:"invoke_id"`
}
