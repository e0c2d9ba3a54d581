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
	r.progress("resume: wrote %d events in %s; replaying %d times per protocol", n, time.Since(t0).Round(time.Millisecond), r.cfg.ResumeRuns)
	var peer *centrifugo
	var channel, epoch string
	if r.cfg.PeerCentrifugo != "" {
		if peer, err = newCentrifugo(r.cfg.PeerCentrifugo); err != nil {
			return nil, err
		}
		evs, err := d.c.firstEvents(ctx, s.ID, n)
		if err != nil {
			return nil, err
		}
		if channel, epoch, err = peer.fill(ctx, evs); err != nil {
			return nil, err
		}
		r.progress("resume: published the same %d events into Centrifugo channel %s", len(evs), channel)
	}
	// The first replay finds the gateway's history cache cold (nobody
	// watched while the history was written): every page comes from the
	// node. The later ones are served from the cache after one small
	// history request to the node.
	cold, err := replay(ctx, d.c, s.ID, n, session.SubprotocolBatch)
	if err != nil {
		return nil, fmt.Errorf("first replay: %w", err)
	}
	r.progress("resume: first replay (cold cache, pages from the node) over %s: %s", session.SubprotocolBatch, fmtMS(ms(cold)))
	// The protocols (and the peer) alternate, so that all see the same
	// machine.
	protos := []string{session.Subprotocol, session.SubprotocolBatch}
	hs := []*Histogram{NewHistogram(), NewHistogram()}
	peerH := NewHistogram()
	for i := range r.cfg.ResumeRuns {
		for j, proto := range protos {
			took, err := replay(ctx, d.c, s.ID, n, proto)
			if err != nil {
				return nil, fmt.Errorf("replay %d over %s: %w", i, proto, err)
			}
			hs[j].Record(took)
		}
		if peer != nil {
			took, err := peer.replay(ctx, channel, epoch, n)
			if err != nil {
				return nil, fmt.Errorf("replay %d from centrifugo: %w", i, err)
			}
			peerH.Record(took)
		}
	}
	var rows []Result
	for j, proto := range protos {
		h := hs[j]
		row := latencyRow(Result{
			Scenario: ScenarioResume, Measure: fmt.Sprintf("replay %d events to a new WebSocket (after=0) over %s", n, proto),
			Unit: "ms", Target: "< 200 ms",
		}, h)
		row.Value = row.P99
		row.Met = met(h.Quantile(0.99) < resumeTarget)
		row.Note = fmt.Sprintf("dial → event %d received, %d runs, every seq checked", n, h.Count())
		if j == 1 {
			row.Note += fmt.Sprintf("; median %.2f× atrium.v1's; the first replay before them (gateway cache cold, every page from the node) took %s", float64(h.Quantile(0.5))/float64(hs[0].Quantile(0.5)), fmtMS(ms(cold)))
		}
		if peer != nil {
			row.Note += fmt.Sprintf("; median %.2f× Centrifugo's", float64(h.Quantile(0.5))/float64(peerH.Quantile(0.5)))
		}
		r.progress("resume (%s): p50 %s p99 %s", proto, fmtMS(row.Median), fmtMS(row.P99))
		rows = append(rows, row)
	}
	if peer != nil {
		row := latencyRow(Result{
			Scenario: ScenarioResume, Measure: fmt.Sprintf("replay %d events from Centrifugo (recover from offset 0)", n),
			Unit: "ms", Target: "(reference)",
		}, peerH)
		row.Value = row.P99
		row.Note = fmt.Sprintf("the same events as publications of one channel, memory engine, same WebSocket library; %d runs, every offset checked", peerH.Count())
		r.progress("resume (centrifugo): p50 %s p99 %s", fmtMS(row.Median), fmtMS(row.P99))
		rows = append(rows, row)
	}
	return rows, nil
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

// replay dials with after=0 offering proto and reads until event n, checking
// that seqs arrive 1, 2, 3 … without gaps, one to a frame or, with
// atrium.v1+batch, in events frames.
func replay(ctx context.Context, c *client, id session.ID, n int64, proto string) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.Now()
	w, err := c.dialWSWith(rctx, id, 0, proto)
	if err != nil {
		return 0, err
	}
	defer w.close()
	var last int64
	var seqs []session.Seq
	for last < n {
		frame, err := w.read(rctx)
		if err != nil {
			return 0, fmt.Errorf("after seq %d: %w", last, err)
		}
		seqs = seqs[:0]
		if seq, _, ok := parseEventFrame(frame); ok {
			seqs = append(seqs, seq)
		} else if seqs, ok = parseEventsFrame(frame, seqs); !ok {
			continue
		}
		for _, seq := range seqs {
			if seq != last+1 {
				return 0, fmt.Errorf("got seq %d after %d", seq, last)
			}
			last = seq
		}
	}
	return time.Since(t), nil
}
