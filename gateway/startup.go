package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Start-up steps that create JetStream buckets are retried with backoff, each
// attempt under its own timeout, until they succeed or their context ends:
// while a NATS cluster forms, or while several processes create one
// replicated bucket at once, a JetStream API reply can be lost, and the
// request then waits for its whole context (issue 21). This is the gateway's
// twin of actor.RetryStartup, with the same policy: the two packages may not
// import each other (deps_test.go).

// startAttempt bounds one attempt of a start-up step.
const startAttempt = 10 * time.Second

// Backoff between attempts of a start-up step.
const (
	startRetryMin = 100 * time.Millisecond
	startRetryMax = 3 * time.Second
)

// retryStartup runs step until it succeeds or ctx ends, each attempt under
// startAttempt, with jittered exponential backoff between attempts and a
// warning per failure. The error on giving up names the step and its last
// failure.
func retryStartup[T any](ctx context.Context, log *slog.Logger, what string, step func(context.Context) (T, error)) (T, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = startRetryMin, startRetryMax
	var last error
	tries := 0
	v, err := backoff.Retry(ctx, func() (T, error) {
		tries++
		actx, cancel := context.WithTimeout(ctx, startAttempt)
		defer cancel()
		v, err := step(actx)
		if err != nil {
			last = err
		}
		return v, err
	},
		backoff.WithBackOff(b),
		backoff.WithMaxElapsedTime(0), // until ctx ends
		backoff.WithNotify(func(err error, next time.Duration) {
			log.Warn("start-up step failed; retrying", "step", what, "attempt", tries, "retry_in", next.Round(time.Millisecond), "err", err)
		}),
	)
	if err != nil {
		if last != nil && last != err {
			return v, fmt.Errorf("%s: gave up after %d attempts: %w (last error: %v)", what, tries, err, last)
		}
		return v, fmt.Errorf("%s: %w", what, err)
	}
	if tries > 1 {
		log.Info("start-up step succeeded after retries", "step", what, "attempts", tries)
	}
	return v, nil
}
