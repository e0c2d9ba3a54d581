package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/atriumhq/atrium/session"
)

// wsTap is added to a tab before its pages load (DevTools scripts are not
// subject to the page's CSP): it keeps the page's WebSocket in
// window.__atriumWS and every frame the page sends in window.__sent, so a
// test can hand the page frames as if the server had sent them.
const wsTap = `(() => {
	const Native = window.WebSocket;
	window.__sent = [];
	window.WebSocket = class extends Native {
		constructor(...args) { super(...args); window.__atriumWS = this; }
		send(data) { try { window.__sent.push(JSON.parse(data)); } catch {} return super.send(data); }
	};
})();`

// tapWS installs wsTap in the tab for the pages it loads next.
func (tb *tab) tapWS() {
	tb.t.Helper()
	tb.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: wsTap})
		return err
	}))
}

// feeder hands a tapped page frames after the session's real log: events
// numbered from the session's last seq on, as the server would send them.
type feeder struct {
	tb  *tab
	seq int64
	at  time.Time
}

func (f *feeder) frame(v any) {
	f.tb.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		f.tb.t.Fatal(err)
	}
	eval[bool](f.tb, fmt.Sprintf(`(() => { window.__atriumWS.onmessage({ data: %s }); return true; })()`, jsString(string(b))))
}

// event feeds the next event of kind, caused by by.
func (f *feeder) event(kind session.Kind, by string, data any) int64 {
	f.tb.t.Helper()
	f.seq++
	f.at = f.at.Add(time.Second)
	raw, err := json.Marshal(data)
	if err != nil {
		f.tb.t.Fatal(err)
	}
	f.frame(map[string]any{"type": "event", "event": session.Event{
		Seq: f.seq, Epoch: "test", Time: session.Time{Time: f.at}, Kind: kind, By: by, Data: raw,
	}})
	return f.seq
}

func (f *feeder) delta(turn int64, msgID, text string) {
	f.tb.t.Helper()
	f.frame(session.DeltaFrame{Type: session.FrameDelta, Turn: turn, MessageID: msgID, Text: text})
}

func strp(s string) *string { return &s }

// hostile is content an agent, a tool or a file name may carry that must
// show as text: markup, scripts, a javascript: link, terminal escapes.
const hostile = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\"> " +
	"[click me](javascript:window.__pwned=3) <b>bold?</b> \x1b[31mred\x1b[0m \x1b]0;title\x07 &lt;ok&gt;"

// TestBrowser_AgentTimeline feeds a session page the events of an ACP
// agent's turn (DESIGN §7 "Agent events") and its streaming text, frame by
// frame through the page's own WebSocket, after the session's real history
// (the agent runtime that produces these events is not in this tree yet; its
// end-to-end test replaces the feeding), and checks what a person sees:
// streaming text growing before the message is final and replaced by it,
// markdown rendered (a heading, a code block), a tool-call card with a diff
// that a later update completes, a plan checklist that updates, thoughts
// collapsed, usage, an approval card with the agent's options whose click
// sends option_id, turns grouped under their prompt while another prompt is
// queued, the tab title calling for the approval, a cancel of someone
// else's turn asking first, and hostile content as text. It takes the
// agent screenshots at desktop and phone sizes.
func TestBrowser_AgentTimeline(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "Fix the flaky upload test", "shell")
	st.api("alice", http.StatusOK, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "driver"}, nil)
	var info session.Session
	st.api("alice", http.StatusOK, "GET", "/v1/sessions/"+string(s.ID), nil, &info)

	alice := st.open("alice")
	alice.tapWS()
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)
	f := &feeder{tb: alice, seq: info.LastSeq, at: time.Now().UTC().Add(-3 * time.Minute)}

	// Bob's prompt starts turn 1.
	prompt := f.event(session.KindMessage, "bob", session.MessageData{Text: "The upload test is flaky; find out why and fix it.", ClientID: "p-1"})
	f.event(session.KindTurnStarted, "bob", session.TurnStartedData{Turn: 1, PromptSeq: prompt})
	f.event(session.KindAgentThought, "system", session.AgentThoughtData{Turn: 1, Text: "The resume path races with the part uploader.\nCheck the manifest read."})
	f.event(session.KindPlan, "system", session.PlanData{Turn: 1, Entries: []session.PlanEntry{
		{Content: "Reproduce the failure", Status: "in_progress", Priority: "high"},
		{Content: "Fix the race in upload/resume.go", Status: "pending", Priority: "high"},
		{Content: "Run the tests 20 times", Status: "pending", Priority: "medium"},
	}})
	alice.waitRow("the plan", ".k-plan .checklist", "Reproduce the failure")
	if got := eval[int](alice, `document.querySelectorAll('.k-plan .checklist li[data-status="completed"]').length`); got != 0 {
		t.Fatalf("%d plan entries done, want 0", got)
	}
	if eval[bool](alice, `document.querySelector('.k-agent_thought details').open`) {
		t.Fatal("the thought is not collapsed")
	}

	// A tool call edits a file; its card shows the diff, and the update
	// completes it.
	old := "package upload\n\nfunc resume() {\n\tsendParts()\n\treadManifest()\n}\n"
	f.event(session.KindToolCall, "system", session.ToolCallData{Turn: 1, ID: "call-1", Title: "Edit upload/resume.go", Kind: "edit", Status: "in_progress",
		Content:   []session.ToolCallContent{{Type: "diff", Path: "upload/resume.go", OldText: strp(old), NewText: "package upload\n\nfunc resume() {\n\treadManifest()\n\tsendParts()\n}\n"}},
		Locations: []session.ToolLocation{{Path: "upload/resume.go"}}})
	alice.waitRow("the tool card", ".k-tool_call .tool", "Edit upload/resume.go")
	alice.waitJS("the diff", `document.querySelector('.k-tool_call .diffview .dl.add') && document.querySelector('.k-tool_call .diffview .dl.del')`)
	if got := eval[string](alice, `document.querySelector('.k-tool_call .tool').dataset.status`); got != "in_progress" {
		t.Fatalf("tool card status %q, want in_progress", got)
	}
	if got := eval[string](alice, `document.querySelector('.k-tool_call .diff summary').textContent`); !strings.Contains(got, "+1") || !strings.Contains(got, "−1") {
		t.Fatalf("diff summary %q, want +1 −1", got)
	}
	// Bob's shell: a long output whose tail shows.
	var long strings.Builder
	for i := 1; i <= 5000; i++ {
		fmt.Fprintf(&long, "ok  line %d\n", i)
	}
	f.event(session.KindToolCall, "system", session.ToolCallData{Turn: 1, ID: "call-2", Title: "go test -count=20 ./upload/...", Kind: "execute", Status: "in_progress",
		Content: []session.ToolCallContent{}, Locations: []session.ToolLocation{}})
	f.event(session.KindToolCallUpdate, "system", session.ToolCallUpdateData{Turn: 1, ID: "call-1", Status: "completed"})
	f.event(session.KindToolCallUpdate, "system", session.ToolCallUpdateData{Turn: 1, ID: "call-2", Status: "completed",
		Content: []session.ToolCallContent{{Type: "content", Content: json.RawMessage(mustJSON(t, map[string]string{"type": "text", "text": long.String() + "PASS\n"}))}}})
	alice.waitJS("the completed edit", `document.querySelector('.k-tool_call .tool[data-tool="call-1"]').dataset.status === 'completed'`)
	alice.waitRow("the tail of the long output", `.tool[data-tool="call-2"] .term`, "ok  line 5000\nPASS")
	if eval[bool](alice, `document.querySelector('.tool[data-tool="call-2"] .term').textContent.includes('ok  line 1\n')`) {
		t.Fatal("the long output shows its head, want its tail")
	}
	// All of it is a click away: every one of its 5,001 lines, in order.
	alice.click(`.tool[data-tool="call-2"] button[data-more]`)
	alice.waitJS("the whole long output", `document.querySelector('.tool[data-tool="call-2"] .term').textContent.startsWith('ok  line 1\nok  line 2\n')`)
	if got := eval[string](alice, `(() => {
		const l = document.querySelector('.tool[data-tool="call-2"] .term').textContent.split('\n');
		for (let i = 0; i < 5000; i++) if (l[i] !== 'ok  line ' + (i + 1)) return 'line ' + (i + 1) + ' is ' + JSON.stringify(l[i]);
		return l[5000] === 'PASS' ? '' : 'the last line is ' + JSON.stringify(l[5000]);
	})()`); got != "" {
		t.Fatalf("the long output shown whole: %s", got)
	}
	alice.click(`.tool[data-tool="call-2"] button[data-less]`)
	alice.waitJS("the long output's tail again", `!document.querySelector('.tool[data-tool="call-2"] .term').textContent.includes('ok  line 1\n')`)
	// Showing more of a row stops following the live end; the reader
	// scrolls back down to it.
	eval[bool](alice, `(() => { const t = document.querySelector('#timeline'); t.scrollTop = t.scrollHeight; t.dispatchEvent(new Event('scroll')); return true; })()`)

	// The plan updates in place.
	f.event(session.KindPlan, "system", session.PlanData{Turn: 1, Entries: []session.PlanEntry{
		{Content: "Reproduce the failure", Status: "completed", Priority: "high"},
		{Content: "Fix the race in upload/resume.go", Status: "completed", Priority: "high"},
		{Content: "Run the tests 20 times", Status: "in_progress", Priority: "medium"},
	}})
	alice.waitJS("the plan updated", `document.querySelectorAll('.k-plan .checklist li[data-status="completed"]').length === 2`)
	if got := eval[int](alice, `document.querySelectorAll('.k-plan .checklist').length`); got != 1 {
		t.Fatalf("%d plan checklists, want 1 (the older one folds)", got)
	}

	// Alice's prompt queues during turn 1.
	queued := f.event(session.KindMessage, "alice", session.MessageData{Text: "Then open a pull request.", ClientID: "p-2"})
	alice.waitRow("the queue", "#queue li", "Then open a pull request.")
	alice.waitRow("the queued line", ".k-message.queued-line", "queued a prompt during turn 1")

	// Streaming text grows before the message is final.
	f.delta(1, "t1-m1", "## The cause\n\nThe resume path sent parts ")
	alice.waitRow("streaming text", "#live .agent-msg.streaming", "The resume path sent parts")
	first := eval[int](alice, `document.querySelector('#live .agent-msg.streaming').textContent.length`)
	f.delta(1, "t1-m1", "before it read the manifest.\n\n```go\nreadManifest()\nsendParts()\n```\n")
	alice.waitRow("more streaming text", "#live .agent-msg.streaming", "before it read the manifest")
	if grown := eval[int](alice, `document.querySelector('#live .agent-msg.streaming').textContent.length`); grown <= first {
		t.Fatalf("streaming text did not grow: %d then %d characters", first, grown)
	}
	if eval[int](alice, `document.querySelectorAll('.k-agent_message').length`) != 0 {
		t.Fatal("a final agent message before it was sent")
	}
	f.event(session.KindAgentMessage, "system", session.AgentMessageData{Turn: 1, MessageID: "t1-m1",
		Text: "## The cause\n\nThe resume path sent parts before it read the manifest.\n\n```go\nreadManifest()\nsendParts()\n```\n\nFixed in `upload/resume.go`; see [the docs](https://example.com/upload)."})
	alice.waitJS("the final message", `document.querySelector('.k-agent_message .md h4') && document.querySelector('.k-agent_message .md pre.code code')`)
	alice.waitJS("the streaming message replaced", `document.querySelectorAll('#live .agent-msg').length === 0`)
	if got := eval[string](alice, `document.querySelector('.k-agent_message .md h4').textContent`); got != "The cause" {
		t.Fatalf("heading %q", got)
	}
	if got := eval[string](alice, `document.querySelector('.k-agent_message .md pre.code code').textContent`); got != "readManifest()\nsendParts()\n" && got != "readManifest()\nsendParts()" {
		t.Fatalf("code block %q", got)
	}
	if got := eval[string](alice, `document.querySelector('.k-agent_message .md a').href`); got != "https://example.com/upload" {
		t.Fatalf("link %q", got)
	}

	// Usage per turn and in the header.
	f.event(session.KindUsage, "system", session.UsageData{Turn: 1, Model: "claude-sonnet-4", InputTokens: 12000, OutputTokens: 3400, CachedTokens: 8000, CostUSD: 0.0912})
	alice.waitRow("the usage row", ".k-usage", "3.4k out")
	alice.waitRow("the session's usage", "#usage-total", "$0.09")

	// The agent asks; the card shows its options and the title calls.
	f.event(session.KindApprovalRequested, "system", session.ApprovalRequestedData{Turn: 1, ID: "perm-1", Summary: "Run git push",
		Title: "git push origin fix-upload-resume", Kind: "execute",
		Options: []session.ApprovalOption{{ID: "allow", Name: "Allow once", Kind: "allow_once"}, {ID: "always", Name: "Always allow git push", Kind: "allow_always"}, {ID: "reject", Name: "Reject", Kind: "reject_once"}}})
	alice.waitJS("three option buttons", `document.querySelectorAll('.k-approval_requested button[data-option]').length === 3`)
	if got := eval[string](alice, `[...document.querySelectorAll('.k-approval_requested button[data-option]')].map((b) => b.textContent).join('|')`); got != "Allow once|Always allow git push|Reject" {
		t.Fatalf("option buttons %q", got)
	}
	alice.waitJS("the tab title", `document.title.startsWith('(!) Approval needed')`)

	screens := screenshotDir(t)
	alice.checkA11y("the agent session page")
	for _, theme := range []string{"light", "dark"} {
		alice.screenshot(screens, "agent-desktop-"+theme, 1280, 900, theme, false)
		alice.screenshot(screens, "agent-phone-"+theme, 390, 844, theme, true)
		alice.resetView()
	}

	alice.click(`.k-approval_requested button[data-option="always"]`)
	type sent struct {
		Type     string `json:"type"`
		ID       string `json:"id"`
		Allow    bool   `json:"allow"`
		OptionID string `json:"option_id"`
	}
	alice.waitJS("the approve frame", `window.__sent.some((f) => f.type === 'approve')`)
	got := eval[[]sent](alice, `window.__sent.filter((f) => f.type === 'approve')`)
	if len(got) != 1 || got[0].ID != "perm-1" || !got[0].Allow || got[0].OptionID != "always" {
		t.Fatalf("approve frames %+v, want one for perm-1 allowing with option_id always", got)
	}
	f.event(session.KindApprovalResolved, "alice", session.ApprovalResolvedData{Turn: 1, ID: "perm-1", Allow: true, OptionID: "always"})
	alice.waitRow("the resolved card", ".k-approval_requested .outcome", "Allowed by alice: Always allow git push")
	alice.waitJS("the title calm again", `!document.title.startsWith('(!)')`)

	// Hostile content everywhere shows as text.
	f.event(session.KindAgentMessage, "system", session.AgentMessageData{Turn: 1, MessageID: "t1-m2", Text: hostile + "\n\n" + strings.Repeat("x", 300000)})
	f.event(session.KindAgentMessage, "system", session.AgentMessageData{Turn: 1, MessageID: "t1-m3", Text: hostile})
	f.event(session.KindToolCall, "system", session.ToolCallData{Turn: 1, ID: "call-3", Title: hostile, Kind: "<b>edit</b>", Status: "completed",
		Content: []session.ToolCallContent{
			{Type: "diff", Path: "<img src=x onerror=window.__pwned=4>\x1b[2J.go", OldText: strp(hostile + "\n"), NewText: hostile + "2\n" + strings.Repeat("y", 100000) + "\n"},
			{Type: "content", Content: json.RawMessage(mustJSON(t, map[string]string{"type": "text", "text": hostile}))},
		},
		Locations: []session.ToolLocation{{Path: hostile}}})
	alice.waitRow("the hostile tool card", `.tool[data-tool="call-3"] .diff summary`, "\u241b[2J.go")
	alice.waitRow("the hostile message", ".k-agent_message", "<script>window.__pwned = 1</script>")
	type verdict struct {
		Pwned    bool `json:"pwned"`
		Elements int  `json:"elements"`
		JSLinks  int  `json:"jsLinks"`
		Bold     int  `json:"bold"`
	}
	v := eval[verdict](alice, `(() => {
		const rows = document.querySelector('#rows');
		return {
			pwned: window.__pwned !== undefined,
			elements: rows.querySelectorAll('script, img, iframe, object, embed, style').length,
			jsLinks: [...rows.querySelectorAll('a')].filter((a) => !/^(https?|mailto):/.test(a.href)).length,
			bold: [...rows.querySelectorAll('b')].length,
		};
	})()`)
	if v.Pwned || v.Elements != 0 || v.JSLinks != 0 || v.Bold != 0 {
		t.Fatalf("hostile content became markup: %+v", v)
	}
	if !eval[bool](alice, `[...document.querySelectorAll('.k-agent_message')].some((e) => e.textContent.includes('<b>bold?</b>') && e.textContent.includes('\u241b[31mred'))`) {
		t.Fatal("the hostile message is not shown as text with its escapes visible")
	}

	// Esc on bob's turn asks first; "Keep it running" sends nothing.
	alice.do(chromedp.Focus(chromedp.CSS("#timeline")))
	alice.key(kb.Escape)
	alice.waitJS("the confirmation", `document.querySelector('#confirm-cancel').open`)
	if txt := eval[string](alice, `document.querySelector('#confirm-cancel-text').textContent`); !strings.Contains(txt, "bob") {
		t.Fatalf("confirmation %q does not name bob", txt)
	}
	alice.click("#confirm-cancel-no")
	alice.waitJS("the confirmation closed", `!document.querySelector('#confirm-cancel').open`)
	if eval[bool](alice, `window.__sent.some((f) => f.type === 'cancel')`) {
		t.Fatal("a cancel was sent though alice kept the turn running")
	}
	alice.click("#cancel-turn")
	alice.waitJS("the confirmation again", `document.querySelector('#confirm-cancel').open`)
	alice.click("#confirm-cancel-yes")
	alice.waitJS("the cancel frame", `window.__sent.some((f) => f.type === 'cancel')`)

	// Turn 1 ends; alice's queued prompt heads turn 2.
	f.event(session.KindTurnFinished, "system", session.TurnFinishedData{Turn: 1, Status: session.TurnOK, DurationMS: 61000})
	f.event(session.KindTurnStarted, "alice", session.TurnStartedData{Turn: 2, PromptSeq: queued})
	alice.waitRow("the queued prompt heading turn 2", ".k-turn_started.turnhead", "Then open a pull request.")
	alice.waitJS("an empty queue", `document.querySelector('#queue').hidden`)
	last := f.event(session.KindAgentMessage, "system", session.AgentMessageData{Turn: 2, MessageID: "t2-m1", Text: "Opened the pull request."})
	alice.waitJS("turn 2's message under its prompt", fmt.Sprintf(`document.querySelector('.ev[data-seq="%d"]')?.dataset.turn === '2'`, last))
	// Own turn: Esc cancels without asking.
	alice.do(chromedp.Focus(chromedp.CSS("#timeline")))
	alice.key(kb.Escape)
	alice.waitJS("a second cancel frame", `window.__sent.filter((f) => f.type === 'cancel').length === 2`)
	if eval[bool](alice, `document.querySelector('#confirm-cancel').open`) {
		t.Fatal("cancelling one's own turn asked for confirmation")
	}
}

// TestBrowser_SharedSessionAppears: a session shared with bob shows up on
// bob's open sessions page without a reload (the page polls the list while
// it is visible; there is no list push), and leaves it when its owner
// deletes it from the session's page.
func TestBrowser_SharedSessionAppears(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	bob := st.open("bob")
	bob.waitJS("the empty list", `document.querySelector('#session-count').textContent.startsWith('No sessions')`)
	s := st.create("alice", "Shared later", "shell")
	st.api("alice", http.StatusOK, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "viewer"}, nil)
	bob.waitRow("the shared session", "#sessions li", "Shared later")
	if !eval[bool](bob, `document.querySelector('#sessions li[data-id="`+string(s.ID)+`"]').classList.contains('fresh')`) {
		t.Fatal("the new session is not marked as new")
	}

	// Alice deletes it from its page (asked twice); it leaves bob's list.
	alice := st.open("alice")
	alice.openSession(s.ID)
	alice.click("#share-open")
	alice.click("#delete-session")
	alice.click("#delete-confirm")
	alice.waitJS("the sessions page", `location.pathname === '/' && document.querySelector('#sessions-h')`)
	bob.waitJS("the deleted session gone", `!document.querySelector('#sessions li[data-id="`+string(s.ID)+`"]')`)
	st.api("alice", http.StatusNotFound, "GET", "/v1/sessions/"+string(s.ID), nil, nil)
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
