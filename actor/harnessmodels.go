package actor

import (
	"slices"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// harnessModels gives a harness turn (one process per turn) the node's
// model gateway, as agents have it: a token issued and activated for the
// turn and the gateway's endpoints in the environment, under the names the
// vendors' SDKs and CLIs read (modelEnv). It returns env with them added
// and done, which ends the token; with no model gateway it returns env and
// a no-op. An error (the gateway refused the token) fails the turn.
func (r *runner) harnessModels(env []string) (_ []string, done func(), err error) {
	m := r.h.cfg.Models
	if m == nil {
		return env, func() {}, nil
	}
	token := m.Issue(r.id, r.tenant)
	if err := m.Activate(token, r.turn, r.user); err != nil {
		m.Revoke(token)
		return nil, nil, err
	}
	ep := m.Endpoints()
	ep.Token = token
	return append(slices.Clip(env), modelEnv(ep)...), func() {
		m.Deactivate(token)
		m.Revoke(token)
	}, nil
}

// modelEnv is the environment that points the vendors' SDKs and CLIs at
// ep with ep.Token as their key: only for the endpoints ep has. It holds
// the token: never log it.
func modelEnv(ep compute.ModelEndpoints) []string {
	var env []string
	if ep.Anthropic != "" {
		env = append(env, "ANTHROPIC_BASE_URL="+ep.Anthropic, "ANTHROPIC_API_KEY="+ep.Token)
	}
	if ep.OpenAI != "" {
		env = append(env, "OPENAI_BASE_URL="+ep.OpenAI, "OPENAI_API_KEY="+ep.Token)
	}
	if ep.Gemini != "" {
		env = append(env, "GOOGLE_GEMINI_BASE_URL="+ep.Gemini, "GEMINI_API_KEY="+ep.Token)
	}
	return env
}

// modelsFailed is how a harness turn ends when its model token is refused.
func modelsFailed(err error) *turnExited {
	e := session.AsError(err)
	msg := "the harness may not reach the models: " + e.Message
	return &turnExited{status: session.TurnFailed, code: -1, reason: msg, errors: []session.ErrorData{{Code: e.Code, Message: msg}}}
}
