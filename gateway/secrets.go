package gateway

import (
	"net/http"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// Audit actions of session secrets and egress allowlists.
const (
	ActSecretSet     = "secret_set"
	ActSecretDeleted = "secret_deleted"
	ActEgressSet     = "egress_set"
)

// putSecret serves PUT /v1/sessions/{id}/secrets/{name} {"value"} → 204
// (owner). The value goes to the session's node and nowhere else: it is
// never logged, audited or echoed.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	name := r.PathValue("name")
	if err := session.ValidSecretName(name); err != nil {
		s.fail(w, r, err)
		return
	}
	var body api.SecretValue
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.Value == nil {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, `body needs "value": the secret as a string`))
		return
	}
	if len(*body.Value) > session.MaxSecretBytes {
		s.fail(w, r, session.Errorf(session.CodePayloadTooLarge, "a secret's value is at most %d bytes", session.MaxSecretBytes))
		return
	}
	if _, err := s.do(r, p, id, session.ActManage, session.Command{Op: session.OpSecretSet, Name: name, Value: *body.Value}); err != nil {
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), ActSecretSet)
	e.Session, e.Target = string(id), name
	s.record(r.Context(), e)
	w.WriteHeader(http.StatusNoContent)
}

// deleteSecret serves DELETE /v1/sessions/{id}/secrets/{name} → 204 (owner).
func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	name := r.PathValue("name")
	if err := session.ValidSecretName(name); err != nil {
		s.fail(w, r, err)
		return
	}
	if _, err := s.do(r, p, id, session.ActManage, session.Command{Op: session.OpSecretDelete, Name: name}); err != nil {
		s.fail(w, r, err)
		return
	}
	e := entry(p, remoteOf(r), ActSecretDeleted)
	e.Session, e.Target = string(id), name
	s.record(r.Context(), e)
	w.WriteHeader(http.StatusNoContent)
}

// listSecrets serves GET /v1/sessions/{id}/secrets →
// {"secrets":[{"name","updated_at","updated_by"}]} (owner): never values.
func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	reply, err := s.do(r, p, id, session.ActManage, session.Command{Op: session.OpSecrets})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body := api.SecretList{Secrets: reply.Secrets}
	if body.Secrets == nil {
		body.Secrets = []session.SecretInfo{}
	}
	writeJSON(w, http.StatusOK, body)
}

// putEgress serves PUT /v1/sessions/{id}/egress {"allow":[…]} → 200 Session
// (owner). The node checks the entries against its sandbox.egress_permit;
// the sandbox gets them the next time it is opened (at the next turn).
func (s *Server) putEgress(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	var body api.Egress
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.Allow == nil {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, `body needs "allow": a list of host names (empty to remove the session's own egress)`))
		return
	}
	if err := checkEgressShape(*body.Allow); err != nil {
		s.fail(w, r, err)
		return
	}
	reply, err := s.do(r, p, id, session.ActManage, session.Command{Op: session.OpEgress, Egress: *body.Allow})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if reply.Session == nil {
		s.fail(w, r, session.Errorf(session.CodeInternal, "egress reply of session %s has no session", id))
		return
	}
	e := entry(p, remoteOf(r), ActEgressSet)
	e.Session = string(id)
	e.Detail = truncateDetail(reply.Session.Egress)
	s.record(r.Context(), e)
	writeJSON(w, http.StatusOK, reply.Session)
}

// checkEgressShape bounds an egress list; the node validates the entries.
func checkEgressShape(entries []string) error {
	if len(entries) > session.MaxEgressEntries {
		return session.Errorf(session.CodeBadRequest, "an egress allowlist has at most %d entries", session.MaxEgressEntries)
	}
	for _, e := range entries {
		if len(e) > 300 {
			return session.Errorf(session.CodeBadRequest, "egress entry %.40q… is too long", e)
		}
	}
	return nil
}

// truncateDetail renders an allowlist for an audit entry's detail.
func truncateDetail(entries []string) string {
	d := "allow"
	for _, e := range entries {
		if len(d)+1+len(e) > 200 {
			return d + " …"
		}
		d += " " + e
	}
	if len(entries) == 0 {
		d = "allow nothing of its own"
	}
	return d
}
