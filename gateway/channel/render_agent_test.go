package channel

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestThread_AgentTurn: a thread bound to an agent session shows tool calls
// and the plan's progress in the status message and posts the agent's final
// message as the turn's result, not its raw events.
func TestThread_AgentTurn(t *testing.T) {
	fc := &fakeChat{}
	q := newQueue("test", Backoff{Min: time.Millisecond, Max: time.Millisecond}, quiet)
	cfg := &Config{InlineOutput: 100, MaxFileBytes: 1000, EditEvery: time.Millisecond}
	th := newThread(fc, Thread{Platform: "fake"}, q, "https://atrium.test/s/s_1", cfg, nil)
	th.event(event(2, session.KindTurnStarted, "alice", session.TurnStartedData{Turn: 1, PromptSeq: 1}), false)
	th.event(event(3, session.KindAgentThought, session.BySystem, session.AgentThoughtData{Turn: 1, Text: "hmm"}), false)
	th.event(event(4, session.KindPlan, session.BySystem, session.PlanData{Turn: 1, Entries: []session.PlanEntry{{Content: "a", Status: "completed"}, {Content: "b", Status: "pending"}}}), false)
	th.event(event(5, session.KindToolCall, session.BySystem, session.ToolCallData{Turn: 1, ID: "c1", Title: "Edit main.go", Kind: "edit", Status: "in_progress"}), false)
	th.event(event(6, session.KindAgentMessage, session.BySystem, session.AgentMessageData{Turn: 1, MessageID: "m1", Text: "Let me look."}), false)
	th.event(event(7, session.KindToolCallUpdate, session.BySystem, session.ToolCallUpdateData{Turn: 1, ID: "c1", Status: "completed"}), false)
	th.event(event(8, session.KindApprovalRequested, session.BySystem, session.ApprovalRequestedData{Turn: 1, ID: "p1", Summary: "tool", Title: "git push",
		Options: []session.ApprovalOption{{ID: "o1", Name: "Allow once", Kind: "allow_once"}, {ID: "o2", Name: "Reject", Kind: "reject_once"}}}), false)
	runQueue(t, q)
	waitDrained(t, q)
	fc.mu.Lock()
	status, ask := fc.posts[fc.order[0]], fc.posts[fc.order[1]]
	fc.mu.Unlock()
	if !strings.Contains(status.Text, "Plan: 1 of 2 steps done") || !strings.Contains(status.Code, "✓ Edit main.go") {
		t.Errorf("status %+v: want the plan's progress and the completed tool call", status)
	}
	if !strings.Contains(ask.Text, "git push") || !strings.Contains(ask.Text, "Allow once · Reject") || len(ask.Buttons) != 2 {
		t.Errorf("approval %+v", ask)
	}
	th.event(event(9, session.KindApprovalResolved, "bob", session.ApprovalResolvedData{Turn: 1, ID: "p1", Allow: true, OptionID: "o1"}), false)
	th.event(event(10, session.KindAgentMessage, session.BySystem, session.AgentMessageData{Turn: 1, MessageID: "m2", Text: "## Done\n\nFixed the build."}), false)
	th.event(event(11, session.KindUsage, session.BySystem, session.UsageData{Turn: 1, InputTokens: 5}), false)
	th.event(event(12, session.KindTurnFinished, session.BySystem, session.TurnFinishedData{Turn: 1, Status: session.TurnOK, DurationMS: 2000}), false)
	waitDrained(t, q)

	fc.mu.Lock()
	n, files := len(fc.order), len(fc.files)
	var res Message
	if n == 3 {
		res = fc.posts[fc.order[2]]
	}
	fc.mu.Unlock()
	if n != 3 || files != 0 {
		t.Fatalf("%d messages and %d files, want 3 (status, approval, result)", n, files)
	}
	if !strings.Contains(res.Text, "Turn 1 finished") || !strings.HasSuffix(res.Text, "## Done\n\nFixed the build.") || strings.Contains(res.Text, "{") {
		t.Errorf("result %q: want the final message", res.Text)
	}

	// A final message too long for a chat message is attached.
	th.event(event(13, session.KindTurnStarted, "alice", session.TurnStartedData{Turn: 2, PromptSeq: 12}), false)
	long := strings.Repeat("word ", maxMessageText)
	th.event(event(14, session.KindAgentMessage, session.BySystem, session.AgentMessageData{Turn: 2, MessageID: "m3", Text: long}), false)
	th.event(event(15, session.KindTurnFinished, session.BySystem, session.TurnFinishedData{Turn: 2, Status: session.TurnOK}), false)
	waitDrained(t, q)
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.files) != 1 || fc.files[0].Name != "turn-2-message.md" || string(fc.files[0].Content) != strings.TrimSpace(long) {
		t.Errorf("files %d: want the long message attached", len(fc.files))
	}
}

// TestChatKinds fails when an event kind is added to the session package
// without the chat renderer deciding how to show it (issue 14).
func TestChatKinds(t *testing.T) {
	for _, k := range sessionKinds(t) {
		if _, ok := chatKinds[k]; !ok {
			t.Errorf("event kind %q has no entry in chatKinds (gateway/channel/render.go): decide how a chat thread shows it", k)
		}
	}
	for k := range chatKinds {
		if !strings.Contains(strings.Join(kindStrings(sessionKinds(t)), " "), string(k)) {
			t.Errorf("chatKinds lists %q, which is not a kind of the session package", k)
		}
	}
}

func kindStrings(ks []session.Kind) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = string(k)
	}
	return out
}

// sessionKinds returns every constant of type Kind declared in the session
// package's source: the list a new kind joins without anyone updating a
// registry.
func sessionKinds(t *testing.T) []session.Kind {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join("..", "..", "session", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("session sources: %v", err)
	}
	var kinds []session.Kind
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Kind" {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						kinds = append(kinds, session.Kind(s))
					}
				}
			}
		}
	}
	if len(kinds) < 12 {
		t.Fatalf("found only %d event kinds in the session package: the parser missed them", len(kinds))
	}
	return kinds
}
