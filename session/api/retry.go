package api

import (
	"time"

	"github.com/atriumhq/atrium/session"
)

// Limits and defaults of a RetryPolicy.
const (
	// MaxRetryAttempts is the most tries a policy may ask for.
	MaxRetryAttempts = 10
	// DefaultRetryBackoff is the wait before the second try.
	DefaultRetryBackoff = 30 * time.Second
	// DefaultRetryMaxBackoff caps the wait between tries.
	DefaultRetryMaxBackoff = 10 * time.Minute
	// MaxRetryBackoff is the longest wait a policy may ask for.
	MaxRetryBackoff = 6 * time.Hour
)

// RetryPolicy is how a background run (a schedule's run, a repository task)
// is tried again when its turn fails or times out: the agent's failure, not
// only the infrastructure's. Without a policy only infrastructure failures
// (a sandbox that did not start, a node or forge that did not answer) are
// retried, with the server's own backoff. The "retry" field of POST
// /v1/schedules and POST /v1/tasks (docs/automation.md).
type RetryPolicy struct {
	// Attempts is the number of tries in all, from 1 to MaxRetryAttempts;
	// a try that failed for a reason retrying cannot fix (no permission,
	// a bad request) is not repeated.
	Attempts int `json:"attempts"`
	// Backoff is the wait after the first failed try, a Go duration such
	// as "30s"; each later wait doubles, up to MaxBackoff, and is jittered
	// (between half and all of it, session/retry). Defaults DefaultRetryBackoff and
	// DefaultRetryMaxBackoff.
	Backoff    string `json:"backoff,omitempty"`
	MaxBackoff string `json:"max_backoff,omitempty"`
}

// Validate checks p: a *session.Error with code bad_request saying what is
// wrong.
func (p RetryPolicy) Validate() error {
	if p.Attempts < 1 || p.Attempts > MaxRetryAttempts {
		return session.Errorf(session.CodeBadRequest, "retry.attempts must be from 1 to %d, not %d", MaxRetryAttempts, p.Attempts)
	}
	base, max, err := p.parse()
	if err != nil {
		return err
	}
	if max < base {
		return session.Errorf(session.CodeBadRequest, "retry.max_backoff %v is shorter than retry.backoff %v", max, base)
	}
	return nil
}

// Delays returns the policy's first wait and its cap, defaults filled in;
// p must be valid.
func (p RetryPolicy) Delays() (base, max time.Duration) {
	base, max, _ = p.parse()
	return base, max
}

func (p RetryPolicy) parse() (base, max time.Duration, err error) {
	base, max = DefaultRetryBackoff, DefaultRetryMaxBackoff
	for _, f := range []struct {
		name, v string
		d       *time.Duration
	}{{"retry.backoff", p.Backoff, &base}, {"retry.max_backoff", p.MaxBackoff, &max}} {
		if f.v == "" {
			continue
		}
		d, err := time.ParseDuration(f.v)
		if err != nil || d <= 0 || d > MaxRetryBackoff {
			return 0, 0, session.Errorf(session.CodeBadRequest, "%s %q must be a duration such as 30s or 5m, at most %v", f.name, f.v, MaxRetryBackoff)
		}
		*f.d = d
	}
	if p.MaxBackoff == "" && base > max {
		max = base
	}
	return base, max, nil
}
