package modelgw

import (
	"context"
	"encoding/hex"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Ledger keeps what was spent in each budget window, under keys the
// gateway makes (WindowKey). The default keeps it in the gateway's memory;
// a ledger shared by the nodes (NATS KV in atrium) makes tenant budgets
// hold across the cluster and windows survive restarts.
type Ledger interface {
	// Spent returns the tokens and cost counted in window key.
	Spent(ctx context.Context, key string) (tokens int64, cost float64, err error)
	// Add counts tokens and cost in window key, which ends at end.
	Add(ctx context.Context, key string, tokens int64, cost float64, end time.Time) error
}

// ledgerTimeout bounds one ledger call.
const ledgerTimeout = 5 * time.Second

// windowStart is the start of the period holding t, in UTC, and the start
// of the next one.
func window(p Period, t time.Time) (start, end time.Time) {
	t = t.UTC()
	switch p {
	case PeriodHour:
		start = t.Truncate(time.Hour)
		return start, start.Add(time.Hour)
	case PeriodDay:
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1)
	default:
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
}

// WindowKey names the window of budget b for a session or tenant at t:
// "<scope>.<hex of id or tenant>.<period>.<start>", made of the characters
// NATS KV keys allow. Budgets of the same scope and period share a window.
func (b Budget) WindowKey(id session.ID, tenant string, t time.Time) (key string, end time.Time, ok bool) {
	who, ok := b.applies(id, tenant)
	if !ok {
		return "", time.Time{}, false
	}
	start, end := window(b.Period, t)
	return string(b.Scope) + "." + hex.EncodeToString([]byte(who)) + "." + string(b.Period) + "." +
		start.Format("20060102T15"), end, true
}

// applies reports whether budget b counts the caller, and under which
// name.
func (b Budget) applies(id session.ID, tenant string) (string, bool) {
	if b.Scope == ScopeSession {
		return string(id), true
	}
	if b.Tenant != "" && b.Tenant != tenant {
		return "", false
	}
	return tenant, true
}

// over returns the first budget the caller has spent, if any. A ledger
// that fails is logged and counts as nothing spent: model access does not
// stop for it.
func (g *Gateway) over(ctx context.Context, id session.ID, tenant string, now time.Time) (Budget, bool) {
	for _, b := range g.cfg.Budgets {
		key, _, ok := b.WindowKey(id, tenant, now)
		if !ok {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, ledgerTimeout)
		tokens, cost, err := g.ledger.Spent(lctx, key)
		cancel()
		if err != nil {
			g.log.Warn("model budget not checked", "session", string(id), "error", err.Error())
			continue
		}
		if (b.Tokens > 0 && tokens >= b.Tokens) || (b.CostUSD > 0 && cost >= b.CostUSD) {
			return b, true
		}
	}
	return Budget{}, false
}

// spend counts usage in every window that counts the caller, once each.
func (g *Gateway) spend(ctx context.Context, id session.ID, tenant string, now time.Time, u session.UsageData) {
	seen := map[string]bool{}
	for _, b := range g.cfg.Budgets {
		key, end, ok := b.WindowKey(id, tenant, now)
		if !ok || seen[key] {
			continue
		}
		seen[key] = true
		lctx, cancel := context.WithTimeout(ctx, ledgerTimeout)
		err := g.ledger.Add(lctx, key, u.InputTokens+u.OutputTokens, u.CostUSD, end)
		cancel()
		if err != nil {
			g.log.Warn("model spend not counted", "session", string(id), "error", err.Error())
		}
	}
}

// memLedger is the default Ledger, in memory.
type memLedger struct {
	now     func() time.Time
	mu      sync.Mutex
	windows map[string]*memWindow // guarded by mu
}

type memWindow struct {
	tokens int64
	cost   float64
	end    time.Time
}

func newMemLedger(now func() time.Time) *memLedger {
	return &memLedger{now: now, windows: map[string]*memWindow{}}
}

func (l *memLedger) Spent(_ context.Context, key string) (int64, float64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.windows[key]; w != nil {
		return w.tokens, w.cost, nil
	}
	return 0, 0, nil
}

func (l *memLedger) Add(_ context.Context, key string, tokens int64, cost float64, end time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.windows[key]
	if w == nil {
		w = &memWindow{end: end}
		l.windows[key] = w
	}
	w.tokens += tokens
	w.cost += cost
	if len(l.windows) > 4096 {
		now := l.now()
		for k, w := range l.windows {
			if !now.Before(w.end) {
				delete(l.windows, k)
			}
		}
	}
	return nil
}
