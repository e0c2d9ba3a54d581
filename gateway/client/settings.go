package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// SessionPatch asks PatchSession for changes (the body of PATCH
// /v1/sessions/{id}, api.SessionPatch). Nil/empty fields are left as they
// are. Settings are passed as given, so that the server names the keys it
// does not know; "permission_mode" ("ask", "auto-edit" or "auto", agent
// sessions only) takes effect at the agent's next start.
type SessionPatch struct {
	Title    *string
	Settings map[string]any
}

// PatchSession renames a session and/or changes its settings (owner only)
// and returns the session.
func (c *Client) PatchSession(ctx context.Context, id session.ID, p SessionPatch) (session.Session, error) {
	path, err := sessionPath(id, "")
	if err != nil {
		return session.Session{}, err
	}
	body := api.SessionPatch{Title: p.Title}
	if len(p.Settings) > 0 {
		body.Settings = make(map[string]json.RawMessage, len(p.Settings))
		for k, v := range p.Settings {
			b, err := json.Marshal(v)
			if err != nil {
				return session.Session{}, fmt.Errorf("encode setting %s: %w", k, err)
			}
			body.Settings[k] = b
		}
	}
	var s session.Session
	err = c.do(ctx, http.MethodPatch, path, body, &s)
	return s, err
}
