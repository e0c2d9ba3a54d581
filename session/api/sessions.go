package api

import (
	"encoding/json"

	"github.com/atriumhq/atrium/session"
)

// CreateSession is the body of POST /v1/sessions.
type CreateSession struct {
	Title string `json:"title,omitempty"`
	// Harness is what runs once per turn: a template name or
	// {"template"|"command","stdin"}. Its Agent and PermissionMode travel
	// in Agent and Settings.
	Harness HarnessSpec `json:"harness,omitzero"`
	// Agent names an ACP agent (the same as "harness":{"agent":…}).
	Agent string `json:"agent,omitempty"`
	// Egress is the session's own egress allowlist, checked by the node
	// against its sandbox.egress_permit.
	Egress []string `json:"egress,omitempty"`
	// Settings are the new session's settings: every key PATCH
	// /v1/sessions/{id} accepts (SessionPatch.Settings), with the same
	// validation; kept raw so that the server can name unknown keys.
	Settings map[string]json.RawMessage `json:"settings,omitempty"`
}

// HarnessSpec is a harness as POST /v1/sessions carries it. It encodes a
// template without a stdin mode as its bare name ("shell") and anything
// else as an object; it decodes both forms (session.Harness's rules).
type HarnessSpec struct{ session.Harness }

// IsZero reports whether no harness is given (the server's default).
func (h HarnessSpec) IsZero() bool {
	return h.Template == "" && h.Command == nil && h.Agent == "" && h.Stdin == "" && h.PermissionMode == ""
}

// MarshalJSON encodes the wire form.
func (h HarnessSpec) MarshalJSON() ([]byte, error) {
	if h.Template != "" && h.Command == nil && h.Agent == "" && h.Stdin == "" && h.PermissionMode == "" {
		return json.Marshal(h.Template)
	}
	return json.Marshal(h.Harness)
}

// UnmarshalJSON accepts "name" or {"template"|"command"|"agent",…}.
func (h *HarnessSpec) UnmarshalJSON(b []byte) error { return h.Harness.UnmarshalJSON(b) }

// SessionList answers GET /v1/sessions.
type SessionList struct {
	Sessions []session.Session `json:"sessions"`
}

// SessionPatch is the body of PATCH /v1/sessions/{id}. Nil/empty fields
// are left as they are. Settings are kept raw so that the server can name
// the keys it does not know and say what is wrong with a value.
type SessionPatch struct {
	Title    *string                    `json:"title,omitempty"`
	Settings map[string]json.RawMessage `json:"settings,omitempty"`
}

// Message is the body of POST /v1/sessions/{id}/messages and of POST
// /v1/sessions/{id}/invoke.
type Message struct {
	Text     string `json:"text"`
	ClientID string `json:"client_id,omitempty"`
}

// Accepted answers POST /v1/sessions/{id}/messages: the message is durable
// at Seq.
type Accepted struct {
	Seq session.Seq `json:"seq"`
}

// Approval is the body of POST /v1/sessions/{id}/approvals/{aid}: Allow,
// or one of the agent's options.
type Approval struct {
	Allow    *bool  `json:"allow,omitempty"`
	OptionID string `json:"option_id,omitempty"`
}

// MemberRequest is the body of PUT /v1/sessions/{id}/members/{user}; role
// "none" (or "") removes the member.
type MemberRequest struct {
	Role *session.Role `json:"role"`
}

// Member answers PUT /v1/sessions/{id}/members/{user}.
type Member struct {
	User string       `json:"user"`
	Role session.Role `json:"role"`
}

// SecretValue is the body of PUT /v1/sessions/{id}/secrets/{name}.
type SecretValue struct {
	Value *string `json:"value"`
}

// SecretList answers GET /v1/sessions/{id}/secrets: names, never values.
type SecretList struct {
	Secrets []session.SecretInfo `json:"secrets"`
}

// Egress is the body of PUT /v1/sessions/{id}/egress: the session's own
// egress allowlist (empty to remove it).
type Egress struct {
	Allow *[]string `json:"allow"`
}

// Fork is the body of POST /v1/sessions/{id}/fork.
type Fork struct {
	// AtSeq is the parent's last event the fork keeps; nil means all.
	AtSeq *session.Seq `json:"at_seq,omitempty"`
	Title string       `json:"title,omitempty"`
}

// QuotaRefusal is the body of a 429 answer to a prompt or an invoke that a
// tenant quota refuses: an ErrorBody whose error also names the quota, its
// limit and scope, and when to retry (as Retry-After does).
type QuotaRefusal struct {
	Error QuotaError `json:"error"`
}

// QuotaError is the error member of a QuotaRefusal; Code is
// too_many_requests.
type QuotaError struct {
	Code        session.Code `json:"code"`
	Message     string       `json:"message"`
	Quota       string       `json:"quota"`
	Limit       int          `json:"limit"`
	Scope       string       `json:"scope"`
	RetryAfterS int64        `json:"retry_after_s"`
}
