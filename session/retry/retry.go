// Package retry is Atrium's one backoff policy and its start-up retry
// helper, shared by the node (actor) and the gateway, which may not import
// each other. Every retry loop of Atrium waits the same way: exponentially,
// from a first wait up to a cap, each wait jittered to between half and all
// of it ("equal jitter"), so that processes that failed together do not
// retry together and no wait exceeds the cap.
//
// It is built on github.com/cenkalti/backoff/v5, the only dependency the
// session tree allows beside the standard library (deps_test.go). It does
// no I/O besides waiting.
package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy is how a loop retries: it waits Min after the first failure, twice
// as long after each further one up to Max, each wait jittered to between
// half and all of it. Attempts bounds the tries in all (Do); 0 means until
// the context ends.
type Policy struct {
	Min, Max time.Duration
	Attempts int
}

// BackOff returns p as a backoff.BackOff for backoff.Retry: cenkalti's
// ExponentialBackOff centred on three quarters of each wait and randomised
// by a third of it, which spreads it over [½, 1] of the wait. It never
// returns backoff.Stop; Attempts is enforced by the caller (Do).
func (p Policy) BackOff() backoff.BackOff {
	p = p.norm()
	return &clamped{p: p, b: &backoff.ExponentialBackOff{
		InitialInterval:     p.Min * 3 / 4,
		RandomizationFactor: 1.0 / 3,
		Multiplier:          2,
		MaxInterval:         p.Max * 3 / 4,
	}}
}

// Delay returns the wait after the n-th failure (n from 1), for loops that
// pace themselves (a stream's reconnections, a queue's deliveries): a random
// duration in [d/2, d], d = min(Min·2^(n-1), Max).
func (p Policy) Delay(n int) time.Duration {
	b := p.BackOff()
	var d time.Duration
	for range max(n, 1) {
		d = b.NextBackOff()
	}
	return d
}

func (p Policy) norm() Policy {
	if p.Min <= 0 {
		p.Min = time.Millisecond
	}
	if p.Max < p.Min {
		p.Max = p.Min
	}
	return p
}

// clamped keeps ExponentialBackOff's waits within [d/2, d] (d the capped
// exponential wait) against floating-point rounding.
type clamped struct {
	p Policy
	b *backoff.ExponentialBackOff
	n int
}

func (c *clamped) Reset() { c.b.Reset(); c.n = 0 }

func (c *clamped) NextBackOff() time.Duration {
	c.n++
	d := c.p.Max
	if c.n-1 < 62 {
		if v := c.p.Min << (c.n - 1); v > 0 && v < d {
			d = v
		}
	}
	return min(max(c.b.NextBackOff(), d/2), d)
}

// Do calls op until it succeeds, fails with an error retryable rejects
// (nil retryable retries every error), has been called Attempts times, or
// ctx ends, waiting by p between calls. notify, if not nil, is called before
// each wait with the failure, the attempt it ended (from 1) and the wait.
// It returns the number of calls and the last error; when ctx ends first the
// error wraps both ctx's cause and op's last error.
func (p Policy) Do(ctx context.Context, retryable func(error) bool, op func(context.Context) error,
	notify func(err error, attempt int, next time.Duration)) (attempts int, err error) {
	var last error
	opts := []backoff.RetryOption{backoff.WithBackOff(p.BackOff()), backoff.WithMaxElapsedTime(0)}
	if p.Attempts > 0 {
		opts = append(opts, backoff.WithMaxTries(uint(p.Attempts)))
	}
	if notify != nil {
		opts = append(opts, backoff.WithNotify(func(err error, next time.Duration) { notify(err, attempts, next) }))
	}
	_, err = backoff.Retry(ctx, func() (struct{}, error) {
		attempts++
		last = op(ctx)
		if last != nil && retryable != nil && !retryable(last) {
			return struct{}{}, backoff.Permanent(last)
		}
		return struct{}{}, last
	}, opts...)
	if err != nil && last != nil && err != last && !errors.Is(err, last) {
		return attempts, fmt.Errorf("stop retrying: %w (last error: %w)", err, last)
	}
	return attempts, err
}

// StartAttempt bounds one attempt of a start-up step.
const StartAttempt = 10 * time.Second

// StartPolicy paces the attempts of a start-up step: from 100 ms up to 3 s,
// until the context ends.
var StartPolicy = Policy{Min: 100 * time.Millisecond, Max: 3 * time.Second}

// Startup runs a start-up step until it succeeds or ctx ends, each attempt
// under its own StartAttempt timeout, waiting by StartPolicy between
// attempts and logging each failure at warn level with what is being waited
// for. The error on giving up names the step and its last failure.
//
// Steps that talk to JetStream (creating buckets and streams, taking a
// lease) need it: while a NATS cluster forms, or while several processes
// create the same replicated bucket at once, a JetStream API reply can be
// lost, the request then waits for its whole context, and a process that
// gave up there would exit although one more try would succeed (issue 21).
// Each attempt has its own timeout, so one lost reply costs StartAttempt,
// not the whole start.
func Startup[T any](ctx context.Context, log *slog.Logger, what string, step func(context.Context) (T, error)) (T, error) {
	if log == nil {
		log = slog.Default()
	}
	var (
		v    T
		last error
	)
	tries, err := StartPolicy.Do(ctx, nil, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, StartAttempt)
		defer cancel()
		var err error
		v, err = step(actx)
		last = err
		return err
	}, func(err error, attempt int, next time.Duration) {
		log.Warn("start-up step failed; retrying", "step", what, "attempt", attempt, "retry_in", next.Round(time.Millisecond), "err", err)
	})
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && last != nil && last != cause {
			return v, fmt.Errorf("%s: gave up after %d attempts: %w (last error: %v)", what, tries, cause, last)
		}
		return v, fmt.Errorf("%s: %w", what, err)
	}
	if tries > 1 {
		log.Info("start-up step succeeded after retries", "step", what, "attempts", tries)
	}
	return v, nil
}
