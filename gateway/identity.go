package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// whoami serves GET /v1/whoami → {"user","tenant","admin","via","expires_at"?}.
func (s *Server) whoami(w http.ResponseWriter, r *http.Request, p session.Principal) {
	writeJSON(w, http.StatusOK, api.Whoami{User: p.User, Tenant: p.Tenant, Admin: p.Admin, Via: p.Via, ExpiresAt: p.Expires.UTC()})
}

// createToken serves POST /v1/tokens {"name","expires_at"?,"role"?} → 201
// {"token","info"}: the only answer that holds the token's secret.
func (s *Server) createToken(w http.ResponseWriter, r *http.Request, p session.Principal) {
	var body api.TokenRequest
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	req := auth.TokenRequest{Name: body.Name}
	if body.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339, body.ExpiresAt)
		if err != nil {
			s.fail(w, r, session.Errorf(session.CodeBadRequest,
				"expires_at must be an RFC 3339 time such as 2030-01-31T00:00:00Z, not %q", body.ExpiresAt))
			return
		}
		req.ExpiresAt = t
	}
	role, err := session.ParseRole(string(body.Role))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req.Role = role
	tok, info, err := s.tokens.Create(r.Context(), p, req)
	if err != nil {
		if session.AsError(err).Code == session.CodeForbidden {
			e := entry(p, remoteOf(r), audit.ActDenied)
			e.Outcome, e.Detail = audit.Denied, "create token: "+session.AsError(err).Message
			s.record(r.Context(), e)
		}
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), audit.ActTokenCreated)
	e.Target, e.Detail = info.ID, tokenDetail(info)
	s.record(r.Context(), e)
	writeJSON(w, http.StatusCreated, api.NewToken{Token: tok, Info: info})
}

// tokenDetail describes a token for the audit log: never its secret.
func tokenDetail(info auth.TokenInfo) string {
	d := fmt.Sprintf("token %q of %s", info.Name, info.User)
	if info.Role != session.RoleNone {
		d += ", limited to " + string(info.Role)
	}
	if !info.ExpiresAt.IsZero() {
		d += ", expires " + info.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return d
}

// listTokens serves GET /v1/tokens[?all=1] → {"tokens":[TokenInfo…]}: the
// caller's tokens, or with all=1 every token of a tenant admin's tenant.
func (s *Server) listTokens(w http.ResponseWriter, r *http.Request, p session.Principal) {
	all, err := parseFlag("all", r.URL.Query().Get("all"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	infos, err := s.tokens.List(r.Context(), p, all)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.TokenList{Tokens: infos})
}

// revokeToken serves DELETE /v1/tokens/{id} → 204: the caller's own token,
// or for a tenant admin any token of its tenant.
func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, p session.Principal) {
	info, err := s.tokens.Revoke(r.Context(), p, r.PathValue("id"))
	if err != nil {
		if session.AsError(err).Code == session.CodeForbidden {
			e := entry(p, remoteOf(r), audit.ActDenied)
			e.Outcome, e.Target, e.Detail = audit.Denied, r.PathValue("id"), "revoke token: "+session.AsError(err).Message
			s.record(r.Context(), e)
		}
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), audit.ActTokenRevoked)
	e.Target, e.Detail = info.ID, tokenDetail(info)
	s.record(r.Context(), e)
	w.WriteHeader(http.StatusNoContent)
}

// listAudit serves GET /v1/audit?cursor=&limit=&actor=&action=&session=&since=&until=
// → {"entries":[Entry…],"next"}, newest first: the caller's tenant's log,
// for tenant admins only.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request, p session.Principal) {
	if !p.Admin {
		err := session.Errorf(session.CodeForbidden, "the audit log is for tenant admins")
		e := entry(p, remoteOf(r), audit.ActDenied)
		e.Outcome, e.Detail = audit.Denied, "read audit log: "+err.Message
		if ok, _ := s.denials.allow(p.Tenant+"\x00"+p.User+"\x00\x00audit", time.Now()); ok {
			s.record(r.Context(), e)
		}
		s.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	f := audit.Filter{Actor: q.Get("actor"), Action: q.Get("action"), Session: q.Get("session"), Cursor: q.Get("cursor")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > audit.MaxLimit {
			s.fail(w, r, session.Errorf(session.CodeBadRequest, "limit must be an integer from 1 to %d, not %q", audit.MaxLimit, v))
			return
		}
		f.Limit = n
	}
	for _, t := range []struct {
		name string
		to   *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		v := q.Get(t.name)
		if v == "" {
			continue
		}
		tm, err := time.Parse(time.RFC3339, v)
		if err != nil {
			s.fail(w, r, session.Errorf(session.CodeBadRequest, "%s must be an RFC 3339 time such as 2030-01-31T00:00:00Z, not %q", t.name, v))
			return
		}
		*t.to = tm
	}
	entries, next, err := s.audit.List(r.Context(), p.Tenant, f)
	if err != nil {
		if session.AsError(err).Code == session.CodeInternal {
			err = withCause(session.Errorf(session.CodeUnavailable, "the audit log is unavailable: try again shortly"), err)
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.AuditPage{Entries: entries, Next: next})
}

// parseFlag parses a boolean query value; empty is false.
func parseFlag(name, v string) (bool, error) {
	switch v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, session.Errorf(session.CodeBadRequest, "%s must be 1 or 0, not %q", name, v)
}
