package actor

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

func (e *env) info(id session.ID) session.Session {
	e.t.Helper()
	rep := e.cmd(id, "alice", session.Command{Op: session.OpInfo})
	if rep.Error != nil || rep.Session == nil {
		e.t.Fatalf("info: %+v", rep)
	}
	return *rep.Session
}

func usageIs(u *session.UsageTotals, want session.UsageTotals) bool {
	return u != nil && u.InputTokens == want.InputTokens && u.OutputTokens == want.OutputTokens &&
		u.CachedTokens == want.CachedTokens && u.CostUSD > want.CostUSD-1e-9 && u.CostUSD < want.CostUSD+1e-9
}

// The Session object and the catalog entry total the session's usage
// events, and keep the totals across hibernation and reactivation.
func TestUsage_Totals(t *testing.T) {
	e := newEnv(t, withHibernate(300*time.Millisecond))
	id := e.create("alice", shell())

	s := e.info(id)
	if s.Usage != nil {
		t.Errorf("usage of a new session = %+v, want none", s.Usage)
	}
	if b, _ := json.Marshal(s); strings.Contains(string(b), `"usage"`) {
		t.Errorf("a session without usage shows it: %s", b)
	}

	w := e.watch(id)
	e.host.RecordUsage(id, 1, session.UsageData{Model: "m", InputTokens: 10, OutputTokens: 5, CachedTokens: 2, CostUSD: 0.5})
	e.host.RecordUsage(id, 1, session.UsageData{Model: "m", InputTokens: 1, OutputTokens: 1, CostUSD: 0.25})
	w.until("first usage", isKind(session.KindUsage))
	w.until("second usage", isKind(session.KindUsage))
	want := session.UsageTotals{InputTokens: 11, OutputTokens: 6, CachedTokens: 2, CostUSD: 0.75}
	eventually(t, "info totals the usage", func() bool { return usageIs(e.info(id).Usage, want) })

	eventually(t, "hibernated with the totals in the catalog", func() bool {
		c, ok := e.catalog(id)
		return ok && c.State == session.StateHibernated && usageIs(c.Usage, want)
	})
	c, _ := e.catalog(id)
	if u := c.SessionFor("alice").Usage; !usageIs(u, want) {
		t.Errorf("hibernated session object usage = %+v, want %+v", u, want)
	}

	// Usage for a hibernated session activates it and adds to the totals
	// recovered from its metadata.
	e.host.RecordUsage(id, 2, session.UsageData{Model: "m", InputTokens: 100, OutputTokens: 50, CostUSD: 1})
	want = session.UsageTotals{InputTokens: 111, OutputTokens: 56, CachedTokens: 2, CostUSD: 1.75}
	eventually(t, "info totals after reactivation", func() bool { return usageIs(e.info(id).Usage, want) })
	eventually(t, "catalog totals after reactivation", func() bool {
		c, ok := e.catalog(id)
		return ok && usageIs(c.Usage, want)
	})
}

// A history whose metadata has no totals (written before them) gets them
// from its usage events when the session opens.
func TestUsage_RecoveredFromHistory(t *testing.T) {
	e := newEnv(t)
	id := e.writeHistory(
		session.KindUsage, session.UsageData{Turn: 1, Model: "m", InputTokens: 7, OutputTokens: 3, CachedTokens: 1, CostUSD: 0.125},
		session.KindMessage, session.MessageData{Text: "hi"},
		session.KindUsage, session.UsageData{Turn: 1, Model: "m", InputTokens: 3, OutputTokens: 2, CostUSD: 0.125},
	)
	e.putCatalog(id, session.StateHibernated, 4)
	want := session.UsageTotals{InputTokens: 10, OutputTokens: 5, CachedTokens: 1, CostUSD: 0.25}
	if u := e.info(id).Usage; !usageIs(u, want) {
		t.Errorf("recovered usage = %+v, want %+v", u, want)
	}
}
