package dlq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/atriumhq/atrium/session"
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

// Backoff retries fn while it returns a transient error: delay Base·2^n with full jitter, capped at
// Max, at most Attempts tries in all. It returns the number of attempts made and the last error.
// Zero fields take the Default values.
type Backoff struct {
	Base, Max time.Duration
	Attempts  int
}

// Do calls fn until it succeeds, returns an error that is not transient, or
// has been called Attempts times; it waits between calls, and gives up
// early if ctx ends (the error then wraps both ctx's error and fn's last).
func (b Backoff) Do(ctx context.Context, fn func(ctx context.Context) error) (attempts int, err error) {
	if b.Base <= 0 {
		b.Base = DefaultBackoffBase
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoffMax
	}
	if b.Attempts <= 0 {
		b.Attempts = DefaultAttempts
	}
	for {
		attempts++
		err = fn(ctx)
		if err == nil || !IsTransient(err) || attempts >= b.Attempts {
			return attempts, err
		}
		t := time.NewTimer(b.delay(attempts - 1))
		select {
		case <-ctx.Done():
			t.Stop()
			return attempts, fmt.Errorf("stop retrying: %w (last error: %w)", context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// delay returns the wait after the n-th failure (from 0): a random
// duration in [0, min(Max, Base·2^n)].
func (b Backoff) delay(n int) time.Duration {
	d := b.Max
	if n < 62 && b.Base <= b.Max>>n {
		d = b.Base << n
	}
	return rand.N(d + 1)
}
