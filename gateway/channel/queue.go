package channel

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
)

// job is one delivery: a message to post or edit, a file, a webhook call.
type job struct {
	// key, if set, coalesces jobs: a job pushed while one with the same key
	// waits replaces its run (edits of one message: only the last matters).
	key string
	// first and last are the seqs of the oldest and newest events whose
	// effects this job delivers (0 for jobs of no event).
	first, last session.Seq
	// notBefore delays the job (edits of a message are spaced out).
	notBefore time.Time
	// what names the job in logs.
	what string
	run  func(ctx context.Context) error
}

// Backoff tunes retries of failed deliveries by Atrium's one backoff policy
// (session/retry): the first retry waits Min, each next one twice as long up
// to Max, each jittered to between half and all of it. A platform that says
// when to come back (429 with Retry-After) is obeyed instead.
type Backoff struct {
	Min, Max time.Duration
	// Attempts bounds the tries of a job before it is dropped; 0 means no
	// bound: chat messages are retried for as long as the process lives.
	Attempts int
}

func (b Backoff) delay(attempt int, err error) time.Duration {
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) && ra.RetryAfter() > 0 {
		return ra.RetryAfter()
	}
	return retry.Policy{Min: b.Min, Max: b.Max}.Delay(attempt + 1)
}

// queue runs jobs one at a time in the order they were pushed, retrying
// each until it succeeds, fails permanently or runs out of attempts. Pushing
// never blocks. Its run loop is started and waited for by its owner.
type queue struct {
	name    string // for logs: the session or "direct"
	backoff Backoff
	log     *slog.Logger

	wake chan struct{} // capacity 1: jobs were pushed

	mu      sync.Mutex
	jobs    []*job          // guarded by mu: waiting, in order
	byKey   map[string]*job // guarded by mu: waiting jobs with a key
	running *job            // guarded by mu: the job being run
	idle    chan struct{}   // guarded by mu: closed when the queue empties; nil while empty
}

func newQueue(name string, b Backoff, log *slog.Logger) *queue {
	return &queue{name: name, backoff: b, log: log, wake: make(chan struct{}, 1), byKey: make(map[string]*job)}
}

// push appends j, or updates the waiting job with j's key.
func (q *queue) push(j *job) {
	q.mu.Lock()
	if j.key != "" {
		if w := q.byKey[j.key]; w != nil {
			w.run, w.what = j.run, j.what
			w.last = max(w.last, j.last)
			if w.first == 0 {
				w.first = j.first
			}
			if j.notBefore.After(w.notBefore) {
				w.notBefore = j.notBefore
			}
			q.mu.Unlock()
			return
		}
		q.byKey[j.key] = j
	}
	q.jobs = append(q.jobs, j)
	if q.idle == nil {
		q.idle = make(chan struct{})
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// empty reports whether nothing waits or runs.
func (q *queue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs) == 0 && q.running == nil
}

// drained returns a channel closed once nothing waits or runs.
func (q *queue) drained() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.idle == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return q.idle
}

// delivered returns the seq up to which the effects of every event pushed
// so far have been delivered, given that events up to processed were
// pushed.
func (q *queue) delivered(processed session.Seq) session.Seq {
	q.mu.Lock()
	defer q.mu.Unlock()
	low := processed
	consider := func(j *job) {
		if j != nil && j.first > 0 && j.first-1 < low {
			low = j.first - 1
		}
	}
	consider(q.running)
	for _, j := range q.jobs {
		consider(j)
	}
	return low
}

// run runs jobs until ctx is done.
func (q *queue) run(ctx context.Context) {
	for {
		j := q.next()
		if j == nil {
			select {
			case <-ctx.Done():
				return
			case <-q.wake:
				continue
			}
		}
		if !q.do(ctx, j) {
			return
		}
		q.finish()
	}
}

func (q *queue) next() *job {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.jobs) == 0 {
		return nil
	}
	j := q.jobs[0]
	q.jobs[0] = nil
	q.jobs = q.jobs[1:]
	if j.key != "" && q.byKey[j.key] == j {
		delete(q.byKey, j.key)
	}
	q.running = j
	return j
}

func (q *queue) finish() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running = nil
	if len(q.jobs) == 0 && q.idle != nil {
		close(q.idle)
		q.idle = nil
	}
}

// do runs j until it succeeds or is given up; false means ctx ended first.
func (q *queue) do(ctx context.Context, j *job) bool {
	for attempt := 0; ; attempt++ {
		if d := time.Until(j.notBefore); d > 0 {
			if !sleep(ctx, d) {
				return false
			}
		}
		err := j.run(ctx)
		if err == nil {
			if attempt > 0 {
				q.log.Info("delivered after retries", "queue", q.name, "job", j.what, "attempts", attempt+1)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if errors.Is(err, ErrPermanent) {
			q.log.Warn("delivery failed for good: dropped", "queue", q.name, "job", j.what, "err", err)
			return true
		}
		if q.backoff.Attempts > 0 && attempt+1 >= q.backoff.Attempts {
			q.log.Warn("delivery failed too often: dropped", "queue", q.name, "job", j.what, "attempts", attempt+1, "err", err)
			return true
		}
		d := q.backoff.delay(attempt, err)
		level := slog.LevelDebug
		if attempt == 0 || attempt%10 == 9 {
			level = slog.LevelWarn
		}
		q.log.Log(ctx, level, "delivery failed: retrying", "queue", q.name, "job", j.what, "attempt", attempt+1, "retry_in", d, "err", err)
		if !sleep(ctx, d) {
			return false
		}
	}
}

// sleep waits d or until ctx is done; false means ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
