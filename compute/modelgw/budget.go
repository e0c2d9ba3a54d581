package modelgw

import (
	"time"

	"github.com/atriumhq/atrium/session"
)

// ledger counts spend per budget and scope key in the budget's current
// window. It is in memory: a node restart starts every window afresh.
type ledger struct {
	windows map[windowKey]*window
}

type windowKey struct {
	budget int    // index in Config.Budgets
	key    string // session id or tenant
}

type window struct {
	start  time.Time
	tokens int64
	cost   float64
}

func newLedger() *ledger { return &ledger{windows: map[windowKey]*window{}} }

// windowStart is the start of the period holding t, in UTC.
func windowStart(p Period, t time.Time) time.Time {
	t = t.UTC()
	switch p {
	case PeriodHour:
		return t.Truncate(time.Hour)
	case PeriodDay:
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	default:
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
}

// applies reports whether budget b counts the caller, and under which key.
func (b Budget) applies(id session.ID, tenant string) (string, bool) {
	if b.Scope == ScopeSession {
		return string(id), true
	}
	if b.Tenant != "" && b.Tenant != tenant {
		return "", false
	}
	return tenant, true
}

// overLocked returns the first budget the caller has spent, if any.
func (g *Gateway) overLocked(id session.ID, tenant string, now time.Time) (Budget, bool) {
	for i, b := range g.cfg.Budgets {
		key, ok := b.applies(id, tenant)
		if !ok {
			continue
		}
		w := g.spent.windows[windowKey{i, key}]
		if w == nil || !w.start.Equal(windowStart(b.Period, now)) {
			continue
		}
		if (b.Tokens > 0 && w.tokens >= b.Tokens) || (b.CostUSD > 0 && w.cost >= b.CostUSD) {
			return b, true
		}
	}
	return Budget{}, false
}

// spendLocked adds usage to every budget that counts the caller.
func (g *Gateway) spendLocked(id session.ID, tenant string, now time.Time, u session.UsageData) {
	for i, b := range g.cfg.Budgets {
		key, ok := b.applies(id, tenant)
		if !ok {
			continue
		}
		start := windowStart(b.Period, now)
		k := windowKey{i, key}
		w := g.spent.windows[k]
		if w == nil || !w.start.Equal(start) {
			w = &window{start: start}
			g.spent.windows[k] = w
		}
		w.tokens += u.InputTokens + u.OutputTokens
		w.cost += u.CostUSD
	}
	if len(g.spent.windows) > 4096 {
		g.pruneLocked(now)
	}
}

// pruneLocked drops windows that have ended.
func (g *Gateway) pruneLocked(now time.Time) {
	for k, w := range g.spent.windows {
		if !w.start.Equal(windowStart(g.cfg.Budgets[k.budget].Period, now)) {
			delete(g.spent.windows, k)
		}
	}
}

// Spend is a budget's state for one session or tenant, for reports.
type Spend struct {
	Budget Budget
	Key    string // session id or tenant
	Start  time.Time
	Tokens int64
	Cost   float64
}

// Spent lists the current windows of every budget.
func (g *Gateway) Spent() []Spend {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	var out []Spend
	for k, w := range g.spent.windows {
		b := g.cfg.Budgets[k.budget]
		if w.start.Equal(windowStart(b.Period, now)) {
			out = append(out, Spend{Budget: b, Key: k.key, Start: w.start, Tokens: w.tokens, Cost: w.cost})
		}
	}
	return out
}
