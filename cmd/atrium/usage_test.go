package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
	"github.com/atriumhq/atrium/session"
)

func TestUsage(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Tenant: "acme"})
	c := sdk(t, srv.URL, "alice")
	a, err := c.CreateSession(cliContext(t), client.CreateRequest{Title: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateSession(cliContext(t), client.CreateRequest{Title: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSession(cliContext(t), client.CreateRequest{Title: "idle"}); err != nil {
		t.Fatal(err)
	}
	srv.Append(a.ID, session.KindUsage, session.BySystem, session.UsageData{Turn: 1, Model: "claude-x", InputTokens: 100, OutputTokens: 10, CachedTokens: 50, CostUSD: 0.5})
	srv.Append(a.ID, session.KindOutput, session.BySystem, session.OutputData{Turn: 1, Stream: "stdout", Text: "x"})
	srv.Append(a.ID, session.KindUsage, session.BySystem, session.UsageData{Turn: 2, Model: "claude-x", InputTokens: 200, OutputTokens: 20, CostUSD: 0.25})
	srv.Append(a.ID, session.KindUsage, session.BySystem, session.UsageData{Turn: 2, Model: "gpt-x", InputTokens: 1, OutputTokens: 2, CostUSD: 0.125})
	srv.Append(b.ID, session.KindUsage, session.BySystem, session.UsageData{Turn: 1, Model: "gpt-x", InputTokens: 5, OutputTokens: 5, CostUSD: 1})
	cl := newCLI(t, srv.URL)

	var rep usageReport
	if err := json.Unmarshal([]byte(cl.ok("usage", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Sessions) != 2 || rep.Total.Calls != 4 || rep.Total.InputTokens != 306 || rep.Total.CostUSD != 1.875 {
		t.Fatalf("report %+v: want the two sessions with usage, 4 calls, 306 input tokens, $1.875", rep)
	}
	var ra sessionUsage
	for _, s := range rep.Sessions {
		if s.ID == a.ID {
			ra = s
		}
	}
	if len(ra.Models) != 2 || ra.Models[0].Model != "claude-x" || ra.Models[0].Calls != 2 || ra.Models[0].CachedTokens != 50 ||
		ra.Models[0].CostUSD != 0.75 || ra.Tenant != "" {
		t.Fatalf("session a %+v", ra)
	}

	out := cl.ok("usage", "--session", string(b.ID))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "COST (USD)") || !strings.Contains(lines[1], "gpt-x") ||
		!strings.Contains(lines[2], "1.0000") {
		t.Fatalf("usage --session:\n%s", out)
	}
	if err := json.Unmarshal([]byte(cl.ok("usage", "--tenant", "acme", "--json")), &rep); err != nil || rep.Sessions[0].Tenant != "acme" {
		t.Fatalf("--tenant acme: %+v %v", rep, err)
	}
	if _, _, err := cl.run(cliContext(t), nil, "usage", "--tenant", "other"); err == nil || !strings.Contains(err.Error(), `you are in tenant "acme", not "other"`) {
		t.Fatalf("--tenant other: %v", err)
	}
}
