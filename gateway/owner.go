package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	msg := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{}}
	msg.Header.Set(session.HeaderUser, p.User)
	if p.Tenant != "" {
		msg.Header.Set(session.HeaderTenant, p.Tenant)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	resp, err := s.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, err
	}
	var reply session.Reply
	if err := json.Unmarshal(resp.Data, &reply); err != nil {
		return nil, fmt.Errorf("decode reply from %s: %w", subj, err)
	}
	if reply.Error != nil {
		return nil, reply.Error
	}
	return &reply, nil
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
// returns errNotActive.
func (s *Server) call(ctx context.Context, p session.Principal, id session.ID, cmd session.Command, activate bool) (*session.Reply, error) {
	for attempt := 0; ; attempt++ {
		reply, err := s.request(ctx, s.subj.Cmd(id), p, cmd)
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
		_, err = s.request(ctx, s.subj.Place(), p, session.PlaceRequest{Op: session.PlaceActivate, Session: id})
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, session.Errorf(session.CodeUnavailable, "no node is available to activate session %s: try again shortly", id)
		}
		if err != nil {
			return nil, natsError(err)
		}
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
// activating it if the catalog allowed p (see access).
func (s *Server) do(ctx context.Context, p session.Principal, id session.ID, act session.Action, cmd session.Command) (*session.Reply, error) {
	a, err := s.check(ctx, p, id, act)
	if err != nil {
		return nil, err
	}
	reply, err := s.call(ctx, p, id, cmd, a.allowed())
	if errors.Is(err, errNotActive) {
		return nil, a.notActive()
	}
	return reply, err
}

// roleIn returns p's role on a catalogued session; none across tenants.
func roleIn(e *session.CatalogEntry, p session.Principal) session.Role {
	if e.Tenant != p.Tenant {
		return session.RoleNone
	}
	if e.Owner == p.User {
		return session.RoleOwner
	}
	return e.Members.RoleOf(p.User)
}

// catalog returns the session catalog bucket, opening it (or creating it
// empty, if no node has yet) on first use.
func (s *Server) catalog(ctx context.Context) (jetstream.KeyValue, error) {
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	bucket := s.subj.CatalogBucket()
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Description: "Atrium session catalog"})
	}
	if err != nil {
		return nil, fmt.Errorf("open catalog %s: %w", bucket, err)
	}
	s.kv = kv
	return kv, nil
}

// catalogGet returns id's catalog entry, or nil if there is none.
func (s *Server) catalogGet(ctx context.Context, id session.ID) (*session.CatalogEntry, error) {
	kv, err := s.catalog(ctx)
	if err != nil {
		return nil, catalogError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	e, err := kv.Get(ctx, string(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, catalogError(fmt.Errorf("read catalog entry %s: %w", id, err))
	}
	var entry session.CatalogEntry
	if err := json.Unmarshal(e.Value(), &entry); err != nil {
		return nil, fmt.Errorf("decode catalog entry %s: %w", id, err)
	}
	return &entry, nil
}

// catalogList returns the catalog entries p has a role on, newest first. It
// reads the bucket with one watcher, which delivers every current value and
// then a nil marker.
func (s *Server) catalogList(ctx context.Context, p session.Principal) ([]session.CatalogEntry, error) {
	kv, err := s.catalog(ctx)
	if err != nil {
		return nil, catalogError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, catalogError(fmt.Errorf("watch catalog: %w", err))
	}
	defer func() { _ = w.Stop() }()
	var out []session.CatalogEntry
	for {
		select {
		case <-ctx.Done():
			return nil, catalogError(fmt.Errorf("read catalog: %w", ctx.Err()))
		case e, ok := <-w.Updates():
			if !ok {
				return nil, catalogError(errors.New("read catalog: watcher stopped"))
			}
			if e == nil {
				sortNewestFirst(out)
				return out, nil
			}
			var entry session.CatalogEntry
			if err := json.Unmarshal(e.Value(), &entry); err != nil {
				s.log.Warn("skip undecodable catalog entry", "key", e.Key(), "err", err)
				continue
			}
			if roleIn(&entry, p).Valid() {
				out = append(out, entry)
			}
		}
	}
}

func sortNewestFirst(es []session.CatalogEntry) {
	slices.SortFunc(es, func(a, b session.CatalogEntry) int {
		if c := b.CreatedAt.Compare(a.CreatedAt.Time); c != 0 {
			return c
		}
		return strings.Compare(string(b.ID), string(a.ID))
	})
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
