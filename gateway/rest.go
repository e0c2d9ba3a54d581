package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// Limits of GET /v1/sessions/{id}/events.
const (
	DefaultEventsLimit = 100
	MaxEventsLimit     = 1000
)

// createSession serves POST /v1/sessions {"title"?,"harness"?,"agent"?,"egress"?,"settings"?}
// → 201 Session. agent names an ACP agent (the same as "harness":{"agent":…});
// egress (an extension) is the session's own egress allowlist, which the node
// checks against its sandbox.egress_permit. settings takes every key PATCH
// /v1/sessions/{id} takes, with the same errors (400 naming unknown keys, 403
// naming the operator's limit); a refused setting creates no session.
func (s *Server) createSession(w http.ResponseWriter, r *http.Request, p session.Principal) {
	var req api.CreateSession
	if err := decodeBody(w, r, &req, true); err != nil {
		s.fail(w, r, err)
		return
	}
	body := struct {
		Title   string
		Harness session.Harness
		Egress  []string
	}{req.Title, req.Harness.Harness, req.Egress}
	if req.Agent != "" {
		if body.Harness.Agent != "" && body.Harness.Agent != req.Agent {
			s.fail(w, r, session.Errorf(session.CodeBadRequest, `"agent" and "harness":{"agent"} name different agents`))
			return
		}
		body.Harness.Agent = req.Agent
	}
	patch, err := createSettings(req.Settings, &body.Harness, &body.Egress)
	if err == nil && patch != nil {
		err = s.inv.checkSessionCap(patch.InvokeConcurrency)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(body.Title) > session.MaxTitleBytes {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes))
		return
	}
	if err := body.Harness.Validate(); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := checkEgressShape(body.Egress); err != nil {
		s.fail(w, r, err)
		return
	}
	if !p.Limit(session.RoleOwner).AtLeast(session.RoleDriver) {
		err := session.Errorf(session.CodeForbidden, "this credential is limited to the %s role: it cannot create sessions", p.Cap)
		s.auditDenied(r.Context(), remoteOf(r), p, "", "create", nil, err)
		s.fail(w, r, err)
		return
	}
	id := session.NewID()
	reply, err := s.place(r.Context(), p, session.PlaceRequest{
		Op: session.PlaceCreate, Session: id, Title: body.Title, Harness: body.Harness, Egress: body.Egress,
		Settings: patch, // checked against the node's limits before anything is created
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sess := reply.Session
	if patch != nil && (sess == nil || !settingsTaken(patch, sess.Settings)) {
		// A node that predates PlaceRequest.Settings made the session
		// without them: set them now. A refusal deletes the new session,
		// whose id the caller never saw.
		set, err := s.call(r.Context(), p, id, session.Command{Op: session.OpSettings, Settings: patch}, true)
		if err == nil && set.Session == nil {
			err = session.Errorf(session.CodeInternal, "settings reply of session %s has no session", id)
		}
		if err != nil {
			if _, derr := s.call(context.WithoutCancel(r.Context()), p, id, session.Command{Op: session.OpDelete}, true); derr == nil {
				s.cache.forget(id)
			} else {
				s.log.Warn("delete a session whose settings were refused", "session", id, "err", derr)
			}
			s.fail(w, r, err)
			return
		}
		sess = set.Session
	}
	if sess == nil {
		info, err := s.call(r.Context(), p, id, session.Command{Op: session.OpInfo}, true)
		if err == nil && info.Session == nil {
			err = session.Errorf(session.CodeInternal, "info reply of session %s has no session", id)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		sess = info.Session
	}
	s.refreshCatalog(r.Context(), sess.ID)
	e := entry(p, remoteOf(r), audit.ActSessionCreated)
	e.Session = string(sess.ID)
	if body.Harness.Template != "" {
		e.Detail = "harness template " + body.Harness.Template
	} else if body.Harness.Agent != "" {
		e.Detail = "agent " + body.Harness.Agent
	} else if len(body.Harness.Command) > 0 {
		e.Detail = "harness command"
	}
	if len(sess.Egress) > 0 {
		e.Detail += "; egress " + truncateDetail(sess.Egress)
	}
	s.record(r.Context(), e)
	w.Header().Set("Location", "/v1/sessions/"+string(sess.ID))
	writeJSON(w, http.StatusCreated, sess)
}

// listSessions serves GET /v1/sessions from the catalog, never waking a
// session: those the caller has a role on, newest first.
func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, p session.Principal) {
	entries, err := s.catalogList(r.Context(), p)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body := api.SessionList{Sessions: make([]session.Session, 0, len(entries))}
	for i := range entries {
		sess := entries[i].SessionFor(p.User).WithRole(roleIn(&entries[i], p), entries[i].Members)
		body.Sessions = append(body.Sessions, sess)
	}
	writeJSON(w, http.StatusOK, body)
}

// getSession serves GET /v1/sessions/{id}. An active session's owner answers;
// a hibernated one is answered from the catalog and stays asleep.
func (s *Server) getSession(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	a, err := s.check(r.Context(), p, id, session.ActRead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	reply, err := s.call(r.Context(), p, id, session.Command{Op: session.OpInfo}, false)
	if errors.Is(err, errNotActive) && !a.allowed() {
		err = a.notActive()
	}
	switch {
	case errors.Is(err, errNotActive): // and the catalog allowed the caller
		sess := a.entry.SessionFor(p.User).WithRole(roleIn(a.entry, p), a.entry.Members)
		sess.State = session.StateHibernated
		writeJSON(w, http.StatusOK, sess)
	case err != nil:
		s.auditDenied(r.Context(), remoteOf(r), p, id, string(session.OpInfo), a.entry, err)
		s.fail(w, r, err)
	case reply.Session == nil:
		s.fail(w, r, session.Errorf(session.CodeInternal, "info reply of session %s has no session", id))
	default:
		writeJSON(w, http.StatusOK, reply.Session)
	}
}

// deleteSession serves DELETE /v1/sessions/{id} → 204 (owner).
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	if _, err := s.do(r, p, id, session.ActManage, session.Command{Op: session.OpDelete}); err != nil {
		s.fail(w, r, err)
		return
	}
	s.cache.forget(id)
	e := entry(p, remoteOf(r), audit.ActSessionDeleted)
	e.Session = string(id)
	s.record(r.Context(), e)
	w.WriteHeader(http.StatusNoContent)
}

// postMessage serves POST /v1/sessions/{id}/messages {"text","client_id"?} →
// 202 {"seq"} once the message is durable.
func (s *Server) postMessage(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	var body api.Message
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := validatePrompt(body.Text, body.ClientID); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.checkPromptQuota(r.Context(), p, id); err != nil { // tenant quotas (invoke.go)
		s.refuse(w, r, err)
		return
	}
	cmd := session.Command{Op: session.OpPrompt, Text: body.Text, ClientID: body.ClientID}
	ctx := r.Context()
	a, err := s.check(ctx, p, id, session.ActDrive)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// As s.do, but sent with the prompts that other requests make to the
	// session meanwhile (promptbatch.go).
	reply, err := s.prompt(ctx, p, id, cmd, a.allowed())
	if errors.Is(err, errNotActive) {
		err = a.notActive()
	}
	if err != nil {
		s.auditDenied(ctx, remoteOf(r), p, id, string(cmd.Op), a.entry, err)
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, api.Accepted{Seq: reply.Seq})
}

// cancelTurn serves POST /v1/sessions/{id}/cancel → 202.
func (s *Server) cancelTurn(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	var body struct{}
	if err := decodeBody(w, r, &body, true); err != nil {
		s.fail(w, r, err)
		return
	}
	if _, err := s.do(r, p, id, session.ActDrive, session.Command{Op: session.OpCancel}); err != nil {
		s.fail(w, r, err)
		return
	}
	writeRawJSON(w, http.StatusAccepted, []byte("{}\n"))
}

// approve serves POST /v1/sessions/{id}/approvals/{aid} {"allow":bool} or
// {"option_id"} (one of an agent's options) → 202.
func (s *Server) approve(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	aid := r.PathValue("aid")
	var body api.Approval
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.Allow == nil && body.OptionID == "" {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, `body needs "allow": true or false, or an agent's "option_id"`))
		return
	}
	if _, err := s.do(r, p, id, session.ActDrive, session.Command{
		Op: session.OpApprove, ApprovalID: aid, Allow: body.Allow != nil && *body.Allow, OptionID: body.OptionID,
	}); err != nil {
		s.fail(w, r, err)
		return
	}
	writeRawJSON(w, http.StatusAccepted, []byte("{}\n"))
}

// putMember serves PUT /v1/sessions/{id}/members/{user} {"role"} → 200
// {"user","role"} (owner). Role "none" removes the member.
func (s *Server) putMember(w http.ResponseWriter, r *http.Request, p session.Principal) {
	id := session.ID(r.PathValue("id"))
	user := r.PathValue("user")
	if err := session.ValidUser(user); err != nil {
		s.fail(w, r, err)
		return
	}
	var body api.MemberRequest
	if err := decodeBody(w, r, &body, false); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.Role == nil {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, `body needs "role": viewer, driver, owner or none`))
		return
	}
	role, err := session.ParseRole(string(*body.Role))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if _, err := s.do(r, p, id, session.ActManage, session.Command{Op: session.OpMember, User: user, Role: role}); err != nil {
		s.fail(w, r, err)
		return
	}
	s.refreshCatalog(r.Context(), id)
	e := entry(p, remoteOf(r), audit.ActMemberChanged)
	e.Session, e.Target, e.Detail = string(id), user, "role "+string(role)
	if role == session.RoleNone {
		e.Detail = "removed"
	}
	s.record(r.Context(), e)
	writeJSON(w, http.StatusOK, api.Member{User: user, Role: role})
}

// events serves GET /v1/sessions/{id}/events?after=N&limit=M →
// {"events":[…],"last_seq","epoch"}, or an SSE stream when the client
// accepts text/event-stream. Events are the node's bytes, never re-encoded.
func (s *Server) events(w http.ResponseWriter, r *http.Request, p session.Principal) {
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		s.serveSSE(w, r, p)
		return
	}
	id := session.ID(r.PathValue("id"))
	q := r.URL.Query()
	after, err := parseSeq("after", q.Get("after"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit := DefaultEventsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxEventsLimit {
			s.fail(w, r, session.Errorf(session.CodeBadRequest, "limit must be an integer from 1 to %d, not %q", MaxEventsLimit, v))
			return
		}
		limit = n
	}
	a, err := s.check(r.Context(), p, id, session.ActRead)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f := &feed{s: s, p: p, id: id, access: a, limit: limit}
	reply, err := f.open(r.Context(), after)
	if err != nil {
		s.auditDenied(r.Context(), remoteOf(r), p, id, string(session.OpHistory), a.entry, err)
		s.fail(w, r, err)
		return
	}
	events, lastSeq, epoch := reply.Events, reply.LastSeq, reply.Epoch
	for reply.More && len(events) < limit && len(reply.Events) > 0 {
		ev, err := parseEvent(events[len(events)-1], false)
		if err == nil {
			reply, err = s.call(r.Context(), p, id, session.Command{
				Op: session.OpHistory, After: ev.seq, Limit: limit - len(events), MaxBytes: session.DefaultHistoryMaxBytes,
			}, true)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		events = append(events, reply.Events...)
		lastSeq = max(lastSeq, reply.LastSeq)
	}
	if len(events) > limit {
		events = events[:limit]
	}
	// Written by hand so that events stay byte for byte as the node sent
	// them (encoding/json would escape HTML characters inside them).
	n := 64 + len(epoch)
	for _, ev := range events {
		n += len(ev) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"events":[`...)
	for i, ev := range events {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, ev...)
	}
	b = append(b, `],"last_seq":`...)
	b = strconv.AppendInt(b, lastSeq, 10)
	b = append(b, `,"epoch":`...)
	eb, _ := json.Marshal(epoch)
	b = append(b, eb...)
	b = append(b, "}\n"...)
	writeRawJSON(w, http.StatusOK, b)
}
