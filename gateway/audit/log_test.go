package audit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startNATS runs an in-process nats-server with JetStream and connects to it.
func startNATS(t testing.TB) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(func() {
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return nc
}

func newLog(t testing.TB, nc *nats.Conn, tune ...func(*audit.Config)) *audit.Log {
	t.Helper()
	cfg := audit.Config{NATS: nc}
	for _, f := range tune {
		f(&cfg)
	}
	l, err := audit.New(cfg)
	if err != nil {
		t.Fatalf("new log: %v", err)
	}
	return l
}

func record(t testing.TB, l *audit.Log, e audit.Entry) {
	t.Helper()
	if err := l.Record(context.Background(), e); err != nil {
		t.Fatalf("record: %v", err)
	}
}

func list(t testing.TB, l *audit.Log, tenant string, f audit.Filter) ([]audit.Entry, string) {
	t.Helper()
	es, next, err := l.List(context.Background(), tenant, f)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	return es, next
}

// all follows cursors to the end and returns every entry.
func all(t testing.TB, l *audit.Log, tenant string, f audit.Filter) []audit.Entry {
	t.Helper()
	var out []audit.Entry
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("cursors never end")
		}
		es, next := list(t, l, tenant, f)
		if len(es) > max(f.Limit, 0) && f.Limit > 0 {
			t.Fatalf("page of %d entries, limit %d", len(es), f.Limit)
		}
		out = append(out, es...)
		if next == "" {
			return out
		}
		f.Cursor = next
	}
}

func details(es []audit.Entry) string {
	var b []string
	for _, e := range es {
		b = append(b, e.Detail)
	}
	return strings.Join(b, ",")
}

func TestLog_RecordFillsIn(t *testing.T) {
	nc := startNATS(t)
	now := time.Date(2030, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))
	l := newLog(t, nc, func(c *audit.Config) { c.Now = func() time.Time { return now } })
	record(t, l, audit.Entry{Tenant: "acme", Actor: "alice", Via: "token", Action: audit.ActTokenCreated,
		Target: "tk1", Detail: strings.Repeat("é", audit.MaxDetailBytes), Remote: "127.0.0.1"})
	es, next := list(t, l, "acme", audit.Filter{})
	if len(es) != 1 || next != "" {
		t.Fatalf("got %+v next %q", es, next)
	}
	e := es[0]
	if !strings.HasPrefix(e.ID, "au_") || !e.Time.Equal(now) || e.Time.Location() != time.UTC || e.Outcome != audit.OK {
		t.Errorf("entry not filled in: %+v", e)
	}
	if len(e.Detail) > audit.MaxDetailBytes || !strings.HasPrefix(strings.Repeat("é", audit.MaxDetailBytes), e.Detail) || e.Detail == "" {
		t.Errorf("detail of %d bytes not cut cleanly", len(e.Detail))
	}
	if e.Actor != "alice" || e.Via != "token" || e.Target != "tk1" || e.Remote != "127.0.0.1" || e.Action != audit.ActTokenCreated {
		t.Errorf("entry changed: %+v", e)
	}
	if err := l.Record(context.Background(), audit.Entry{Tenant: "acme"}); err == nil {
		t.Error("an entry without an action was recorded")
	}
}

func TestLog_Stream(t *testing.T) {
	nc := startNATS(t)
	l := newLog(t, nc, func(c *audit.Config) { c.MaxAge = 48 * time.Hour })
	record(t, l, audit.Entry{Action: audit.ActAuthFailed})
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), audit.DefaultStream)
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Storage != jetstream.FileStorage || cfg.MaxAge != 48*time.Hour || len(cfg.Subjects) != 1 || cfg.Subjects[0] != "atrium.audit.>" {
		t.Fatalf("stream config %+v", cfg)
	}
	if def := newLog(t, nc); def == nil {
		t.Fatal("no log")
	}
	if _, err := audit.New(audit.Config{}); err == nil {
		t.Error("a log without NATS was made")
	}
}

func TestLog_Paging(t *testing.T) {
	nc := startNATS(t)
	l := newLog(t, nc)
	const n = 25
	for i := range n {
		record(t, l, audit.Entry{Tenant: "acme", Actor: "alice", Action: audit.ActDenied, Detail: fmt.Sprint(i)})
	}
	var want []string
	for i := n - 1; i >= 0; i-- {
		want = append(want, fmt.Sprint(i))
	}
	for _, limit := range []int{1, 7, 10, 25, 26, 1000} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			got := all(t, l, "acme", audit.Filter{Limit: limit})
			if details(got) != strings.Join(want, ",") {
				t.Fatalf("got %s, want newest first %s", details(got), strings.Join(want, ","))
			}
		})
	}
	t.Run("exact last page has no cursor", func(t *testing.T) {
		es, next := list(t, l, "acme", audit.Filter{Limit: n})
		if len(es) != n || next != "" {
			t.Fatalf("got %d entries, next %q", len(es), next)
		}
	})
	t.Run("new entries do not shift pages", func(t *testing.T) {
		es, next := list(t, l, "acme", audit.Filter{Limit: 5})
		record(t, l, audit.Entry{Tenant: "acme", Action: audit.ActDenied, Detail: "late"})
		more, _ := list(t, l, "acme", audit.Filter{Limit: 5, Cursor: next})
		if details(es) != "24,23,22,21,20" || details(more) != "19,18,17,16,15" {
			t.Fatalf("pages %s then %s", details(es), details(more))
		}
	})
	t.Run("bad cursor", func(t *testing.T) {
		for _, c := range []string{"nope!", "0", "-1"} {
			if _, _, err := l.List(context.Background(), "acme", audit.Filter{Cursor: c}); !errors.Is(err, session.ErrBadRequest) {
				t.Errorf("cursor %q: %v", c, err)
			}
		}
	})
	t.Run("empty log", func(t *testing.T) {
		es, next := list(t, newLog(t, startNATS(t)), "acme", audit.Filter{})
		if len(es) != 0 || es == nil || next != "" {
			t.Fatalf("got %+v %q", es, next)
		}
	})
}

func TestLog_Tenants(t *testing.T) {
	nc := startNATS(t)
	l := newLog(t, nc)
	tenants := []string{"acme", "globex", "", "a.b", "a*", "a>", "org/7 x"}
	// The busy tenant fills the stream; the others are sparse in it, so
	// reading them newest first crosses many windows.
	for i := range 300 {
		record(t, l, audit.Entry{Tenant: "busy", Action: audit.ActDenied, Detail: fmt.Sprint(i)})
		if i%50 == 0 {
			for _, tn := range tenants {
				record(t, l, audit.Entry{Tenant: tn, Action: audit.ActDenied, Detail: tn + fmt.Sprint(i)})
			}
		}
	}
	for _, tn := range tenants {
		got := all(t, l, tn, audit.Filter{Limit: 2})
		var want []string
		for i := 250; i >= 0; i -= 50 {
			want = append(want, tn+fmt.Sprint(i))
		}
		if details(got) != strings.Join(want, ",") {
			t.Errorf("tenant %q sees %s, want %s", tn, details(got), strings.Join(want, ","))
		}
		for _, e := range got {
			if e.Tenant != tn {
				t.Errorf("tenant %q sees an entry of %q", tn, e.Tenant)
			}
		}
	}
	if got := all(t, l, "busy", audit.Filter{Limit: 1000}); len(got) != 300 {
		t.Errorf("busy tenant sees %d entries", len(got))
	}
	if got := all(t, l, "nobody", audit.Filter{}); len(got) != 0 {
		t.Errorf("unknown tenant sees %d entries", len(got))
	}
}

func TestLog_Filters(t *testing.T) {
	nc := startNATS(t)
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLog(t, nc)
	for i := range 40 {
		record(t, l, audit.Entry{
			Time:    base.Add(time.Duration(i) * time.Minute),
			Tenant:  "acme",
			Actor:   []string{"alice", "bob"}[i%2],
			Action:  []string{audit.ActDenied, audit.ActMemberChanged, audit.ActSessionDeleted, audit.ActTokenCreated}[i%4],
			Session: []string{"s_one", "s_two", ""}[i%3],
			Detail:  fmt.Sprint(i),
		})
	}
	count := func(f audit.Filter) (n int, newestFirst bool) {
		got := all(t, l, "acme", f)
		newestFirst = true
		for i := 1; i < len(got); i++ {
			if !got[i].Time.Before(got[i-1].Time) {
				newestFirst = false
			}
		}
		return len(got), newestFirst
	}
	for name, tc := range map[string]struct {
		f    audit.Filter
		want int
	}{
		"none":           {audit.Filter{}, 40},
		"actor":          {audit.Filter{Actor: "bob"}, 20},
		"action":         {audit.Filter{Action: audit.ActMemberChanged}, 10},
		"session":        {audit.Filter{Session: "s_two"}, 13},
		"actor+action":   {audit.Filter{Actor: "alice", Action: audit.ActDenied}, 10},
		"actor+mismatch": {audit.Filter{Actor: "alice", Action: audit.ActMemberChanged}, 0},
		"since":          {audit.Filter{Since: base.Add(30 * time.Minute)}, 10},
		"until":          {audit.Filter{Until: base.Add(9 * time.Minute)}, 10},
		"since+until":    {audit.Filter{Since: base.Add(10 * time.Minute), Until: base.Add(19 * time.Minute)}, 10},
		"all of them":    {audit.Filter{Actor: "bob", Session: "s_two", Since: base.Add(20 * time.Minute)}, 3},
		"small pages":    {audit.Filter{Actor: "bob", Limit: 3}, 20},
	} {
		t.Run(name, func(t *testing.T) {
			n, ordered := count(tc.f)
			if n != tc.want || !ordered {
				t.Fatalf("got %d entries (newest first: %v), want %d", n, ordered, tc.want)
			}
		})
	}
}
