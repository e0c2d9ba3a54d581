package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
	"github.com/nats-io/nats.go"
)

// maxActivations is how many times a command activates its session before
// giving up (a session may hibernate again between activation and retry).
const maxActivations = 3

// errNotActive means a command found no actor serving the session and was
// not allowed to activate it.
var errNotActive = errors.New("gateway: session not active")

var errNotFound = session.Errorf(session.CodeNotFound, "session not found")

// request sends body to subj with the principal in headers and decodes the
// reply. A reply carrying an error returns that *session.Error; NATS errors
// are returned as they are (see natsError).
func (s *Server) request(ctx context.Context, subj string, p session.Principal, body any) (*session.Reply, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode request to %s: %w", subj, err)
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: principalHeader(p)}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	ctx, traceEnd := s.traceRequest(ctx, msg, body)
	start := time.Now()
	resp, err := s.nc.RequestMsgWithContext(ctx, msg)
	s.natsRequest(subj, start, err)
	traceEnd(err)
	if err != nil {
		return nil, err
	}
	return decodeReply(subj, resp)
}

// natsError turns a NATS failure into a wire error.
func natsError(err error) error {
	var e *session.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e):
		return e
	case errors.Is(err, nats.ErrNoResponders):
		return session.Errorf(session.CodeUnavailable, "no node is serving sessions: try again shortly")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return session.Errorf(session.CodeUnavailable, "the session did not answer in time: try again")
	case errors.Is(err, context.Canceled):
		return session.Errorf(session.CodeUnavailable, "request cancelled")
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionReconnecting):
		return session.Errorf(session.CodeUnavailable, "the gateway is not connected to NATS: try again shortly")
	}
	return err
}

// call sends cmd to the actor of id. When nobody serves the session it asks
// the nodes to activate it and retries, if activate is set; otherwise it
// returns errNotActive. When the node serving the session stops while
// handling cmd (its lease ends: see requestCmd), cmd is sent again at once if
// it is safe to repeat (see repeatable), and answered unavailable otherwise.
func (s *Server) call(ctx context.Context, p session.Principal, id session.ID, cmd session.Command, activate bool) (*session.Reply, error) {
	placeDeadline := time.Now().Add(placeRetryFor)
	placeRetry := retry.Policy{Min: minPlaceBackoff, Max: maxPlaceBackoff}
	places, failovers := 0, 0
	for attempt := 0; ; attempt++ {
		reply, err := s.requestCmd(ctx, p, id, cmd)
		if errors.Is(err, errStillGone) && time.Now().Before(placeDeadline) {
			// Nobody answered for a node that is gone already: its
			// successor has yet to subscribe. Asked again, the request
			// reaches the successor once it does (see requestCmd).
			attempt--
			continue
		}
		if errors.Is(err, errNodeGone) {
			if !repeatable(cmd) {
				return nil, s.notRepeated(id, cmd, err)
			}
			if failovers == maxFailovers {
				s.metrics.failovers.WithLabelValues(failoverUnavailable).Inc()
				return nil, withCause(session.Errorf(session.CodeUnavailable,
					"the nodes serving session %s stopped %d times while handling the %s command: try again shortly",
					id, failovers+1, cmd.Op), err)
			}
			// Sent again at once: another node serves the session about
			// when its old node's lease ended, or it meets no responders
			// and is placed as below.
			s.metrics.failovers.WithLabelValues(failoverRetried).Inc()
			failovers++
			attempt--
			continue
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			if err != nil {
				return nil, natsError(err)
			}
			return reply, nil
		}
		if !activate {
			return nil, errNotActive
		}
		if attempt == maxActivations {
			return nil, session.Errorf(session.CodeUnavailable, "session %s could not be activated: try again", id)
		}
		err = s.activate(ctx, p, id)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, session.Errorf(session.CodeUnavailable, "no node is available to activate session %s: try again shortly", id)
		}
		if lasting(err) {
			// The node refused for a condition it knows will not pass in
			// the next seconds (its JetStream store is full): the client
			// hears why at once, with Retry-After, instead of after the
			// place retries. Another node would meet the same store: the
			// nodes of a cluster share one JetStream.
			s.metrics.placeRefusals.WithLabelValues(placeRefusalLasting).Inc()
			return nil, natsError(err)
		}
		if errors.Is(err, session.ErrUnavailable) && time.Now().Before(placeDeadline) {
			// Another node holds the session's lease (it is handing the
			// session over, or died and its lease has yet to expire), or
			// the node that answered is shutting down: wait and retry.
			s.metrics.placeRefusals.WithLabelValues(placeRefusalRetried).Inc()
			attempt--
			places++
			if werr := s.waitPlaceRetry(ctx, id, placeRetry.Delay(places)); werr != nil {
				return nil, natsError(werr)
			}
			continue
		}
		if err != nil {
			return nil, natsError(err)
		}
	}
}

// lasting reports whether err is a node's refusal for a condition it knows
// lasts (session.Error.RetryAfterS): retrying it within the place window
// would only delay the answer.
func lasting(err error) bool {
	var e *session.Error
	return errors.As(err, &e) && e.Code == session.CodeUnavailable && e.RetryAfterS > 0
}

// waitPlaceRetry waits d before a place request is retried, or less: until
// the lease of the node the catalog says serves id ends. That node held
// the session; once its lease is gone any node may take it over, so the
// retry goes at once instead of at the end of a backoff of up to a second.
func (s *Server) waitPlaceRetry(ctx context.Context, id session.ID, d time.Duration) error {
	var node string
	if e, ok := s.cache.lookup(id); ok && e != nil {
		node = e.Node
	}
	fctx, stop := s.nodes.follow(ctx, node)
	defer stop()
	err := sleepCtx(fctx, d)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(fctx), errNodeGone) {
		return nil
	}
	return err
}

// maxFailovers is how many times call sends a command again after the node
// serving its session stopped while handling it.
const maxFailovers = 3

// requestCmd sends cmd to id's actor (request). It follows the node that
// serves the session (the catalog's Node, a hint; see nodeLeases): if that
// node's lease ends first, the wait ends at once with an error matching
// errNodeGone.
func (s *Server) requestCmd(ctx context.Context, p session.Principal, id session.ID, cmd session.Command) (*session.Reply, error) {
	var node string
	if e, ok := s.cache.lookup(id); ok && e != nil {
		node = e.Node
	}
	ctx, stop := s.nodes.follow(ctx, node)
	defer stop()
	if node != "" && repeatable(cmd) && s.nodes.isGone(node) {
		// The node the catalog names is gone already: this is a
		// failover's retry, or a command sent before the catalog names
		// the new owner. A frozen node keeps its subscriptions until
		// NATS's ping timeout, so the request may reach only it, and no
		// end of its lease is left to cut the wait: it waited the whole
		// request timeout (10 s) although another node took the session
		// over a moment later (issue 21). Ask for goneNodeWait at most,
		// then again (call).
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, goneNodeWait, fmt.Errorf("node %s: %w", node, errStillGone))
		defer cancel()
	}
	reply, err := s.request(ctx, s.subj.Cmd(id), p, cmd)
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		if cause := context.Cause(ctx); errors.Is(cause, errNodeGone) {
			return nil, cause
		}
	}
	return reply, err
}

// goneNodeWait bounds each wait of a command that is safe to repeat for an
// answer while the node the catalog names for its session is gone (see
// requestCmd); call asks again until the place deadline.
const goneNodeWait = time.Second

// errStillGone means a command got no answer within goneNodeWait while the
// node the catalog names for its session was gone.
var errStillGone = fmt.Errorf("no answer while the node serving the session is gone: %w", errNodeGone)

// notRepeated is the answer to a command that is not safe to repeat whose
// node stopped while handling it (err matches errNodeGone).
func (s *Server) notRepeated(id session.ID, cmd session.Command, err error) error {
	s.metrics.failovers.WithLabelValues(failoverUnavailable).Inc()
	return withCause(session.Errorf(session.CodeUnavailable,
		"the node serving session %s stopped while handling the %s command: it may or may not have been applied; check the session's history before retrying",
		id, cmd.Op), err)
}

// repeatable reports whether cmd may be sent again after the node serving
// its session stopped while handling it: the node may or may not have
// applied it, and sending it again must do no harm either way.
//
//	op             again  why
//	history        yes    a read
//	info           yes    a read
//	secrets        yes    a read (names only)
//	cancel         yes    idempotent: the turn (or the prompt at PromptSeq) is cancelled once; with no
//	                      PromptSeq a repeat may stop the next turn if it started meanwhile
//	approve        yes    idempotent: the same decision on the same approval
//	member         yes    idempotent: sets the user's role to a value
//	egress         yes    idempotent: replaces the allowlist with a value
//	prompt         if a client_id: the new owner dedups it (same seq); without one it could be queued twice
//	prompts        if every prompt has a client_id, as prompt
//	delete         no     applied once, the retry would answer not_found
//	secret_set     no     a value another caller set meanwhile would be overwritten; the secrets list shows whether it was applied
//	secret_delete  no     applied once, the retry would answer not_found
//	pr_opened      no     each one appends an event
//
// Any other op is not repeated.
func repeatable(cmd session.Command) bool {
	switch cmd.Op {
	case session.OpHistory, session.OpInfo, session.OpSecrets,
		session.OpCancel, session.OpApprove, session.OpMember, session.OpEgress:
		return true
	case session.OpPrompt:
		return cmd.ClientID != ""
	case session.OpPrompts:
		for _, p := range cmd.Prompts {
			if p.ClientID == "" {
				return false
			}
		}
		return len(cmd.Prompts) > 0
	}
	return false
}

// activate asks a node to activate id. The node that last held the session
// (its catalog entry's Node, from this gateway's copy: no round trip) is
// asked first on its own place subject: its disk has the history file, so
// waking there costs no restore from object storage and no stream replay.
// If that node is gone (no responders, or its lease ends before it
// answers) the queue group is asked at once.
// Any other answer, unavailable included, is the caller's to handle, as from
// the queue group.
func (s *Server) activate(ctx context.Context, p session.Principal, id session.ID) error {
	req := session.PlaceRequest{Op: session.PlaceActivate, Session: id}
	var node string
	if e, ok := s.cache.lookup(id); ok && e != nil {
		node = e.Node
	}
	if node != "" && s.nodes.isGone(node) {
		// Its lease ended, but it may still be subscribed to its own
		// subject and to the queue group (a frozen process keeps its
		// connection until NATS's ping timeout): ask a node whose lease
		// is live by name instead (issue 21).
		s.metrics.affinity.WithLabelValues(affinityMiss).Inc()
		if other := s.nodes.pick(node); other != "" {
			_, err := s.request(ctx, s.subj.PlaceOn(other), p, req)
			if !errors.Is(err, nats.ErrNoResponders) {
				return err
			}
		}
		_, err := s.request(ctx, s.subj.Place(), p, req)
		return err
	}
	if subj := s.subj.PlaceOn(node); subj != "" {
		// If that node's lease ends before it answers (it died while
		// activating), the queue group is asked as if it were gone:
		// activating twice does no harm.
		nctx, stop := s.nodes.follow(ctx, node)
		_, err := s.request(nctx, subj, p, req)
		if err != nil && errors.Is(context.Cause(nctx), errNodeGone) && ctx.Err() == nil {
			err = nats.ErrNoResponders
		}
		stop()
		if !errors.Is(err, nats.ErrNoResponders) {
			s.metrics.affinity.WithLabelValues(affinityHit).Inc()
			return err
		}
		s.metrics.affinity.WithLabelValues(affinityMiss).Inc()
	} else {
		s.metrics.affinity.WithLabelValues(affinityUnknown).Inc()
	}
	_, err := s.request(ctx, s.subj.Place(), p, req)
	return err
}

// Retrying a place request that a node answered unavailable (lease held
// elsewhere, node shutting down): for at most placeRetryFor, longer than a
// node's default lease TTL plus a takeover's restore, with backoff.
const (
	placeRetryFor   = 10 * time.Second
	minPlaceBackoff = 50 * time.Millisecond
	maxPlaceBackoff = time.Second
)

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// place sends a request to the nodes' queue group.
func (s *Server) place(ctx context.Context, p session.Principal, req session.PlaceRequest) (*session.Reply, error) {
	reply, err := s.request(ctx, s.subj.Place(), p, req)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, session.Errorf(session.CodeUnavailable, "no node is available: try again shortly")
	}
	return reply, natsError(err)
}

// access is what the catalog says about a caller and a session. The node
// writes the catalog after the fact, so the catalog may lag behind a session
// that was just created or a member just added: a denial is final only when
// the session is not active. An active actor is asked instead, and it is
// authoritative.
type access struct {
	entry *session.CatalogEntry // nil: not in the catalog
	deny  error                 // not_found or forbidden; nil: the catalog allows
}

// allowed reports whether the catalog lets the caller in; only then may a
// command activate a hibernated session.
func (a access) allowed() bool { return a.entry != nil && a.deny == nil }

// notActive is the answer when the actor is not active and the catalog did
// not allow the caller.
func (a access) notActive() error {
	if a.deny != nil {
		return a.deny
	}
	return errNotFound
}

// check reads id's catalog entry and checks that p may perform act on it.
// Its error is a catalog failure or not_found for a malformed id.
func (s *Server) check(ctx context.Context, p session.Principal, id session.ID, act session.Action) (access, error) {
	if id.Validate() != nil {
		return access{}, errNotFound
	}
	entry, err := s.catalogGet(ctx, id)
	if err != nil {
		return access{}, err
	}
	if entry == nil {
		return access{deny: errNotFound}, nil
	}
	return access{entry: entry, deny: session.Authorize(roleIn(entry, p), act)}, nil
}

// do checks p may perform act on id, then sends cmd to the session's actor,
// activating it if the catalog allowed p (see access). A refusal for lack of
// role, by the catalog or by the actor, is audited.
func (s *Server) do(r *http.Request, p session.Principal, id session.ID, act session.Action, cmd session.Command) (*session.Reply, error) {
	ctx := r.Context()
	a, err := s.check(ctx, p, id, act)
	if err != nil {
		return nil, err
	}
	reply, err := s.call(ctx, p, id, cmd, a.allowed())
	if errors.Is(err, errNotActive) {
		err = a.notActive()
	}
	if err != nil {
		s.auditDenied(ctx, remoteOf(r), p, id, string(cmd.Op), a.entry, err)
		return nil, err
	}
	return reply, nil
}

// roleIn returns p's role on a catalogued session (session.RoleFor): none
// across tenants, owner for the owner and the tenant's admins, then lowered
// to p's cap.
func roleIn(e *session.CatalogEntry, p session.Principal) session.Role {
	return session.RoleFor(p, e.Tenant, e.Owner, e.Members)
}

// catalogError reports a catalog failure as unavailable; the cause stays in
// the error for logs but is not shown to clients.
func catalogError(err error) error {
	if errors.Is(err, context.Canceled) {
		return session.Errorf(session.CodeUnavailable, "request cancelled")
	}
	return withCause(session.Errorf(session.CodeUnavailable, "the session catalog is unavailable: try again shortly"), err)
}

// causeError is a wire error that keeps its cause for logs.
type causeError struct {
	wire  *session.Error
	cause error
}

func withCause(wire *session.Error, cause error) error { return &causeError{wire: wire, cause: cause} }

func (e *causeError) Error() string   { return e.wire.Error() + ": " + e.cause.Error() }
func (e *causeError) Unwrap() []error { return []error{e.wire, e.cause} }
