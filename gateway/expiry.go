package gateway

import (
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/session"
)

// reasonExpired closes a WebSocket whose credential (an OIDC ID or access
// token, a login cookie, an API token with an expiry) reached its expiry.
const reasonExpired = "credentials expired: log in again and reconnect"

// closeAtExpiry ends w's connection (WebSocket or SSE stream) when the
// credential p was authenticated with expires: a connection outlives no
// token. The returned stop cancels it once the connection ends; a credential
// without an expiry (the dev identity, an API token without one) arms
// nothing. API tokens are also checked again every Config.TokenRecheck for
// revocation.
func (s *Server) closeAtExpiry(w *watcher, p session.Principal) (stop func() bool) {
	if p.Expires.IsZero() {
		return func() bool { return false }
	}
	t := time.AfterFunc(time.Until(p.Expires), func() {
		w.q.finish(ending{code: websocket.StatusPolicyViolation, reason: reasonExpired})
	})
	return t.Stop
}
