package client

import (
	"context"
	"net/http"

	"github.com/atriumhq/atrium/session"
)

// SessionPatch is the body of PATCH /v1/sessions/{id}. Nil/empty fields are
// left as they are. Settings are passed as given, so that the server names
// the keys it does not know; "permission_mode" ("ask", "auto-edit" or
// "auto", agent sessions only) takes effect at the agent's next start.
type SessionPatch struct {
	Title    *string        `json:"title,omitempty"`
	Settings map[string]any `json:"settings,omitempty"`
}

// PatchSession renames a session and/or changes its settings (owner only)
// and returns the session.
func (c *Client) PatchSession(ctx context.Context, id session.ID, p SessionPatch) (session.Session, error) {
	path, err := sessionPath(id, "")
	if err != nil {
		return session.Session{}, err
	}
	var s session.Session
	err = c.do(ctx, http.MethodPatch, path, p, &s)
	return s, err
}
