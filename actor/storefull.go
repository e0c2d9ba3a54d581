package actor

import (
	"errors"
	"time"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
)

// storeFullRetryAfter is the wait suggested to a request refused because
// the JetStream store is full (session.Error.RetryAfterS). The store stays
// full until someone frees space (or the NATS operators raise its limits),
// so a gateway that retried the placement for its 10 s only delayed the
// answer (issue 21); the client is told at once, with this hint.
const storeFullRetryAfter = 10 * time.Second

// unavailableFor returns an unavailable error with the formatted message,
// refusing a request because of err. When err says the JetStream store is
// full (it wraps ajs.ErrStoreFull, or is a NATS answer that says so) the
// error carries storeFullRetryAfter: the condition lasts.
func unavailableFor(err error, format string, args ...any) *session.Error {
	e := session.Errorf(session.CodeUnavailable, format, args...)
	if errors.Is(ajs.StoreFull(err), ajs.ErrStoreFull) {
		e.RetryAfterS = int64(storeFullRetryAfter / time.Second)
	}
	return e
}

// noteWrite records the outcome of a write of the node lease: a refusal
// for a full store is kept, to say why the node holds no lease (noLease);
// any other outcome clears it.
func (n *nodeLease) noteWrite(err error) {
	full := ajs.StoreFull(err)
	if !errors.Is(full, ajs.ErrStoreFull) {
		full = nil
	}
	n.mu.Lock()
	n.full = full
	n.mu.Unlock()
}

// noLease is the refusal of a session while the node holds no node lease:
// errNoNodeLease, or, if the lease was lost because the NATS server's store
// is full, that reason with its retry hint (a node whose store is full is
// connected, and saying it is not misleads).
func (n *nodeLease) noLease() error {
	n.mu.Lock()
	full := n.full
	n.mu.Unlock()
	if full == nil {
		return errNoNodeLease
	}
	return unavailableFor(full, "this node cannot take sessions now: its lease could not be renewed: %v; retry", full)
}
