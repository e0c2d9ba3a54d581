package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

func agentEv(t *testing.T, seq session.Seq, kind session.Kind, data any) session.Event {
	t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return session.Event{Seq: seq, Time: session.Time{Time: time.Unix(0, 0)}, Kind: kind, By: "system", Data: b}
}

func TestAgentKindSummary(t *testing.T) {
	old := "a\nb\nc\n"
	line := 7
	cases := []struct {
		name string
		ev   session.Event
		want []string // substrings
		not  []string
	}{
		{"message whole, one line", agentEv(t, 1, session.KindAgentMessage, session.AgentMessageData{Turn: 1, MessageID: "m", Text: "# Done\n\n" + strings.Repeat("word ", 100) + "end"}),
			[]string{"# Done ⏎  ⏎ word", "word end"}, []string{"\n", "…"}},
		{"tool call with a diff stat", agentEv(t, 2, session.KindToolCall, session.ToolCallData{Turn: 1, ID: "c1", Title: "Edit a.go", Kind: "edit", Status: "in_progress",
			Content: []session.ToolCallContent{{Type: "diff", Path: "a.go", OldText: &old, NewText: "a\nx\nc\nd\n"}}}),
			[]string{"[edit] Edit a.go (in_progress)", "a.go +2 −1"}, nil},
		{"new file", agentEv(t, 3, session.KindToolCall, session.ToolCallData{Turn: 1, ID: "c2", Title: "Write b.go", Kind: "edit", Status: "completed",
			Content: []session.ToolCallContent{{Type: "diff", Path: "b.go", NewText: "one\ntwo\n"}}}),
			[]string{"b.go new +2 −0"}, nil},
		{"location when no content", agentEv(t, 4, session.KindToolCall, session.ToolCallData{Turn: 1, ID: "c3", Title: "Read", Kind: "read", Status: "completed",
			Locations: []session.ToolLocation{{Path: "x.go", Line: &line}}}),
			[]string{"[read] Read (completed) · x.go:7"}, nil},
		{"update", agentEv(t, 5, session.KindToolCallUpdate, session.ToolCallUpdateData{Turn: 1, ID: "c1", Status: "completed",
			Content: []session.ToolCallContent{{Type: "content", Content: json.RawMessage(`{"type":"text","text":"l1\nl2\nl3\n"}`)}}}),
			[]string{"c1 → completed", "3 line(s) of output"}, nil},
		{"plan", agentEv(t, 6, session.KindPlan, session.PlanData{Turn: 1, Entries: []session.PlanEntry{{Content: "one", Status: "completed"}, {Content: "two", Status: "in_progress"}, {Content: "three", Status: "pending"}}}),
			[]string{"plan, 1 of 3 done", "[x] one", "[~] two", "[ ] three"}, nil},
		{"usage", agentEv(t, 7, session.KindUsage, session.UsageData{Turn: 1, Model: "m1", InputTokens: 10, OutputTokens: 5, CachedTokens: 2, CostUSD: 0.5}),
			[]string{"m1: 10 in, 5 out, 2 cached, $0.5000"}, nil},
		{"agent approval with options", agentEv(t, 8, session.KindApprovalRequested, session.ApprovalRequestedData{Turn: 1, ID: "p1", Summary: "s", Title: "git push",
			Options: []session.ApprovalOption{{ID: "ok", Name: "Allow once", Kind: "allow_once"}, {ID: "no", Name: "Reject", Kind: "reject_once"}}}),
			[]string{"turn 1 asks p1: git push; options: ok (Allow once), no (Reject)"}, nil},
		{"resolved with an option", agentEv(t, 9, session.KindApprovalResolved, session.ApprovalResolvedData{Turn: 1, ID: "p1", Allow: true, OptionID: "ok"}),
			[]string{"p1 allowed with option ok"}, nil},
		{"escapes made visible", agentEv(t, 10, session.KindAgentMessage, session.AgentMessageData{Text: "\x1b[2J\x1b]52;c;AAAA\x07hi\r"}),
			[]string{"␛[2J␛]52;c;AAAA␇hi␍"}, []string{"\x1b", "\x07", "\r"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := agentKindSummary(c.ev)
			if !ok {
				t.Fatalf("not rendered: %s", c.ev.Data)
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
			for _, n := range c.not {
				if strings.Contains(got, n) {
					t.Errorf("%q contains %q", got, n)
				}
			}
		})
	}
	// A harness's approval (no options) keeps the usual summary.
	if _, ok := agentKindSummary(agentEv(t, 11, session.KindApprovalRequested, session.ApprovalRequestedData{Turn: 1, ID: "x", Summary: "s"})); ok {
		t.Error("a harness approval took the agent summary")
	}
}

func TestDiffStat(t *testing.T) {
	cases := []struct {
		a, b         string
		added, remov int
	}{
		{"", "", 0, 0},
		{"a b c", "a b c", 0, 0},
		{"a b c", "a x c", 1, 1},
		{"", "a b", 2, 0},
		{"a b", "", 0, 2},
		{"a b c a b b a", "c b a b a c", 2, 3},
	}
	for _, c := range cases {
		a, b := strings.Fields(c.a), strings.Fields(c.b)
		if ad, rm := diffStat(a, b); ad != c.added || rm != c.remov {
			t.Errorf("diffStat(%q, %q) = +%d −%d, want +%d −%d", c.a, c.b, ad, rm, c.added, c.remov)
		}
	}
	// Beyond the edit bound the stat counts lines by content.
	var a, b []string
	for i := 0; i < 3000; i++ {
		a = append(a, "old"+strings.Repeat("x", i%7)+string(rune('a'+i%26)))
		b = append(b, "new"+string(rune('a'+i%26)))
	}
	if ad, rm := diffStat(a, b); ad != 3000 || rm != 3000 {
		t.Errorf("disjoint 3000-line texts: +%d −%d", ad, rm)
	}
}

func TestAttachAgentStream(t *testing.T) {
	var out bytes.Buffer
	var a agentStream
	a.delta(&out, session.DeltaFrame{Type: "delta", Turn: 1, MessageID: "m1", Text: "Hello, "})
	if got := out.String(); got != "agent> Hello, " {
		t.Fatalf("after one delta %q", got)
	}
	a.delta(&out, session.DeltaFrame{Type: "delta", Turn: 1, MessageID: "m1", Text: "world.\nSecond"})
	a.agentEvent(&out, agentEv(t, 5, session.KindAgentMessage, session.AgentMessageData{Turn: 1, MessageID: "m1", Text: "Hello, world.\nSecond"}))
	if got, want := out.String(), "agent> Hello, world.\n       Second\n"; got != want {
		t.Fatalf("streamed message %q, want %q (printed once)", got, want)
	}
	// Deltas missed before attaching: the durable message is printed whole.
	out.Reset()
	a.delta(&out, session.DeltaFrame{Type: "delta", Turn: 1, MessageID: "m2", Text: "tail"})
	a.agentEvent(&out, agentEv(t, 6, session.KindAgentMessage, session.AgentMessageData{Turn: 1, MessageID: "m2", Text: "head and tail"}))
	if got, want := out.String(), "agent> tail\nagent> head and tail\n"; got != want {
		t.Fatalf("partly streamed message %q, want %q", got, want)
	}
	// A tool call ends a streaming line first.
	out.Reset()
	a.delta(&out, session.DeltaFrame{Type: "delta", Turn: 1, MessageID: "m3", Text: "Let me look"})
	a.agentEvent(&out, agentEv(t, 7, session.KindToolCall, session.ToolCallData{Turn: 1, ID: "c", Title: "Read a.go", Kind: "read", Status: "pending"}))
	if got, want := out.String(), "agent> Let me look\n   ⚙ [read] Read a.go (pending)\n"; got != want {
		t.Fatalf("tool call after deltas %q, want %q", got, want)
	}
	out.Reset()
	a.agentEvent(&out, agentEv(t, 8, session.KindToolCallUpdate, session.ToolCallUpdateData{Turn: 1, ID: "c", Status: "completed",
		Content: []session.ToolCallContent{{Type: "content", Content: json.RawMessage(`{"type":"text","text":"1\n2\n3\n4\n5\n6\n7\n"}`)}}}))
	if got := out.String(); !strings.Contains(got, "c → completed") || !strings.Contains(got, "… 2 earlier line(s)") || !strings.HasSuffix(got, "7\n") {
		t.Fatalf("tool update %q: want its status and the tail of its output", got)
	}
}

// TestLogsAgentEvents: `atrium logs` prints an agent's message whole on its
// event's one line (not cut at 200 bytes), a tool call as its title, status
// and diff stat, and --json the server's bytes unchanged.
func TestLogsAgentEvents(t *testing.T) {
	var out bytes.Buffer
	p := &eventPrinter{out: &out, now: time.Unix(0, 0)}
	text := "## Done\n\n" + strings.Repeat("word ", 200) + "end"
	old := "a\n"
	evs := []session.Event{
		agentEv(t, 1, session.KindAgentMessage, session.AgentMessageData{Turn: 1, MessageID: "m", Text: text}),
		agentEv(t, 2, session.KindToolCall, session.ToolCallData{Turn: 1, ID: "c", Title: "Edit a.go", Kind: "edit", Status: "completed",
			Content: []session.ToolCallContent{{Type: "diff", Path: "a.go", OldText: &old, NewText: "b\n"}}}),
	}
	for _, ev := range evs {
		if err := p.print(ev, nil); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want one per event:\n%s", len(lines), out.String())
	}
	if !strings.Contains(lines[0], "agent_message") || !strings.Contains(lines[0], "## Done ⏎  ⏎ word") || !strings.HasSuffix(lines[0], "word end") {
		t.Errorf("message line %q", lines[0])
	}
	if !strings.Contains(lines[1], "[edit] Edit a.go (completed) · a.go +1 −1") {
		t.Errorf("tool call line %q", lines[1])
	}
	out.Reset()
	p.json = true
	raw := []byte(`{"seq":1,"kind":"agent_message","data":{"turn":1,"message_id":"m","text":"x"}}`)
	if err := p.print(evs[0], raw); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != string(raw)+"\n" {
		t.Errorf("--json printed %q, want the server's bytes", got)
	}
}
