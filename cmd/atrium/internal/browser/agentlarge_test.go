package browser

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/session"
)

// TestBrowser_StoredAgentSession opens a session whose stored history holds
// 50,000 events of an ACP agent, 5,000 of them tool calls: the scripted
// ACP agent's "bulk 5000" turn through the real node (each tool call after
// a message, with a diff or output, six updates with output, its
// completion and a plan). It logs how long the latest event took to be in
// view after navigation started (the figure: under 1 s; recorded,
// not asserted), and checks the rows at the live end are the latest,
// contiguous and bounded.
func TestBrowser_StoredAgentSession(t *testing.T) {
	t.Parallel()
	dir := installScriptedAgent(t)
	st := startStack(t, func(c *server.Config) {
		c.AgentsDir = dir
		c.Agents = []agents.Spec{{
			Name: "scripted", Package: "atrium-scripted-agent", Version: "1.0.0", Bin: "acpagent",
			Env:             []string{"FAKE_ACP_STATE=/workspace/.fakeacp"},
			Model:           agents.Model{API: agents.APIAnthropic},
			PermissionModes: map[agents.Mode]agents.Settings{agents.ModeAsk: {}, agents.ModeAutoEdit: {}, agents.ModeAuto: {}},
		}}
		c.Models = modelgw.Config{Providers: []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: "http://127.0.0.1:9", APIKey: "unused"}}}
	})
	var s session.Session
	st.api("alice", http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": "five thousand tool calls", "agent": "scripted"}, &s)
	built := time.Now()
	st.prompt("alice", s.ID, "bulk 5000")
	var last int64
	deadline := time.Now().Add(5 * time.Minute) // 50,000 events through ACP and the actor, beside other tests
	for {
		var info session.Session
		st.api("alice", http.StatusOK, "GET", "/v1/sessions/"+string(s.ID), nil, &info)
		var p struct{ Events []event }
		st.api("alice", http.StatusOK, "GET", fmt.Sprintf("/v1/sessions/%s/events?after=%d&limit=1", s.ID, max(0, info.LastSeq-1)), nil, &p)
		if len(p.Events) == 1 && p.Events[0].Kind == session.KindTurnFinished {
			last = p.Events[0].Seq
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bulk turn has not finished after 5 min (last seq %d)", info.LastSeq)
		}
		time.Sleep(200 * time.Millisecond) // polling interval
	}
	kinds := map[session.Kind]int{}
	for _, ev := range st.history("alice", s.ID, 0) {
		kinds[ev.Kind]++
	}
	t.Logf("built %d events through the node in %v: %d tool calls, %d tool call updates, %d messages, %d plans",
		last, time.Since(built).Round(time.Millisecond), kinds[session.KindToolCall], kinds[session.KindToolCallUpdate], kinds[session.KindAgentMessage], kinds[session.KindPlan])
	if last < 50000 || kinds[session.KindToolCall] < 5000 {
		t.Fatalf("the session has %d events and %d tool calls, want 50,000 and 5,000", last, kinds[session.KindToolCall])
	}

	alice := st.open("alice")
	latest := fmt.Sprintf(`(() => {
		const r = document.querySelector('#rows > .ev[data-seq="%d"]');
		if (!r) return false;
		const a = r.getBoundingClientRect(), b = document.querySelector('#timeline').getBoundingClientRect();
		return a.top < b.bottom && a.bottom > b.top;
	})()`, last)
	for _, visit := range []string{"first visit", "second visit (modules cached)"} {
		start := time.Now()
		alice.do(chromedp.Navigate(alice.base + "/s/" + string(s.ID)))
		alice.waitJS("the latest event in view", latest)
		t.Logf("%s: the latest of %d agent events was in view %v after navigation started", visit, last, time.Since(start).Round(time.Millisecond))
	}
	alice.waitRow("the last message", ".k-agent_message", "Done.")
	alice.waitRow("the last tool call", ".k-tool_call .tool", "Step call-4999")
	rows := alice.seqs()
	if len(rows) > maxRows || rows[len(rows)-1] != last {
		t.Fatalf("%d rows ending at seq %d, want at most %d ending at %d", len(rows), rows[len(rows)-1], maxRows, last)
	}
	checkContiguous(t, "rows at the live end", rows)
}
