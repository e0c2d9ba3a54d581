package browser

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// textContent is a tool call's ACP text content, as agents send it.
func textContent(t testing.TB, text string) []session.ToolCallContent {
	t.Helper()
	raw, err := json.Marshal(map[string]string{"type": "text", "text": text})
	if err != nil {
		t.Fatal(err)
	}
	return []session.ToolCallContent{{Type: "content", Content: raw}}
}

// TestBrowser_ToolContent feeds a session page what claude-agent-acp sends
// for a Bash tool: output as one fenced markdown block ("```console … ```"),
// and a permission request whose content is the command's description. The
// card shows the output inside the fence as terminal text, tailed when long,
// with no fence lines, hostile text as text; the approval card shows the
// description under no "Output" heading. Plain (codex, gemini) and
// multi-block text stays as it came.
func TestBrowser_ToolContent(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "Claude's Bash tool", "shell")
	var info session.Session
	st.api("alice", http.StatusOK, "GET", "/v1/sessions/"+string(s.ID), nil, &info)

	alice := st.open("alice")
	alice.tapWS()
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)
	f := &feeder{tb: alice, seq: info.LastSeq, at: time.Now().UTC().Add(-time.Minute)}

	prompt := f.event(session.KindMessage, "alice", session.MessageData{Text: "List the files.", ClientID: "p-1"})
	f.event(session.KindTurnStarted, "alice", session.TurnStartedData{Turn: 1, PromptSeq: prompt})

	// The approval: claude puts the command's description in content.
	f.event(session.KindApprovalRequested, "system", session.ApprovalRequestedData{Turn: 1, ID: "perm-1", Summary: "ls -la",
		Title: "ls -la", Kind: "execute", Content: textContent(t, "List all files in the workspace"),
		Options: []session.ApprovalOption{{ID: "allow", Name: "Allow", Kind: "allow_once"}, {ID: "reject", Name: "Reject", Kind: "reject_once"}}})
	alice.waitRow("the approval's description", ".k-approval_requested .ap-content", "List all files in the workspace")
	if got := eval[string](alice, `document.querySelector('.k-approval_requested .ap-content').innerText`); strings.Contains(got, "Output") {
		t.Fatalf("the approval card shows %q, want the description under no \"Output\" heading", got)
	}

	// A short fenced output: the inside shows, the fences do not.
	f.event(session.KindToolCall, "system", session.ToolCallData{Turn: 1, ID: "toolu_1", Title: "ls -la", Kind: "execute", Status: "completed",
		Content: textContent(t, "```console\ntotal 8\n-rw-r--r-- 1 a a 3 a.txt\n"+hostile+"\n```")})
	alice.waitRow("the tool card", `.k-tool_call .tool[data-tool="toolu_1"]`, "a.txt")
	got := eval[string](alice, `document.querySelector('.tool[data-tool="toolu_1"] pre.term').textContent`)
	if strings.Contains(got, "```") || !strings.HasPrefix(got, "total 8\n") || !strings.Contains(got, "<script>") {
		t.Fatalf("the output shows %q, want the inside of the fence as text", got)
	}
	if got := eval[string](alice, `document.querySelector('.tool[data-tool="toolu_1"] details.output summary').textContent`); got != "Output · 3 lines" {
		t.Fatalf("output summary %q", got)
	}

	// A long fenced output: its tail shows, and "Show all" shows the rest
	// without the fences.
	var long strings.Builder
	long.WriteString("```console\n")
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&long, "line %d\n", i)
	}
	long.WriteString("```")
	f.event(session.KindToolCall, "system", session.ToolCallData{Turn: 1, ID: "toolu_2", Title: "seq 100", Kind: "execute", Status: "completed",
		Content: textContent(t, long.String())})
	alice.waitRow("the long tool card", `.k-tool_call .tool[data-tool="toolu_2"]`, "line 100")
	if got := eval[string](alice, `document.querySelector('.tool[data-tool="toolu_2"] details.output summary').textContent`); got != "Output · last 16 of 100 lines" {
		t.Fatalf("long output summary %q", got)
	}
	alice.click(`.tool[data-tool="toolu_2"] button.more`)
	alice.waitJS("all of the long output", `document.querySelector('.tool[data-tool="toolu_2"] pre.term').textContent.startsWith('line 1\n')`)
	if got := eval[string](alice, `document.querySelector('.tool[data-tool="toolu_2"] pre.term').textContent`); strings.Contains(got, "```") {
		t.Fatalf("the expanded output shows a fence: %q", got[len(got)-40:])
	}

	// Plain text and two fenced blocks stay as they came.
	two := "```\na\n```\n```\nb\n```"
	f.event(session.KindToolCall, "system", session.ToolCallData{Turn: 1, ID: "toolu_3", Title: "two blocks", Kind: "other", Status: "completed",
		Content: textContent(t, two)})
	alice.waitRow("the two-block card", `.k-tool_call .tool[data-tool="toolu_3"]`, "two blocks")
	if got := eval[string](alice, `document.querySelector('.tool[data-tool="toolu_3"] pre.term').textContent`); got != two {
		t.Fatalf("two blocks show as %q, want %q", got, two)
	}
	if eval[bool](alice, `window.__pwned !== undefined`) {
		t.Fatal("hostile tool output ran")
	}
}
