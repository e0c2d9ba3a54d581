package session

import (
	"bytes"
	"encoding/json"
)

// HarnessInput is the first stdin line of a turn (harness contract, DESIGN §6).
type HarnessInput struct {
	Session ID     `json:"session"`
	Turn    int64  `json:"turn"`
	Prompt  string `json:"prompt"`
	By      string `json:"by"`
}

// ApprovalAnswer is a later stdin line: a driver's answer to an approval
// request.
type ApprovalAnswer struct {
	Type  string `json:"type"` // "approval"
	ID    string `json:"id"`
	Allow bool   `json:"allow"`
	// OptionID is the chosen option of an agent's approval; never set
	// on a harness's stdin.
	OptionID string `json:"option_id,omitempty"`
}

// HarnessLine is a parsed stdout line.
type HarnessLine struct {
	// Object is the harness object when the line is a JSON object with a
	// string field "type"; nil otherwise (the line is plain output).
	Object map[string]json.RawMessage
	// Type is the object's "type".
	Type string
	// ApprovalID and Summary are set when Type is "approval_request".
	ApprovalID, Summary string
}

// ParseHarnessLine classifies one stdout line (without its newline). A JSON
// object with a string "type" is an agent object; an approval_request must
// also carry a string "id" (else it is an ordinary agent object).
func ParseHarnessLine(line []byte) HarnessLine {
	t := bytes.TrimSpace(line)
	if len(t) < 2 || t[0] != '{' || t[len(t)-1] != '}' {
		return HarnessLine{}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(t, &obj); err != nil {
		return HarnessLine{}
	}
	var typ string
	if raw, ok := obj["type"]; !ok || json.Unmarshal(raw, &typ) != nil {
		return HarnessLine{}
	}
	hl := HarnessLine{Object: obj, Type: typ}
	if typ == "approval_request" {
		var id, summary string
		if json.Unmarshal(obj["id"], &id) == nil && id != "" {
			_ = json.Unmarshal(obj["summary"], &summary)
			hl.ApprovalID, hl.Summary = id, summary
		}
	}
	return hl
}

// Harness environment variables.
const (
	EnvSession = "ATRIUM_SESSION"
	EnvTurn    = "ATRIUM_TURN"
	// EnvPrompt carries the prompt for the built-in shell template only.
	EnvPrompt = "ATRIUM_PROMPT"
	// EnvPreviousTurn tells a harness how the session's previous turn
	// ended: a JSON object {"turn":N,"status":"ok|failed|cancelled|timeout",
	// "exit_code":N,"reason":TEXT} (reason only when the node logged one,
	// such as the sandbox dying). It is set from the second turn on, so a
	// harness whose previous run was cut short knows it (DESIGN §4: history
	// is the source of truth).
	EnvPreviousTurn = "ATRIUM_PREVIOUS_TURN"
)
