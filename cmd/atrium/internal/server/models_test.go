package server_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
)

// TestServer_ModelGateway: a node with a model provider serves its gateway
// on a socket in the data dir, and a sandbox's command reaches it at
// 127.0.0.1:4180 with a token the gateway issued; the metrics show the call.
func TestServer_ModelGateway(t *testing.T) {
	up := modeltest.New(t)
	up.Push(modeltest.Text("hello through the node"))
	var dataDir string
	st := startStack(t, func(c *server.Config) {
		dataDir = c.DataDir
		c.Models.Providers = []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-real"}}
	})
	if fi, err := os.Stat(filepath.Join(dataDir, server.ModelSocketName)); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("model socket: %v", err)
	}
	gw := st.srv.ModelGateway()
	c := st.as("ann")
	s := c.create("models", nil)
	tok := gw.Issue(s.ID, "")
	if err := gw.Activate(tok, 1, "ann"); err != nil {
		t.Fatal(err)
	}
	script := `body='{"model":"claude-x","max_tokens":5,"messages":[]}'
exec 3<>/dev/tcp/127.0.0.1/4180 || exit 9
printf 'POST /anthropic/v1/messages HTTP/1.1\r\nHost: m\r\nx-api-key: ` + tok + `\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' "${#body}" "$body" >&3
cat <&3 | sed "s/^{/answer: {/"` // (a JSON line with a type would be an agent event)
	c.prompt(s.ID, script)
	if d := c.waitTurn(s.ID, 1); d.Status != "ok" {
		for _, ev := range c.events(s.ID, 0) {
			t.Logf("%s %s", ev.Kind, ev.Data)
		}
		t.Fatalf("turn %+v", d)
	}
	if out := outputOf(c.events(s.ID, 0), 1, "stdout"); !strings.Contains(out, "hello through the node") {
		t.Fatalf("output %q", out)
	}
	if got := up.Requests()[0].Header.Get("X-Api-Key"); got != "sk-real" {
		t.Fatalf("upstream key %q", got)
	}
	// The gateway's count is recorded in the session as a usage event.
	ev := c.waitEvent(s.ID, 0, "usage", func(ev event) bool { return ev.Kind == session.KindUsage })
	var u session.UsageData
	ev.decode(t, &u)
	if u.Turn != 1 || u.Model != "claude-x" || u.InputTokens == 0 || u.OutputTokens == 0 {
		t.Fatalf("usage event %+v", u)
	}
	// GET /v1/sessions/{id} totals it (issue 16).
	for deadline := time.Now().Add(waitLong); ; time.Sleep(20 * time.Millisecond) {
		got := c.get(s.ID).Usage
		if got != nil && got.InputTokens == u.InputTokens && got.OutputTokens == u.OutputTokens && got.CostUSD == u.CostUSD {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session usage = %+v, want the totals of %+v", got, u)
		}
	}
	// The call is in the audit log, without the prompt or the answer.
	var entries []audit.Entry
	deadline := time.Now().Add(waitLong)
	for len(entries) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no model_call audit entry")
		}
		time.Sleep(20 * time.Millisecond)
		var err error
		if entries, err = server.ModelAudit(context.Background(), st.srv, ""); err != nil {
			t.Fatal(err)
		}
	}
	if e := entries[0]; e.Session != string(s.ID) || e.Actor != "ann" || e.Target != "anthropic/claude-x" || e.Outcome != audit.OK ||
		!strings.Contains(e.Detail, "status 200") || strings.Contains(e.Detail, "hello through the node") {
		t.Fatalf("audit entry %+v", e)
	}
	resp, err := http.Get(st.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `atrium_model_requests_total{model="claude-x",provider="anthropic",status="200"} 1`) {
		t.Fatalf("metrics lack the model call")
	}
}

// TestServer_ModelBudget: a turn whose model calls exceed the session's
// budget gets the vendor's rate-limit error, and the node ends the turn
// itself with error too_many_requests naming the budget.
func TestServer_ModelBudget(t *testing.T) {
	up := modeltest.New(t)
	up.SetDefault(modeltest.Reply{Text: "x", Usage: &modeltest.Usage{InputTokens: 100, OutputTokens: 100}})
	st := startStack(t, func(c *server.Config) {
		c.Models.Providers = []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-real"}}
		c.Models.Budgets = []modelgw.Budget{{Scope: modelgw.ScopeSession, Period: modelgw.PeriodDay, Tokens: 150}}
	})
	gw := st.srv.ModelGateway()
	c := st.as("ann")
	s := c.create("budget", nil)
	tok := gw.Issue(s.ID, "")
	if err := gw.Activate(tok, 1, "ann"); err != nil {
		t.Fatal(err)
	}
	// Calls until refused (the first call's usage is counted as its answer
	// ends), then waits for the node to end the turn.
	script := `body='{"model":"claude-x","max_tokens":5,"messages":[]}'
for i in $(seq 50); do
  exec 3<>/dev/tcp/127.0.0.1/4180 || exit 9
  printf 'POST /anthropic/v1/messages HTTP/1.1\r\nHost: m\r\nx-api-key: ` + tok + `\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' "${#body}" "$body" >&3
  status=$(head -n1 <&3); exec 3<&-
  echo "call $i: $status"
  case $status in *429*) break;; esac
done
sleep 60`
	c.prompt(s.ID, script)
	d := c.waitTurn(s.ID, 1)
	if d.Status != "failed" {
		t.Fatalf("turn %+v, want failed", d)
	}
	evs := c.events(s.ID, 0)
	// The refusal's own line may not make it: the node ends the turn as
	// it refuses.
	if out := outputOf(evs, 1, "stdout"); !strings.Contains(out, "call 1: HTTP/1.1 200") {
		t.Fatalf("output %q", out)
	}
	found := false
	for _, ev := range evs {
		if ev.Kind == session.KindError {
			var e session.ErrorData
			ev.decode(t, &e)
			found = e.Code == session.CodeTooManyRequests && strings.Contains(e.Message, "session budget of 150 tokens per day")
		}
	}
	if !found {
		t.Fatalf("no too_many_requests error naming the budget in %d events", len(evs))
	}
}

// TestServer_ModelLedger: the budgets' ledger in NATS KV counts concurrent
// additions from several writers exactly.
func TestServer_ModelLedger(t *testing.T) {
	st := startStack(t, nil)
	l, err := server.ModelLedger(st.srv)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := server.ModelLedger(st.srv) // another node's
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	end := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 10 {
				w := l
				if i%2 == 1 {
					w = l2
				}
				if err := w.Add(ctx, "tenant.61636d65.day.20260101T00", 3, 0.5, end); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	tokens, cost, err := l2.Spent(ctx, "tenant.61636d65.day.20260101T00")
	if err != nil || tokens != 240 || cost != 40 {
		t.Fatalf("spent %d tokens, $%v, %v; want 240, $40", tokens, cost, err)
	}
	if tokens, _, err := l.Spent(ctx, "tenant.other.day.20260101T00"); err != nil || tokens != 0 {
		t.Fatalf("unknown window: %d, %v", tokens, err)
	}
}
