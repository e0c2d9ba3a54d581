package acp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// script is the agent's side of a connection: it reads what the client
// writes and writes raw lines back, so a test can send anything, malformed
// or oversized messages included.
type script struct {
	t   testing.TB
	in  *bufio.Reader // what the client wrote
	out *io.PipeWriter
	c   *Client
}

// req is a message the client sent.
type req struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
}

func newScript(t testing.TB, cfg Config) *script {
	t.Helper()
	toAgentR, toAgentW := io.Pipe()
	fromAgentR, fromAgentW := io.Pipe()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &script{t: t, in: bufio.NewReaderSize(toAgentR, 1<<20), out: fromAgentW}
	s.c = Start(toAgentW, fromAgentR, cfg)
	t.Cleanup(func() {
		fromAgentW.Close()
		toAgentR.Close()
		s.c.Wait()
	})
	return s
}

// next reads the client's next message.
func (s *script) next() req {
	s.t.Helper()
	line, err := s.in.ReadBytes('\n')
	if err != nil {
		s.t.Fatalf("read the client's message: %v", err)
	}
	var r req
	if err := json.Unmarshal(line, &r); err != nil {
		s.t.Fatalf("client wrote %q: %v", line, err)
	}
	return r
}

// expect reads the next message and checks its method.
func (s *script) expect(method string) req {
	s.t.Helper()
	r := s.next()
	if r.Method != method {
		s.t.Fatalf("client sent %q, want %q", r.Method, method)
	}
	return r
}

func (s *script) line(v any) {
	s.t.Helper()
	var b []byte
	switch v := v.(type) {
	case string:
		b = []byte(v)
	default:
		b, _ = json.Marshal(v)
	}
	if _, err := s.out.Write(append(b, '\n')); err != nil {
		s.t.Fatalf("write to the client: %v", err)
	}
}

func (s *script) answer(r req, result any) {
	s.line(map[string]any{"jsonrpc": "2.0", "id": r.ID, "result": result})
}

func (s *script) update(u map[string]any) {
	s.line(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{"sessionId": "s1", "update": u}})
}

func chunk(kind, text string) map[string]any {
	return map[string]any{"sessionUpdate": kind, "content": map[string]any{"type": "text", "text": text}}
}

// open initializes and opens session s1.
func (s *script) open(load bool) {
	s.t.Helper()
	done := make(chan error, 1)
	go func() {
		if _, err := s.c.Initialize(context.Background()); err != nil {
			done <- err
			return
		}
		_, err := s.c.NewSession(context.Background(), "/workspace", nil)
		done <- err
	}()
	r := s.expect("initialize")
	var p struct {
		ProtocolVersion    int `json:"protocolVersion"`
		ClientCapabilities struct {
			FS       map[string]bool `json:"fs"`
			Terminal bool            `json:"terminal"`
		} `json:"clientCapabilities"`
	}
	json.Unmarshal(r.Params, &p)
	if p.ProtocolVersion != 1 || p.ClientCapabilities.Terminal || p.ClientCapabilities.FS["readTextFile"] || p.ClientCapabilities.FS["writeTextFile"] {
		s.t.Errorf("initialize params = %s, want version 1 and no fs/terminal capability", r.Params)
	}
	s.answer(r, map[string]any{"protocolVersion": 1, "agentCapabilities": map[string]any{"loadSession": load}})
	r = s.expect("session/new")
	if !strings.Contains(string(r.Params), `"cwd":"/workspace"`) || !strings.Contains(string(r.Params), `"mcpServers":[]`) {
		s.t.Errorf("session/new params = %s", r.Params)
	}
	s.answer(r, map[string]any{"sessionId": "s1"})
	if err := <-done; err != nil {
		s.t.Fatalf("open: %v", err)
	}
}

// recorder is a Sink that records everything.
type recorder struct {
	mu       sync.Mutex
	deltas   []session.DeltaFrame
	events   []recorded
	problems []string
	answer   func(Permission) (string, bool) // nil: wait for ctx
	perms    chan Permission
}

type recorded struct {
	kind session.Kind
	data json.RawMessage
}

func newRecorder() *recorder { return &recorder{perms: make(chan Permission, 4)} }

func (r *recorder) Delta(d session.DeltaFrame) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deltas = append(r.deltas, d)
}

func (r *recorder) Event(kind session.Kind, data json.RawMessage) {
	if !json.Valid(data) {
		panic("invalid event data")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recorded{kind, data})
}

func (r *recorder) Problem(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = append(r.problems, msg)
}

func (r *recorder) Permission(ctx context.Context, p Permission) (string, bool) {
	r.perms <- p
	if r.answer != nil {
		return r.answer(p)
	}
	<-ctx.Done()
	return "", false
}

func (r *recorder) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []string
	for _, e := range r.events {
		ks = append(ks, string(e.kind))
	}
	return ks
}

func decode[T any](t testing.TB, raw json.RawMessage) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return v
}

// prompt runs a prompt on a goroutine; the result arrives on the channel.
type promptResult struct {
	stop string
	err  error
}

func (s *script) prompt(turn int64, text string, sink Sink) (<-chan promptResult, req) {
	s.t.Helper()
	ch := make(chan promptResult, 1)
	go func() {
		stop, err := s.c.Prompt(context.Background(), turn, text, sink)
		ch <- promptResult{stop, err}
	}()
	r := s.expect("session/prompt")
	var p struct {
		SessionID string `json:"sessionId"`
		Prompt    []struct {
			Type, Text string
		} `json:"prompt"`
	}
	json.Unmarshal(r.Params, &p)
	if p.SessionID != "s1" || len(p.Prompt) != 1 || p.Prompt[0].Type != "text" || p.Prompt[0].Text != text {
		s.t.Errorf("session/prompt params = %s", r.Params)
	}
	return ch, r
}

func wait(t testing.TB, ch <-chan promptResult) promptResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("prompt did not return")
		return promptResult{}
	}
}

func TestClient_MessageChunks(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, r := s.prompt(1, "hello", rec)
	for _, w := range []string{"Hel", "lo, ", "wörld"} {
		s.update(chunk("agent_message_chunk", w))
	}
	s.answer(r, map[string]any{"stopReason": "end_turn"})
	res := wait(t, ch)
	if res.err != nil || res.stop != StopEndTurn {
		t.Fatalf("prompt = %+v", res)
	}
	if got := rec.kinds(); len(got) != 1 || got[0] != "agent_message" {
		t.Fatalf("events = %v, want one agent_message", got)
	}
	msg := decode[session.AgentMessageData](t, rec.events[0].data)
	if msg.Text != "Hello, wörld" || msg.Turn != 1 || msg.MessageID == "" {
		t.Errorf("agent_message = %+v", msg)
	}
	if len(rec.deltas) != 3 {
		t.Fatalf("deltas = %+v, want 3", rec.deltas)
	}
	for _, d := range rec.deltas {
		if d.Type != "delta" || d.MessageID != msg.MessageID || d.Turn != 1 {
			t.Errorf("delta %+v does not belong to message %s", d, msg.MessageID)
		}
	}
	if status, _ := Outcome(res.stop); status != session.TurnOK {
		t.Errorf("outcome = %s", status)
	}
}

func TestClient_ToolCallWithDiff(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, r := s.prompt(2, "edit", rec)
	s.update(chunk("agent_thought_chunk", "I should "))
	s.update(chunk("agent_thought_chunk", "edit a.txt"))
	s.update(chunk("agent_message_chunk", "Editing."))
	s.update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": "tc1", "title": "Edit a.txt", "kind": "edit", "status": "pending",
		"content":   []any{map[string]any{"type": "diff", "path": "/workspace/a.txt", "oldText": "old\n", "newText": "new\n"}},
		"locations": []any{map[string]any{"path": "/workspace/a.txt", "line": 1}}})
	s.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "tc1", "status": "completed",
		"content": []any{map[string]any{"type": "content", "content": map[string]any{"type": "text", "text": "done"}}}})
	s.update(chunk("agent_message_chunk", "Done."))
	s.answer(r, map[string]any{"stopReason": "end_turn"})
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	want := []string{"agent_thought", "agent_message", "tool_call", "tool_call_update", "agent_message"}
	if got := rec.kinds(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	if th := decode[session.AgentThoughtData](t, rec.events[0].data); th.Text != "I should edit a.txt" {
		t.Errorf("thought = %+v", th)
	}
	m1 := decode[session.AgentMessageData](t, rec.events[1].data)
	m2 := decode[session.AgentMessageData](t, rec.events[4].data)
	if m1.Text != "Editing." || m2.Text != "Done." || m1.MessageID == m2.MessageID {
		t.Errorf("messages = %+v, %+v", m1, m2)
	}
	raw := string(rec.events[2].data)
	for _, want := range []string{`"old_text":"old\n"`, `"new_text":"new\n"`, `"type":"diff"`, `"path":"/workspace/a.txt"`, `"kind":"edit"`, `"line":1`} {
		if !strings.Contains(raw, want) {
			t.Errorf("tool_call %s lacks %s", raw, want)
		}
	}
	if strings.Contains(raw, "oldText") {
		t.Errorf("tool_call %s keeps ACP's camelCase", raw)
	}
	up := decode[session.ToolCallUpdateData](t, rec.events[3].data)
	if up.ID != "tc1" || up.Status != "completed" || len(up.Content) != 1 || blockText(up.Content[0].Content) != "done" {
		t.Errorf("tool_call_update = %s", rec.events[3].data)
	}
}

// Gemini CLI sends no tool_call, only updates: the first one is the call.
func TestClient_UpdateOnlyToolCall(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, r := s.prompt(1, "run", rec)
	s.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "g1", "title": "ls", "kind": "execute", "status": "in_progress"})
	s.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "g1", "status": "completed"})
	s.answer(r, map[string]any{"stopReason": "end_turn"})
	wait(t, ch)
	if got := rec.kinds(); fmt.Sprint(got) != "[tool_call tool_call_update]" {
		t.Fatalf("events = %v", got)
	}
	tc := decode[session.ToolCallData](t, rec.events[0].data)
	if tc.ID != "g1" || tc.Title != "ls" || tc.Kind != "execute" || tc.Status != "in_progress" {
		t.Errorf("tool_call = %+v", tc)
	}
}

func TestClient_Plan(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, r := s.prompt(1, "plan", rec)
	s.update(map[string]any{"sessionUpdate": "plan", "entries": []any{
		map[string]any{"content": "read", "status": "completed", "priority": "high"},
		map[string]any{"content": "write", "status": "pending", "priority": "low"},
	}})
	s.update(map[string]any{"sessionUpdate": "brand_new_kind", "whatever": 1})
	s.update(map[string]any{"sessionUpdate": "available_commands_update", "availableCommands": []any{}})
	s.answer(r, map[string]any{"stopReason": "max_tokens"})
	res := wait(t, ch)
	if got := rec.kinds(); fmt.Sprint(got) != "[plan]" {
		t.Fatalf("events = %v", got)
	}
	p := decode[session.PlanData](t, rec.events[0].data)
	if len(p.Entries) != 2 || p.Entries[1] != (session.PlanEntry{Content: "write", Status: "pending", Priority: "low"}) {
		t.Errorf("plan = %+v", p)
	}
	if status, reason := Outcome(res.stop); status != session.TurnFailed || !strings.Contains(reason, "maximum number of tokens") {
		t.Errorf("outcome of %q = %s %q", res.stop, status, reason)
	}
}

func TestClient_Permission(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	rec.answer = func(p Permission) (string, bool) { return p.Options[1].ID, true }
	ch, r := s.prompt(3, "rm", rec)
	s.line(map[string]any{"jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission", "params": map[string]any{
		"sessionId": "s1",
		"toolCall":  map[string]any{"toolCallId": "tc9", "title": "rm -rf build", "kind": "execute"},
		"options": []any{
			map[string]any{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
			map[string]any{"optionId": "always", "name": "Always allow", "kind": "allow_always"},
			map[string]any{"optionId": "reject", "name": "Reject", "kind": "reject_once"},
		},
	}})
	ans := s.next()
	if string(ans.ID) != `"perm-1"` || string(ans.Result) != `{"outcome":{"optionId":"always","outcome":"selected"}}` {
		t.Errorf("answer = id %s result %s", ans.ID, ans.Result)
	}
	p := <-rec.perms
	if p.Title != "rm -rf build" || p.Kind != "execute" || p.Turn != 3 || len(p.Options) != 3 ||
		p.Options[2] != (session.ApprovalOption{ID: "reject", Name: "Reject", Kind: "reject_once"}) {
		t.Errorf("permission = %+v", p)
	}
	s.answer(r, map[string]any{"stopReason": "end_turn"})
	wait(t, ch)
}

func TestClient_Cancel(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder() // never answers: waits for the cancel
	ch, r := s.prompt(1, "long", rec)
	s.update(chunk("agent_message_chunk", "working"))
	s.line(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "session/request_permission", "params": map[string]any{
		"sessionId": "s1", "toolCall": map[string]any{"toolCallId": "t"},
		"options": []any{map[string]any{"optionId": "a", "name": "A", "kind": "allow_once"}},
	}})
	<-rec.perms
	go s.c.Cancel()
	// The permission request is answered cancelled and session/cancel
	// is sent, in either order.
	got := map[string]string{}
	for range 2 {
		m := s.next()
		if m.Method == "session/cancel" {
			got["cancel"] = string(m.Params)
		} else {
			got["perm"] = string(m.Result)
		}
	}
	if got["cancel"] != `{"sessionId":"s1"}` || got["perm"] != `{"outcome":{"outcome":"cancelled"}}` {
		t.Errorf("after cancel the agent got %v", got)
	}
	s.answer(r, map[string]any{"stopReason": "cancelled"})
	res := wait(t, ch)
	if status, _ := Outcome(res.stop); status != session.TurnCancelled {
		t.Errorf("outcome = %s", status)
	}
	// The partial message is still recorded.
	if k := rec.kinds(); fmt.Sprint(k) != "[agent_message]" {
		t.Errorf("events = %v", k)
	}
}

// A load's replay, before and after the load's answer, is not recorded.
func TestClient_LoadReplayIgnored(t *testing.T) {
	s := newScript(t, Config{})
	done := make(chan error, 1)
	go func() {
		info, err := s.c.Initialize(context.Background())
		if err == nil && !info.Capabilities.LoadSession {
			err = errors.New("loadSession not seen")
		}
		if err == nil {
			err = s.c.LoadSession(context.Background(), "s1", "/workspace", nil)
		}
		done <- err
	}()
	s.answer(s.expect("initialize"), map[string]any{"protocolVersion": 1, "agentCapabilities": map[string]any{"loadSession": true}})
	r := s.expect("session/load")
	if !strings.Contains(string(r.Params), `"sessionId":"s1"`) {
		t.Errorf("session/load params %s", r.Params)
	}
	s.update(chunk("user_message_chunk", "old prompt"))
	s.update(chunk("agent_message_chunk", "old answer"))
	s.answer(r, nil)
	// Some agents go on replaying after the answer: LoadSession returns
	// once they are quiet.
	s.update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": "old", "title": "replayed"})
	s.update(chunk("agent_message_chunk", "still replaying"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	ch, pr := s.prompt(5, "new", rec)
	s.update(chunk("agent_message_chunk", "fresh"))
	s.answer(pr, map[string]any{"stopReason": "end_turn"})
	wait(t, ch)
	if k := rec.kinds(); fmt.Sprint(k) != "[agent_message]" {
		t.Fatalf("events = %v", k)
	}
	if m := decode[session.AgentMessageData](t, rec.events[0].data); m.Text != "fresh" {
		t.Errorf("message = %+v", m)
	}
}

func TestClient_MalformedInput(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, r := s.prompt(1, "x", rec)
	s.line("this is not json")
	s.line(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":5}}}`)
	s.line(`{"jsonrpc":"2.0"}`)
	s.line(`{"jsonrpc":"2.0","id":"x","method":"fs/read_text_file","params":{}}`)
	if ans := s.next(); string(ans.ID) != `"x"` || ans.Method != "" || len(ans.Result) != 0 {
		t.Errorf("fs request answered %+v, want an error", ans)
	}
	s.update(chunk("agent_message_chunk", "ok"))
	s.answer(r, map[string]any{"stopReason": "end_turn"})
	res := wait(t, ch)
	if res.err != nil {
		t.Fatal(res.err)
	}
	if k := rec.kinds(); fmt.Sprint(k) != "[agent_message]" {
		t.Errorf("events = %v", k)
	}
	if len(rec.problems) != 2 {
		t.Errorf("problems = %q, want the non-JSON line and the unreadable update", rec.problems)
	}
	for _, p := range rec.problems {
		if strings.Contains(p, "this is not json") {
			t.Errorf("problem %q quotes the agent's output", p)
		}
	}
}

func TestClient_Oversize(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, r := s.prompt(1, "big", rec)
	// A 10 MB message is dropped; the connection survives.
	s.update(chunk("agent_message_chunk", strings.Repeat("x", 10<<20)))
	// Tool content over the event limit is truncated, not split.
	big := strings.Repeat("é\"<", 200<<10)
	s.update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "write", "kind": "edit",
		"content": []any{
			map[string]any{"type": "diff", "path": "/workspace/big", "oldText": big, "newText": big},
			map[string]any{"type": "content", "content": map[string]any{"type": "text", "text": big}},
		}})
	s.update(chunk("agent_message_chunk", "after"))
	s.answer(r, map[string]any{"stopReason": "end_turn"})
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	if k := rec.kinds(); fmt.Sprint(k) != "[tool_call agent_message]" {
		t.Fatalf("events = %v", k)
	}
	if len(rec.problems) != 1 || !strings.Contains(rec.problems[0], "over the limit") {
		t.Errorf("problems = %q", rec.problems)
	}
	raw := rec.events[0].data
	if len(raw) > session.MaxToolContentBytes+1024 {
		t.Errorf("tool_call is %d bytes, over the limit", len(raw))
	}
	tc := decode[session.ToolCallData](t, raw)
	if len(tc.Content) != 2 || !strings.HasSuffix(tc.Content[0].NewText, session.TruncatedMarker) ||
		!strings.HasSuffix(*tc.Content[0].OldText, session.TruncatedMarker) || !strings.Contains(string(tc.Content[1].Content), "truncated by atrium") {
		t.Errorf("tool_call content not truncated with the marker")
	}
	if m := decode[session.AgentMessageData](t, rec.events[1].data); m.Text != "after" {
		t.Errorf("message = %q", m.Text)
	}
}

func TestClient_CrashMidTurn(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, _ := s.prompt(1, "x", rec)
	s.update(chunk("agent_message_chunk", "partial"))
	s.out.Close() // the agent dies
	res := wait(t, ch)
	if !errors.Is(res.err, ErrClosed) {
		t.Fatalf("prompt err = %v, want ErrClosed", res.err)
	}
	<-s.c.Done()
	if !errors.Is(s.c.Err(), ErrClosed) {
		t.Errorf("Err = %v", s.c.Err())
	}
	if k := rec.kinds(); fmt.Sprint(k) != "[agent_message]" {
		t.Errorf("events = %v: the partial message is kept", k)
	}
	if _, err := s.c.Prompt(context.Background(), 2, "again", rec); !errors.Is(err, ErrClosed) {
		t.Errorf("prompt after crash = %v", err)
	}
}

func TestClient_InitializeTimeout(t *testing.T) {
	s := newScript(t, Config{InitTimeout: 100 * time.Millisecond})
	done := make(chan error, 1)
	go func() {
		_, err := s.c.Initialize(context.Background())
		done <- err
	}()
	s.expect("initialize") // and never answer
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "did not answer within") {
			t.Errorf("err = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Initialize did not time out")
	}
}

func TestClient_RPCError(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	ch, r := s.prompt(1, "x", newRecorder())
	s.line(map[string]any{"jsonrpc": "2.0", "id": r.ID, "error": map[string]any{"code": -32603, "message": "model unavailable"}})
	res := wait(t, ch)
	var rerr *RPCError
	if !errors.As(res.err, &rerr) || rerr.Message != "model unavailable" {
		t.Errorf("err = %v", res.err)
	}
}

func TestClient_SetMode(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	done := make(chan error, 1)
	go func() { done <- s.c.SetMode(context.Background(), "ask") }()
	r := s.expect("session/set_mode")
	if string(r.Params) != `{"modeId":"ask","sessionId":"s1"}` {
		t.Errorf("session/set_mode params %s", r.Params)
	}
	s.answer(r, map[string]any{})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
