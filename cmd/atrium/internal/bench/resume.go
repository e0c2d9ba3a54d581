package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atriumhq/atrium/session"
)

const resumeTarget = 200 * time.Millisecond

// resume measures how long a client that reconnects with after=0 takes to
// receive a history of cfg.ResumeEvents events over its WebSocket.
func (r *runner) resume(ctx context.Context) (_ []Result, err error) {
	d, err := r.startServer(ctx, "resume", time.Hour)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()
	s, err := d.c.createSession(ctx, "bench resume", holdTurn())
	if err != nil {
		return nil, err
	}
	if err := startHold(ctx, d.c, s.ID); err != nil {
		return nil, err
	}
	n := int64(r.cfg.ResumeEvents)
	t0 := time.Now()
	if err := fill(ctx, d.c, s.ID, n, r.cfg.Senders); err != nil {
		return nil, err
	}
	r.progress("resume: wrote %d events in %s; replaying %d times", n, time.Since(t0).Round(time.Millisecond), r.cfg.ResumeRuns)
	h := NewHistogram()
	for i := range r.cfg.ResumeRuns {
		took, err := replay(ctx, d.c, s.ID, n)
		if err != nil {
			return nil, fmt.Errorf("replay %d: %w", i, err)
		}
		h.Record(took)
	}
	row := latencyRow(Result{
		Scenario: ScenarioResume, Measure: fmt.Sprintf("replay %d events to a new WebSocket (after=0)", n),
		Unit: "ms", Target: "< 200 ms",
	}, h)
	row.Value = row.P99
	row.Met = met(h.Quantile(0.99) < resumeTarget)
	row.Note = fmt.Sprintf("dial → event %d received, %d runs, every seq checked", n, h.Count())
	r.progress("resume: p50 %s p99 %s", fmtMS(row.Median), fmtMS(row.P99))
	return []Result{row}, nil
}

// fill prompts the session from senders goroutines until its log holds at
// least n events.
func fill(ctx context.Context, c *client, id session.ID, n int64, senders int) error {
	cur, err := c.getSession(ctx, id)
	if err != nil {
		return err
	}
	var last atomic.Int64
	last.Store(cur.LastSeq)
	body := promptBody("resume benchmark event")
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	for range senders {
		wg.Go(func() {
			for last.Load() < n && ctx.Err() == nil {
				seq, err := c.prompt(ctx, id, body)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				storeMax(&last, seq)
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// replay dials with after=0 and reads until event n, checking that seqs
// arrive 1, 2, 3 … without gaps.
func replay(ctx context.Context, c *client, id session.ID, n int64) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.Now()
	w, err := c.dialWS(rctx, id, 0)
	if err != nil {
		return 0, err
	}
	defer w.close()
	var last int64
	for last < n {
		frame, err := w.read(rctx)
		if err != nil {
			return 0, fmt.Errorf("after seq %d: %w", last, err)
		}
		seq, _, ok := parseEventFrame(frame)
		if !ok {
			continue
		}
		if seq != last+1 {
			return 0, fmt.Errorf("got seq %d after %d", seq, last)
		}
		last = seq
	}
	return time.Since(t), nil
}
