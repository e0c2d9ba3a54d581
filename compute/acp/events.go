package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
)

// Sink receives what the agent reports during one prompt.
//
// Delta, Event and Problem are called on the client's read loop, in the
// order the agent sent things; while one blocks, the client reads nothing
// more from the agent (backpressure, not buffering). Permission is called on
// its own goroutine.
type Sink interface {
	// Delta is streaming text of the agent message being written; not
	// durable.
	Delta(d session.DeltaFrame)
	// Event is a durable event: kind is one of the agent kinds and data
	// its encoded data object (session.AgentMessageData, …).
	Event(kind session.Kind, data json.RawMessage)
	// Permission asks a driver to choose one of req.Options. It returns
	// the chosen option's id, or ok false when the request was cancelled
	// (ctx ends when the prompt ends or is cancelled).
	Permission(ctx context.Context, req Permission) (optionID string, ok bool)
	// Problem reports something wrong with the agent's output that the
	// client survived (a malformed or oversized message). The client
	// reports each kind of problem at most maxProblems times a prompt.
	Problem(msg string)
}

// Permission is a session/request_permission of the agent.
type Permission struct {
	Turn       int64
	ToolCallID string
	Title      string
	Kind       string
	Content    []session.ToolCallContent
	Options    []session.ApprovalOption
}

// Bounds of what one prompt produces.
const (
	// maxTextBytes bounds the text of one agent_message or agent_thought:
	// longer text is split into several events.
	maxTextBytes = 256 << 10
	// maxTitleBytes bounds a tool call's title.
	maxTitleBytes = 4 << 10
	// maxProblems bounds the problem reports of one prompt.
	maxProblems = 8
	// maxTools bounds the tool call ids one prompt remembers.
	maxTools = 10000
)

// promptState is one prompt in progress: the sink and the message being
// assembled. The fields below the line are owned by the read loop.
type promptState struct {
	turn   int64
	sink   Sink
	ctx    context.Context // ends with the prompt
	cancel context.CancelFunc

	permMu    sync.Mutex
	permStops []context.CancelFunc // guarded by permMu: open permission requests
	permDone  bool                 // guarded by permMu: no more answers (cancelled or ended)
	probMu    sync.Mutex
	problems  int // guarded by probMu

	// ---
	msgN    int
	msgID   string
	msg     []byte // text of the open agent_message
	thought []byte // text of the open agent_thought
	tools   map[string]bool
	unknown map[string]bool // update kinds not understood, said once each
}

func (p *promptState) problem(msg string) {
	p.probMu.Lock()
	p.problems++
	n := p.problems
	p.probMu.Unlock()
	switch {
	case n < maxProblems:
		p.sink.Problem(msg)
	case n == maxProblems:
		p.sink.Problem(msg + "; further problems in this turn are not reported")
	}
}

// wire shapes of session/update (ACP schema, camelCase).
type (
	wireUpdate struct {
		Kind       string          `json:"sessionUpdate"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"toolCallId"`
		Title      *string         `json:"title"`
		ToolKind   *string         `json:"kind"`
		Status     *string         `json:"status"`
		Locations  []wireLocation  `json:"locations"`
		Entries    []wirePlanEntry `json:"entries"`
	}
	wireLocation struct {
		Path string `json:"path"`
		Line *int   `json:"line,omitempty"`
	}
	wirePlanEntry struct {
		Content  string `json:"content"`
		Status   string `json:"status"`
		Priority string `json:"priority"`
	}
	wireBlock struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	wireToolContent struct {
		Type       string          `json:"type"`
		Content    json.RawMessage `json:"content"`
		Path       string          `json:"path"`
		OldText    *string         `json:"oldText"`
		NewText    string          `json:"newText"`
		TerminalID string          `json:"terminalId"`
	}
	permissionParams struct {
		SessionID string `json:"sessionId"`
		ToolCall  struct {
			ToolCallID string          `json:"toolCallId"`
			Title      string          `json:"title"`
			Kind       string          `json:"kind"`
			Content    json.RawMessage `json:"content"`
		} `json:"toolCall"`
		Options []struct {
			OptionID string `json:"optionId"`
			Name     string `json:"name"`
			Kind     string `json:"kind"`
		} `json:"options"`
	}
)

// update maps one session/update.
func (p *promptState) update(raw json.RawMessage, log *slog.Logger) {
	var u wireUpdate
	if err := json.Unmarshal(raw, &u); err != nil {
		log.Warn("session/update not understood", "err", shortErr(err))
		p.problem("the agent sent an update that could not be read; it was ignored")
		return
	}
	switch u.Kind {
	case "agent_message_chunk":
		p.endThought()
		text := blockText(u.Content)
		if text == "" {
			return
		}
		if p.msgID == "" {
			p.msgN++
			p.msgID = "t" + strconv.FormatInt(p.turn, 10) + "-m" + strconv.Itoa(p.msgN)
		}
		if len(p.msg)+len(text) > maxTextBytes {
			p.endMessage()
			p.msgN++
			p.msgID = "t" + strconv.FormatInt(p.turn, 10) + "-m" + strconv.Itoa(p.msgN)
		}
		p.msg = append(p.msg, text...)
		p.sink.Delta(session.DeltaFrame{Type: session.FrameDelta, Turn: p.turn, MessageID: p.msgID, Text: text})
	case "agent_thought_chunk":
		p.endMessage()
		text := blockText(u.Content)
		if len(p.thought)+len(text) > maxTextBytes {
			p.endThought()
		}
		p.thought = append(p.thought, text...)
	case "tool_call", "tool_call_update":
		p.flush()
		if u.ToolCallID == "" {
			log.Debug("tool call without an id ignored")
			return
		}
		content := toolContent(u.Content)
		if !p.tools[u.ToolCallID] && len(p.tools) < maxTools {
			p.tools[u.ToolCallID] = true
			d := session.ToolCallData{Turn: p.turn, ID: u.ToolCallID, Content: content, Locations: []session.ToolLocation{}}
			d.Title, d.Kind, d.Status = deref(u.Title), deref(u.ToolKind), deref(u.Status)
			if d.Kind == "" {
				d.Kind = "other"
			}
			if d.Status == "" {
				d.Status = "pending"
			}
			if d.Content == nil {
				d.Content = []session.ToolCallContent{}
			}
			for _, l := range u.Locations {
				d.Locations = append(d.Locations, session.ToolLocation{Path: l.Path, Line: l.Line})
			}
			d.Title = truncate(d.Title, maxTitleBytes)
			p.sink.Event(session.KindToolCall, mustJSON(d))
			return
		}
		d := session.ToolCallUpdateData{Turn: p.turn, ID: u.ToolCallID, Status: deref(u.Status),
			Title: truncate(deref(u.Title), maxTitleBytes), Content: content}
		p.sink.Event(session.KindToolCallUpdate, mustJSON(d))
	case "plan":
		p.flush()
		d := session.PlanData{Turn: p.turn, Entries: make([]session.PlanEntry, 0, len(u.Entries))}
		for _, e := range u.Entries {
			d.Entries = append(d.Entries, session.PlanEntry{Content: truncate(e.Content, maxTitleBytes), Status: e.Status, Priority: e.Priority})
		}
		b := mustJSON(d)
		for len(b) > session.MaxToolContentBytes && len(d.Entries) > 1 {
			d.Entries = d.Entries[:len(d.Entries)/2]
			b = mustJSON(d)
		}
		p.sink.Event(session.KindPlan, b)
	case "user_message_chunk", "available_commands_update", "current_mode_update", "config_option_update",
		"session_info_update", "usage_update":
		// Not part of Atrium's log: the prompt is logged as a message
		// event, and usage is counted by the model gateway.
	default:
		// A kind of a later ACP version, or an agent's own: said once a
		// turn (bounded like every problem), never recorded as it came.
		kind := validText([]byte(truncate(u.Kind, 64)))
		if p.unknown[kind] {
			return
		}
		if p.unknown == nil {
			p.unknown = map[string]bool{}
		}
		p.unknown[kind] = true
		log.Info("unknown session update ignored", "kind", kind)
		p.problem(fmt.Sprintf("the agent sent updates of a kind Atrium does not know (%q); they were ignored", kind))
	}
}

// flush ends the open message and thought (at a tool call, a plan, or the
// end of the prompt).
func (p *promptState) flush() {
	p.endThought()
	p.endMessage()
}

func (p *promptState) endMessage() {
	if p.msgID == "" {
		return
	}
	p.sink.Event(session.KindAgentMessage, mustJSON(session.AgentMessageData{Turn: p.turn, MessageID: p.msgID, Text: validText(p.msg)}))
	p.msgID, p.msg = "", nil
}

func (p *promptState) endThought() {
	if len(p.thought) == 0 {
		return
	}
	p.sink.Event(session.KindAgentThought, mustJSON(session.AgentThoughtData{Turn: p.turn, Text: validText(p.thought)}))
	p.thought = nil
}

// permission asks the sink; it runs on its own goroutine.
func (p *promptState) permission(req permissionParams) (string, bool) {
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	p.permMu.Lock()
	if p.permDone {
		p.permMu.Unlock()
		return "", false
	}
	p.permStops = append(p.permStops, cancel)
	p.permMu.Unlock()
	perm := Permission{
		Turn: p.turn, ToolCallID: req.ToolCall.ToolCallID, Title: truncate(req.ToolCall.Title, maxTitleBytes),
		Kind: req.ToolCall.Kind, Content: toolContent(req.ToolCall.Content),
	}
	for _, o := range req.Options {
		perm.Options = append(perm.Options, session.ApprovalOption{ID: o.OptionID, Name: truncate(o.Name, 256), Kind: o.Kind})
	}
	if len(perm.Options) == 0 {
		return "", false
	}
	id, ok := p.sink.Permission(ctx, perm)
	if !ok {
		return "", false
	}
	for _, o := range perm.Options {
		if o.ID == id {
			return id, true
		}
	}
	return "", false
}

// cancelPermissions answers every open permission request "cancelled".
func (p *promptState) cancelPermissions() {
	p.permMu.Lock()
	stops := p.permStops
	p.permStops, p.permDone = nil, true
	p.permMu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// blockText returns the text of an ACP content block ("" for other types).
func blockText(raw json.RawMessage) string {
	var b wireBlock
	if json.Unmarshal(raw, &b) != nil || b.Type != "text" {
		return ""
	}
	return b.Text
}

// toolContent maps ACP tool call content to Atrium's, bounded to
// session.MaxToolContentBytes once encoded: larger content is truncated,
// never split, so it stays valid JSON.
func toolContent(raw json.RawMessage) []session.ToolCallContent {
	if len(raw) == 0 {
		return nil
	}
	var items []wireToolContent
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil
	}
	out := make([]session.ToolCallContent, 0, len(items))
	for _, it := range items {
		c := session.ToolCallContent{Type: it.Type}
		switch it.Type {
		case "content":
			c.Content = it.Content
		case "diff":
			c.Path, c.OldText, c.NewText = it.Path, it.OldText, it.NewText
		case "terminal":
			c.TerminalID = it.TerminalID
		default:
			continue
		}
		out = append(out, c)
	}
	return boundContent(out)
}

// boundContent truncates content whose encoding exceeds
// session.MaxToolContentBytes: every text is cut to an equal share of the
// limit (with session.TruncatedMarker), and a content block that is not
// text is replaced by a note saying how large it was.
func boundContent(cs []session.ToolCallContent) []session.ToolCallContent {
	if len(mustJSON(cs)) <= session.MaxToolContentBytes {
		return cs
	}
	texts := 0
	for _, c := range cs {
		switch c.Type {
		case "content":
			texts++
		case "diff":
			texts += 2
		}
	}
	// JSON escaping can grow text up to 6×; leave room for it and for the
	// items' own fields.
	share := (session.MaxToolContentBytes - 4096 - 128*len(cs)) / 6 / max(texts, 1)
	for len(cs) > 0 && share < 64 {
		cs = cs[:len(cs)/2]
		share = (session.MaxToolContentBytes - 4096 - 128*len(cs)) / 6 / max(texts, 1)
	}
	for i := range cs {
		c := &cs[i]
		switch c.Type {
		case "content":
			var b map[string]any
			if json.Unmarshal(c.Content, &b) == nil {
				if t, ok := b["text"].(string); ok {
					b["text"] = truncate(t, share)
					c.Content = mustJSON(b)
					break
				}
			}
			if len(c.Content) > share {
				c.Content = mustJSON(wireBlock{Type: "text", Text: fmt.Sprintf("[a content block of %d bytes]", len(c.Content)) + session.TruncatedMarker})
			}
		case "diff":
			if c.OldText != nil {
				t := truncate(*c.OldText, share)
				c.OldText = &t
			}
			c.NewText = truncate(c.NewText, share)
		}
		c.Path = truncate(c.Path, maxTitleBytes)
	}
	return cs
}

// truncate cuts s to at most n bytes on a rune boundary, ending it with
// session.TruncatedMarker when it was cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len(session.TruncatedMarker), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + session.TruncatedMarker
}

// validText returns b as a string with invalid UTF-8 replaced (a split
// chunk boundary or a misbehaving agent).
func validText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string([]rune(string(b)))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("acp: encode: " + err.Error())
	}
	return b
}
