package gateway

// The routes of outbound webhooks (gateway/hooks): their subscriptions and
// delivery log. They are handlers of hookRoutes, not methods of Server: the
// server only mounts them (mountChannels).

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/atriumhq/atrium/gateway/hooks"
	"github.com/atriumhq/atrium/session"
)

// hookRoutes are the handlers of the outbound webhook routes.
type hookRoutes struct {
	s *Server   // the front door: authentication, errors, audit
	c *channels // with hooks set
}

// mount registers the routes on mux.
func (rt hookRoutes) mount(mux *http.ServeMux) {
	s := rt.s
	mux.Handle("GET /v1/hooks/deliveries", s.authed(rt.listDeliveries))
	mux.Handle("GET /v1/sessions/{id}/hooks", s.authed(rt.listSubscriptions))
	mux.Handle("PUT /v1/sessions/{id}/hooks/{target}", s.authed(rt.subscribe))
	mux.Handle("DELETE /v1/sessions/{id}/hooks/{target}", s.authed(rt.unsubscribe))
}

// listDeliveries serves GET /v1/hooks/deliveries?session=ID&limit=N →
// {"deliveries":[Delivery…]}: the outbound webhook log of a session, for
// its owners (and tenant admins).
func (rt hookRoutes) listDeliveries(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := rt.s
	q := r.URL.Query()
	id := session.ID(q.Get("session"))
	if id == "" {
		s.fail(w, r, session.Errorf(session.CodeBadRequest, "give the session: /v1/hooks/deliveries?session=<id>"))
		return
	}
	limit := DefaultEventsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > hooks.MaxDeliveries {
			s.fail(w, r, session.Errorf(session.CodeBadRequest, "limit must be an integer from 1 to %d, not %q", hooks.MaxDeliveries, v))
			return
		}
		limit = n
	}
	if !rt.manages(w, r, p, id, "read webhook deliveries") {
		return
	}
	ds, err := rt.c.hooks.Deliveries(r.Context(), id, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Deliveries []hooks.Delivery `json:"deliveries"`
	}{ds})
}

// listSubscriptions serves GET /v1/sessions/{id}/hooks → {"hooks":[{"target","kinds"}…]} (owner).
func (rt hookRoutes) listSubscriptions(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := rt.s
	id := session.ID(r.PathValue("id"))
	if !rt.manages(w, r, p, id, "read webhook subscriptions") {
		return
	}
	subs, err := rt.c.svc.Subscriptions(r.Context(), id)
	if err != nil {
		s.fail(w, r, withCause(session.Errorf(session.CodeUnavailable, "webhook subscriptions are unavailable: try again shortly"), err))
		return
	}
	if subs == nil {
		subs = []channel.Subscription{}
	}
	writeJSON(w, http.StatusOK, struct {
		Hooks []channel.Subscription `json:"hooks"`
	}{subs})
}

// subscribe serves PUT /v1/sessions/{id}/hooks/{target} {"kinds"?:[…]} → 200
// {"target","kinds"} (owner): the session's events of those kinds (all,
// if none) are delivered to the configured target from now on.
func (rt hookRoutes) subscribe(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := rt.s
	id, target := session.ID(r.PathValue("id")), r.PathValue("target")
	var body struct {
		Kinds []session.Kind `json:"kinds"`
	}
	if err := decodeBody(w, r, &body, true); err != nil {
		s.fail(w, r, err)
		return
	}
	if !rt.c.hooks.HasTarget(target) {
		s.fail(w, r, session.Errorf(session.CodeNotFound, "there is no webhook target named %q: targets are configured by the operator", target))
		return
	}
	if !rt.manages(w, r, p, id, "subscribe to webhooks") {
		return
	}
	sub := channel.Subscription{Target: target, Kinds: body.Kinds}
	if err := rt.c.svc.Subscribe(r.Context(), p, id, sub); err != nil {
		s.fail(w, r, channelError(err))
		return
	}
	e := entry(p, remoteOf(r), actWebhookSubscribed)
	e.Session, e.Target, e.Detail = string(id), target, fmt.Sprintf("kinds %v", body.Kinds)
	s.record(r.Context(), e)
	writeJSON(w, http.StatusOK, sub)
}

// unsubscribe serves DELETE /v1/sessions/{id}/hooks/{target} → 204 (owner).
func (rt hookRoutes) unsubscribe(w http.ResponseWriter, r *http.Request, p session.Principal) {
	s := rt.s
	id, target := session.ID(r.PathValue("id")), r.PathValue("target")
	if !rt.manages(w, r, p, id, "unsubscribe from webhooks") {
		return
	}
	if err := rt.c.svc.Unsubscribe(r.Context(), id, target); err != nil {
		s.fail(w, r, channelError(err))
		return
	}
	e := entry(p, remoteOf(r), actWebhookUnsubscribed)
	e.Session, e.Target = string(id), target
	s.record(r.Context(), e)
	w.WriteHeader(http.StatusNoContent)
}

// manages checks that p owns session id, answering the request if not.
func (rt hookRoutes) manages(w http.ResponseWriter, r *http.Request, p session.Principal, id session.ID, what string) bool {
	s := rt.s
	a, err := s.check(r.Context(), p, id, session.ActManage)
	if err == nil {
		err = a.deny
	}
	if err != nil {
		s.auditDenied(r.Context(), remoteOf(r), p, id, what, a.entry, err)
		s.fail(w, r, err)
		return false
	}
	return true
}
