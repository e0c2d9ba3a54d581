package dlq

import (
	"context"
	"errors"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
	"github.com/nats-io/nats.go"
)

// transientError marks an error as worth retrying.
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// Transient marks err as worth retrying (sandbox failed to start, object store or forge unavailable,
// timeout). IsTransient reports it (also true for context.DeadlineExceeded and for errors that are
// session.Error with code unavailable). Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err}
}

// IsTransient reports whether err is worth retrying: marked by Transient,
// a deadline that passed, a session error with code unavailable, or a NATS
// request that nobody answered in time or at all (no node serves it now).
func IsTransient(err error) bool {
	var t transientError
	switch {
	case err == nil:
		return false
	case errors.As(err, &t),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, session.ErrUnavailable),
		errors.Is(err, session.ErrTooManyRequests), // a quota frees up with time
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders):
		return true
	}
	return false
}

// Defaults of Backoff.
const (
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = time.Minute
	DefaultAttempts    = 5
)

// Backoff retries fn while it returns a transient error, with Atrium's one
// backoff policy (session/retry): a wait of Base·2^n capped at Max,
// jittered to between half and all of it, at most Attempts tries in all.
// Zero fields take the Default values.
type Backoff struct {
	Base, Max time.Duration
	Attempts  int
}

// Do calls fn until it succeeds, returns an error that is not transient, or
// has been called Attempts times; it waits between calls, and gives up
// early if ctx ends (the error then wraps both ctx's error and fn's last).
// It returns the number of attempts made and the last error.
func (b Backoff) Do(ctx context.Context, fn func(ctx context.Context) error) (attempts int, err error) {
	p := retry.Policy{Min: b.Base, Max: b.Max, Attempts: b.Attempts}
	if p.Min <= 0 {
		p.Min = DefaultBackoffBase
	}
	if p.Max <= 0 {
		p.Max = DefaultBackoffMax
	}
	if p.Attempts <= 0 {
		p.Attempts = DefaultAttempts
	}
	return p.Do(ctx, IsTransient, fn, nil)
}
