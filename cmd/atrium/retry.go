package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	sessionapi "github.com/atriumhq/atrium/session/api"
)

// retryFlags are the retry policy flags of `atrium schedule create` and
// `atrium task run` (sessionapi.RetryPolicy).
type retryFlags struct {
	attempts   int
	backoff    time.Duration
	maxBackoff time.Duration
}

func (f *retryFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.IntVar(&f.attempts, "retry-attempts", 0, fmt.Sprintf(
		"tries in all (up to %d) when the turn fails or times out, not only when the infrastructure does (default: retry infrastructure failures only)", sessionapi.MaxRetryAttempts))
	fs.DurationVar(&f.backoff, "retry-backoff", 0, fmt.Sprintf("wait after the first failed try, doubled each time (default %v)", sessionapi.DefaultRetryBackoff))
	fs.DurationVar(&f.maxBackoff, "retry-max-backoff", 0, fmt.Sprintf("longest wait between tries (default %v)", sessionapi.DefaultRetryMaxBackoff))
}

// policy returns the policy the flags ask for, nil if none; the server
// checks its limits.
func (f *retryFlags) policy(cmd *cobra.Command) (*sessionapi.RetryPolicy, error) {
	if f.attempts == 0 {
		if f.backoff != 0 || f.maxBackoff != 0 {
			return nil, usageError(cmd, "--retry-backoff and --retry-max-backoff need --retry-attempts N (the tries in all)")
		}
		return nil, nil
	}
	p := &sessionapi.RetryPolicy{Attempts: f.attempts}
	if f.backoff != 0 {
		p.Backoff = f.backoff.String()
	}
	if f.maxBackoff != 0 {
		p.MaxBackoff = f.maxBackoff.String()
	}
	return p, nil
}

// retryDetail describes a retry policy in one line.
func retryDetail(p *sessionapi.RetryPolicy) string {
	if p == nil {
		return "infrastructure failures only"
	}
	base, max := p.Delays()
	return fmt.Sprintf("%d attempts, failed or timed-out turns too, backoff %v up to %v", p.Attempts, base, max)
}
