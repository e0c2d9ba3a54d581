package actor

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/atriumhq/atrium/session"
)

// Usage totals (issue 16): the session keeps the running sum of its usage
// events in its Meta (Usage, up to seq UsageSeq), written with the batch
// that commits each usage event, and shows it in the Session object and the
// catalog entry.

// cloneUsage returns a copy of t (nil stays nil).
func cloneUsage(t *session.UsageTotals) *session.UsageTotals {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}

// recordUsage logs usage event u and adds it to the totals in the metadata
// committed with it.
func (s *sessionActor) recordUsage(u session.UsageData) {
	seq := s.events.emit(session.KindUsage, session.BySystem, mustMarshal(u), nil)
	t := cloneUsage(s.events.metaNext.Usage)
	if t == nil {
		t = &session.UsageTotals{}
	}
	t.Add(u)
	s.events.metaNext.Usage, s.events.metaNext.UsageSeq = t, seq
	s.events.metaDirty = true
}

// recoverUsage brings m's usage totals up to date with the history: usage
// events after m.UsageSeq (a session from before the totals, or metadata
// whose write was lost after its events were durable) are added. The common
// case, none, costs one indexed lookup.
func recoverUsage(ctx context.Context, hist History, m *session.Meta) error {
	raw, err := hist.LastOfKind(ctx, session.KindUsage)
	if err != nil || raw == nil {
		return err
	}
	var head struct {
		Seq session.Seq `json:"seq"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf("decode last usage event: %w", err)
	}
	if head.Seq <= m.UsageSeq {
		return nil
	}
	t := cloneUsage(m.Usage)
	if t == nil {
		t = &session.UsageTotals{}
	}
	after := m.UsageSeq
	for after < head.Seq {
		evs, more, err := hist.Range(ctx, after, maxHistoryLimit, session.DefaultHistoryMaxBytes)
		if err != nil {
			return err
		}
		for _, raw := range evs {
			var ev struct {
				Seq  session.Seq       `json:"seq"`
				Kind session.Kind      `json:"kind"`
				Data session.UsageData `json:"data"`
			}
			if err := json.Unmarshal(raw, &ev); err != nil {
				return fmt.Errorf("decode event after %d: %w", after, err)
			}
			after = ev.Seq
			if ev.Kind == session.KindUsage && ev.Seq <= head.Seq {
				t.Add(ev.Data)
			}
		}
		if !more || len(evs) == 0 {
			break
		}
	}
	m.Usage, m.UsageSeq = t, head.Seq
	return nil
}
