package actor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Start-up steps that talk to JetStream (creating the buckets and the
// stream, taking the node lease) are retried with backoff until they succeed
// or Start's context ends. While a NATS cluster forms, or while several
// processes create the same replicated bucket at once, a JetStream API reply
// can be lost: the request then waits for its whole context, and a process
// that gave up there would exit although one more try would succeed (issue
// 21: two nodes starting together on a fresh 3-server cluster both exited).
// Each attempt has its own timeout, so one lost reply costs StartAttempt,
// not the whole start.

// StartAttempt bounds one attempt of a start-up step.
const StartAttempt = 10 * time.Second

// Backoff between attempts of a start-up step.
const (
	startRetryMin = 100 * time.Millisecond
	startRetryMax = 3 * time.Second
)

// RetryStartup runs step until it succeeds or ctx ends, each attempt under
// its own StartAttempt timeout, waiting with exponential backoff (jittered,
// from 100 ms up to 3 s) between attempts and logging each failure at warn
// level with what is being waited for. The error on giving up names the
// step and its last failure. It is the one start-up retry of the node and
// of the server's other start-up steps (cmd/atrium/internal/server).
func RetryStartup[T any](ctx context.Context, log *slog.Logger, what string, step func(context.Context) (T, error)) (T, error) {
	if log == nil {
		log = slog.Default()
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = startRetryMin, startRetryMax
	var last error
	tries := 0
	v, err := backoff.Retry(ctx, func() (T, error) {
		tries++
		actx, cancel := context.WithTimeout(ctx, StartAttempt)
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
