package retry_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/atriumhq/atrium/session/retry"
)

func TestPolicy_Delay(t *testing.T) {
	for name, p := range map[string]retry.Policy{
		"stream":  {Min: 100 * time.Millisecond, Max: 3 * time.Second},
		"odd":     {Min: 7 * time.Nanosecond, Max: 1001 * time.Nanosecond},
		"dlq":     {Min: time.Second, Max: time.Minute},
		"minimax": {Min: time.Second, Max: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			for n := 1; n <= 70; n++ {
				want := p.Max
				if n-1 < 62 && p.Min<<(n-1) > 0 && p.Min<<(n-1) < p.Max {
					want = p.Min << (n - 1)
				}
				lo, hi := time.Duration(1<<62), time.Duration(0)
				for range 200 {
					d := p.Delay(n)
					if d < want/2 || d > want {
						t.Fatalf("Delay(%d) = %s, want within [%s, %s]", n, d, want/2, want)
					}
					lo, hi = min(lo, d), max(hi, d)
				}
				if want >= time.Millisecond && hi-lo < want/10 {
					t.Fatalf("Delay(%d) spans only [%s, %s]: not jittered", n, lo, hi)
				}
			}
		})
	}
}

func TestPolicy_Do(t *testing.T) {
	transient := errors.New("unavailable")
	retryable := func(err error) bool { return errors.Is(err, transient) }
	t.Run("retries up to Attempts with capped waits", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := retry.Policy{Min: time.Second, Max: 4 * time.Second, Attempts: 5}
			var at []time.Time
			var notified []int
			n, err := p.Do(t.Context(), retryable, func(context.Context) error {
				at = append(at, time.Now())
				return transient
			}, func(err error, attempt int, next time.Duration) { notified = append(notified, attempt) })
			if n != 5 || !errors.Is(err, transient) || len(at) != 5 {
				t.Fatalf("Do = %d, %v after %d calls; want 5 and the last error", n, err, len(at))
			}
			for i, c := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
				if d := at[i+1].Sub(at[i]); d < c/2 || d > c {
					t.Errorf("wait before attempt %d = %s, want within [%s, %s]", i+2, d, c/2, c)
				}
			}
			if len(notified) != 4 || notified[0] != 1 || notified[3] != 4 {
				t.Errorf("notified after attempts %v, want 1..4", notified)
			}
		})
	})
	t.Run("stops at a success", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			n, err := retry.Policy{Min: time.Second, Max: time.Minute}.Do(t.Context(), nil, func(context.Context) error {
				if calls++; calls < 3 {
					return transient
				}
				return nil
			}, nil)
			if n != 3 || err != nil {
				t.Fatalf("Do = %d, %v; want 3, nil", n, err)
			}
		})
	})
	t.Run("does not retry what retryable rejects", func(t *testing.T) {
		perm := errors.New("bad repository")
		n, err := retry.Policy{Min: time.Hour, Max: time.Hour, Attempts: 5}.Do(t.Context(), retryable,
			func(context.Context) error { return perm }, nil)
		if n != 1 || err != perm {
			t.Fatalf("Do = %d, %v; want 1 and the error itself", n, err)
		}
	})
	t.Run("gives up when the context ends, naming both errors", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			calls := 0
			n, err := retry.Policy{Min: time.Hour, Max: time.Hour}.Do(ctx, retryable, func(context.Context) error {
				if calls++; calls == 2 {
					cancel()
				}
				return transient
			}, nil)
			if n != 2 || !errors.Is(err, context.Canceled) || !errors.Is(err, transient) {
				t.Fatalf("Do = %d, %v; want 2 and an error wrapping both", n, err)
			}
		})
	})
}

func TestStartup(t *testing.T) {
	t.Run("retries until the step succeeds, each attempt under its own timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			calls := 0
			v, err := retry.Startup(t.Context(), log, "open the bucket", func(ctx context.Context) (int, error) {
				calls++
				if calls == 1 { // a lost reply: the attempt waits for its own deadline only
					<-ctx.Done()
					return 0, ctx.Err()
				}
				if calls < 4 {
					return 0, errors.New("no quorum")
				}
				return 42, nil
			})
			if v != 42 || err != nil || calls != 4 {
				t.Fatalf("Startup = %d, %v after %d calls; want 42, nil after 4", v, err, calls)
			}
			if got := strings.Count(logs.String(), "start-up step failed; retrying"); got != 3 {
				t.Errorf("%d warnings, want 3:\n%s", got, logs.String())
			}
			if !strings.Contains(logs.String(), "step=\"open the bucket\"") || !strings.Contains(logs.String(), "attempts=4") {
				t.Errorf("logs do not name the step and the attempts:\n%s", logs.String())
			}
		})
	})
	t.Run("gives up when its context ends, naming the step and the last failure", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			_, err := retry.Startup(ctx, slog.New(slog.DiscardHandler), "take the node lease", func(context.Context) (struct{}, error) {
				return struct{}{}, errors.New("lease held")
			})
			if err == nil || !errors.Is(err, context.DeadlineExceeded) ||
				!strings.Contains(err.Error(), "take the node lease: gave up after") || !strings.Contains(err.Error(), "lease held") {
				t.Fatalf("Startup = %v", err)
			}
		})
	})
}
