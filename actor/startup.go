package actor

import (
	"context"
	"log/slog"

	"github.com/atriumhq/atrium/session/retry"
)

// Start-up steps that talk to JetStream (creating the buckets and the
// stream, taking the node lease) are retried by retry.Startup, the one
// start-up retry of the node and the gateway (session/retry says why).

// StartAttempt bounds one attempt of a start-up step.
const StartAttempt = retry.StartAttempt

// RetryStartup is retry.Startup under the node's name for it: it runs step
// until it succeeds or ctx ends, each attempt under StartAttempt, with
// retry.StartPolicy's backoff and a warning per failure
// (cmd/atrium/internal/server uses it for the server's other steps too).
func RetryStartup[T any](ctx context.Context, log *slog.Logger, what string, step func(context.Context) (T, error)) (T, error) {
	return retry.Startup(ctx, log, what, step)
}
