package gateway

import (
	"context"
	"net/http"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/session"
)

// reasonRestart is the close reason of WebSockets ended by Drain.
const reasonRestart = "reconnect"

// Drain closes the gateway for a restart: every WebSocket is closed with
// 1012 (service restart) and reason "reconnect", so clients reconnect (to
// another gateway behind the same address) and resume by cursor; SSE streams
// end, and their clients reconnect with Last-Event-ID. Then it is Close.
// The caller shuts its HTTP server down afterwards.
func (s *Server) Drain(ctx context.Context) error {
	s.draining.Store(true)
	return s.Close(ctx)
}

// shutdownEnding is how a connection ends when the gateway stops: 1012
// "reconnect" when it drains, 1001 otherwise.
func (s *Server) shutdownEnding() ending {
	if s.draining.Load() {
		return ending{code: websocket.StatusServiceRestart, reason: reasonRestart}
	}
	return ending{code: websocket.StatusGoingAway, reason: reasonShutdown}
}

// serveCluster serves GET /v1/cluster: the cluster's nodes, their sessions
// and NATS's health, for operators. The dev identity may read it too: it is
// loopback-only and may act as anyone anyway. A tenant admin who is not an
// operator reads only what concerns the tenant's own sessions.
func (s *Server) serveCluster(w http.ResponseWriter, r *http.Request, p session.Principal) {
	var (
		st  any
		err error
	)
	switch {
	case p.Operator || p.Via == session.ViaDev:
		st, err = s.cluster(r.Context())
	case p.Admin && s.tenantCluster != nil:
		st, err = s.tenantCluster(r.Context(), p.Tenant)
	default:
		s.fail(w, r, session.Errorf(session.CodeForbidden,
			"the cluster status is for operators (and, for their own sessions, tenant admins): "+
				"ask your administrator to add you to the operator group"))
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}
