package gateway

import (
	"context"
	"log/slog"

	"github.com/atriumhq/atrium/session/retry"
)

// retryStartup is retry.Startup, the one start-up retry of the node and
// the gateway (which may not import each other): start-up steps that create
// JetStream buckets are retried with backoff, each attempt under its own
// timeout, until they succeed or their context ends (issue 21).
func retryStartup[T any](ctx context.Context, log *slog.Logger, what string, step func(context.Context) (T, error)) (T, error) {
	return retry.Startup(ctx, log, what, step)
}
