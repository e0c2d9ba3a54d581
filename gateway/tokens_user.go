package gateway

import (
	"net/http"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// revokeUserTokens serves DELETE /v1/tokens?user=U → 200 {"tokens":[TokenInfo…]}:
// every API token of user U in the caller's tenant is revoked (the caller's
// own, or any user's for a tenant admin), with one audit entry per token.
// Open connections of those tokens are closed at the next token recheck.
func (s *Server) revokeUserTokens(w http.ResponseWriter, r *http.Request, p session.Principal) {
	user := r.URL.Query().Get("user")
	if user == "" {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, "DELETE /v1/tokens needs ?user=<user> (or DELETE /v1/tokens/<id> for one token)"))
		return
	}
	infos, err := s.tokens.RevokeUser(r.Context(), p, user)
	for _, info := range infos {
		e := entry(p, remoteOf(r), audit.ActTokenRevoked)
		e.Target, e.Detail = info.ID, tokenDetail(info)
		s.record(r.Context(), e)
	}
	if err != nil {
		if session.AsError(err).Code == session.CodeForbidden {
			e := entry(p, remoteOf(r), audit.ActDenied)
			e.Outcome, e.Target, e.Detail = audit.Denied, user, "revoke tokens of user: "+session.AsError(err).Message
			s.record(r.Context(), e)
		}
		s.fail(w, r, err)
		return
	}
	if infos == nil {
		infos = []auth.TokenInfo{}
	}
	writeJSON(w, http.StatusOK, api.TokenList{Tokens: infos})
}
