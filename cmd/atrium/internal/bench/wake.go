package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

const (
	wakeP99Target = 20 * time.Millisecond
	// benchHibernateAfter is the idle time after which the wake and memory
	// scenarios' sessions hibernate.
	benchHibernateAfter = 200 * time.Millisecond
	// wakeGap separates samples so that the previous sample's turn (a
	// process started in a sandbox after the ack) is not timed too.
	wakeGap = 25 * time.Millisecond
)

// wake measures the time from a prompt to a hibernated session until its
// ack: the node activates the session from its SQLite file, commits the
// message and acknowledges.
func (r *runner) wake(ctx context.Context) (_ []Result, err error) {
	d, err := r.startServer(ctx, "wake", benchHibernateAfter)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()

	n := r.cfg.WakeSamples
	t0 := time.Now()
	ids, err := createSessions(ctx, d.c, n, "bench wake", quickTurn())
	if err != nil {
		return nil, err
	}
	r.progress("wake: created %d sessions in %s; waiting for them to hibernate", n, time.Since(t0).Round(time.Millisecond))
	if err := waitHibernated(ctx, d.c, ids); err != nil {
		return nil, err
	}
	wakeH, activeH := NewHistogram(), NewHistogram()
	body := promptBody("true")
	r.progress("wake: waking %d sessions one at a time", n)
	for i, id := range ids {
		t := time.Now()
		if _, err := d.c.prompt(ctx, id, body); err != nil {
			return nil, fmt.Errorf("wake session %d: %w", i, err)
		}
		wakeH.Record(time.Since(t))
		sleepCtx(ctx, wakeGap)
		t = time.Now()
		if _, err := d.c.prompt(ctx, id, body); err != nil {
			return nil, fmt.Errorf("prompt active session %d: %w", i, err)
		}
		activeH.Record(time.Since(t))
		sleepCtx(ctx, wakeGap)
	}
	row := latencyRow(Result{Scenario: ScenarioWake, Measure: "hibernated → prompt ack (REST)", Unit: "ms", Target: "p99 < 20 ms"}, wakeH)
	row.Value = row.P99
	row.Met = met(wakeH.Quantile(0.99) < wakeP99Target)
	row.Note = fmt.Sprintf("max %s", fmtMS(ms(wakeH.Max())))
	act := latencyRow(Result{Scenario: ScenarioWake, Measure: "active → prompt ack (REST), for comparison", Unit: "ms"}, activeH)
	act.Value = act.P99
	r.progress("wake: hibernated p50 %s p99 %s; active p50 %s p99 %s", fmtMS(row.Median), fmtMS(row.P99), fmtMS(act.Median), fmtMS(act.P99))
	return []Result{row, act}, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// createSessions creates n sessions, a few at a time.
func createSessions(ctx context.Context, c *client, n int, title string, argv []string) ([]session.ID, error) {
	ids := make([]session.ID, n)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, err := c.createSession(ctx, fmt.Sprintf("%s %d", title, i), argv)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("create session: %w", err)
				}
				return
			}
			ids[i] = s.ID
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return ids, firstErr
}

// waitHibernated polls the session list until every one of ids is
// hibernated.
func waitHibernated(ctx context.Context, c *client, ids []session.ID) error {
	want := make(map[session.ID]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	timeout := 30*time.Second + time.Duration(len(ids))*20*time.Millisecond
	var left int
	var lastErr error
	ok := pollUntil(ctx, timeout, 100*time.Millisecond, func() bool {
		list, err := c.listSessions(ctx)
		if err != nil {
			lastErr = err
			return false
		}
		left = len(want)
		for _, s := range list {
			if want[s.ID] && s.State == session.StateHibernated {
				left--
			}
		}
		return left == 0
	})
	if !ok {
		if lastErr != nil {
			return fmt.Errorf("wait for hibernation: %w", lastErr)
		}
		return fmt.Errorf("%d of %d sessions still not hibernated after %s (HibernateAfter %s)", left, len(ids), timeout, benchHibernateAfter)
	}
	return nil
}
