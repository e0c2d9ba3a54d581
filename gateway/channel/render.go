package channel

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
)

// view is the part of a thread's rendering that outlives a driver: which
// messages were posted (to edit them rather than post them again) and where
// the running turn started (to rebuild its output after a takeover). It is
// stored in the session's Binding with the cursor.
type view struct {
	// Refs are the posted messages, by key ("status.3", "approval.17").
	Refs map[string]Ref `json:"refs,omitempty"`
	// Turn is the running turn, 0 if none; TurnStart is the seq of its
	// turn_started event.
	Turn      int64       `json:"turn,omitempty"`
	TurnStart session.Seq `json:"turn_start,omitempty"`
}

// approval is an approval request shown in the thread.
type approval struct {
	key     string
	summary string
}

// thread renders a session's events as messages in its chat thread. Its
// event methods are called by the session's driver goroutine, in seq order;
// the jobs it pushes run on the driver's chat queue.
type thread struct {
	ch      Channel
	th      Thread
	q       *queue
	link    string // URL of the session in the web UI, "" if unknown
	inline  int    // output up to this many bytes is shown in the message
	maxFile int    // output kept for the attached file
	editGap time.Duration

	mu      sync.Mutex
	refs    map[string]Ref       // guarded by mu
	order   []string             // guarded by mu: keys of refs, oldest first
	desired map[string]Message   // guarded by mu
	edited  map[string]time.Time // guarded by mu: when each message was last posted or edited

	// The running turn; used by the driver goroutine only.
	turn      int64
	turnStart session.Seq
	by        string
	out       []byte // the turn's output, up to maxFile bytes
	outTotal  int    // bytes of output, kept or not
	tail      []byte // the last tailBytes of output
	approvals map[string]*approval
	waiting   int        // approvals not yet answered
	spans     []turnSpan // the latest turns, oldest first
	// An agent's turn (DESIGN §7 "Agent events"): its latest message, which
	// the thread posts as the turn's result, and its plan's progress.
	final    string
	plan     string            // "2 of 5 steps done", "" without a plan
	agentish bool              // the turn has agent events: the result is the message, not the output
	titles   map[string]string // tool call id → title, for updates that carry none
}

// chatKinds says how a thread shows each event kind; kinds_test.go checks
// that every kind of the session package is here, so a new kind is a
// decision, not an oversight.
var chatKinds = map[session.Kind]string{
	session.KindSessionCreated:    "not shown (the thread is the session)",
	session.KindMessage:           "not shown (the prompt is in the thread already, or came from elsewhere)",
	session.KindTurnStarted:       "status message",
	session.KindOutput:            "status tail; result (inline or attached)",
	session.KindAgent:             "its text, as output",
	session.KindApprovalRequested: "approval message with buttons (and the agent's options named)",
	session.KindApprovalResolved:  "approval message edited",
	session.KindTurnFinished:      "status edited; result posted (an agent's final message)",
	session.KindSandbox:           "not shown",
	session.KindMemberChanged:     "not shown",
	session.KindPROpened:          "message with the link",
	session.KindError:             "message",
	session.KindAgentMessage:      "the turn's result: its latest message",
	session.KindAgentThought:      "not shown",
	session.KindToolCall:          "status tail: title and status",
	session.KindToolCallUpdate:    "status tail: title and status",
	session.KindPlan:              "status: progress",
	session.KindUsage:             "not shown",
	session.KindFilesChanged:      "not shown",
}

// turnSpan is where a turn's events are: from its turn_started event to its
// turn_finished event (0 while it runs).
type turnSpan struct {
	turn       int64
	start, end session.Seq
}

// maxSpans bounds the turns a thread remembers the span of.
const maxSpans = 16

// tailBytes of the running output are shown in the status message.
const tailBytes = 1500

func newThread(ch Channel, th Thread, q *queue, link string, cfg *Config, v *view) *thread {
	t := &thread{
		ch: ch, th: th, q: q, link: link,
		inline: cfg.InlineOutput, maxFile: cfg.MaxFileBytes, editGap: cfg.EditEvery,
		refs: make(map[string]Ref), desired: make(map[string]Message), edited: make(map[string]time.Time),
		approvals: make(map[string]*approval),
	}
	if v != nil {
		for k, r := range v.Refs {
			t.remember(k, r)
		}
	}
	return t
}

// maxRefs bounds the posted messages a thread remembers: only recent ones
// are ever edited again.
const maxRefs = 64

// remember records a posted message, forgetting the oldest beyond maxRefs.
// Call with mu held, or before the thread is shared.
func (t *thread) remember(key string, r Ref) {
	if _, ok := t.refs[key]; !ok {
		t.order = append(t.order, key)
	}
	t.refs[key] = r
	for len(t.order) > maxRefs {
		delete(t.refs, t.order[0])
		delete(t.desired, t.order[0])
		delete(t.edited, t.order[0])
		t.order = t.order[1:]
	}
}

// snapshot returns the view to store with cursor: the messages posted so
// far, and the turn that was running at cursor, which the next driver
// replays (silently) to render the events after cursor as this one would.
func (t *thread) snapshot(cursor session.Seq) *view {
	v := &view{}
	for i := len(t.spans) - 1; i >= 0; i-- {
		sp := t.spans[i]
		if sp.start <= cursor && (sp.end == 0 || sp.end > cursor) {
			v.Turn, v.TurnStart = sp.turn, sp.start
			break
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.refs) > 0 {
		v.Refs = make(map[string]Ref, len(t.refs))
		for k, r := range t.refs {
			v.Refs[k] = r
		}
	}
	return v
}

// show sets what message key should look like and, unless silent, pushes
// the job that makes it so.
func (t *thread) show(key string, seq session.Seq, m Message, silent bool) {
	t.mu.Lock()
	t.desired[key] = m
	_, posted := t.refs[key]
	last := t.edited[key]
	t.mu.Unlock()
	if silent {
		return
	}
	j := &job{key: "msg." + key, first: seq, last: seq, what: "show " + key, run: func(ctx context.Context) error { return t.sync(ctx, key) }}
	if posted {
		j.notBefore = last.Add(t.editGap)
	}
	t.q.push(j)
}

// sync posts or edits message key to look as desired.
func (t *thread) sync(ctx context.Context, key string) error {
	t.mu.Lock()
	m, ok := t.desired[key]
	ref := t.refs[key]
	t.mu.Unlock()
	if !ok {
		return nil // forgotten: far older than anything shown now
	}
	if ref == "" {
		r, err := t.ch.Post(ctx, t.th, m)
		if err != nil {
			return err
		}
		ref = r
	} else if err := t.ch.Edit(ctx, t.th, ref, m); err != nil {
		return err
	}
	t.mu.Lock()
	t.remember(key, ref)
	t.edited[key] = time.Now()
	t.mu.Unlock()
	return nil
}

// post pushes a new message that is never edited.
func (t *thread) post(key string, seq session.Seq, m Message, silent bool) {
	t.mu.Lock()
	_, posted := t.refs[key]
	t.mu.Unlock()
	if posted || silent {
		return // posted before a takeover
	}
	t.show(key, seq, m, false)
}

// event renders one event. silent rebuilds state without posting (the
// events a previous driver already delivered).
func (t *thread) event(ev *session.Event, silent bool) {
	switch ev.Kind {
	case session.KindTurnStarted:
		var d session.TurnStartedData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		t.turn, t.turnStart, t.by = d.Turn, ev.Seq, ev.By
		t.out, t.outTotal, t.tail, t.waiting = nil, 0, nil, 0
		t.final, t.plan, t.agentish, t.titles = "", "", false, nil
		t.spans = append(t.spans, turnSpan{turn: d.Turn, start: ev.Seq})
		if len(t.spans) > maxSpans {
			t.spans = t.spans[1:]
		}
		clear(t.approvals)
		t.show(t.statusKey(), ev.Seq, t.status(), silent)
	case session.KindOutput:
		var d session.OutputData
		if json.Unmarshal(ev.Data, &d) != nil || t.turn == 0 {
			return
		}
		t.output(d.Text)
		t.show(t.statusKey(), ev.Seq, t.status(), silent)
	case session.KindAgent:
		if t.turn == 0 {
			return
		}
		if text := agentText(ev.Data); text != "" {
			t.output(text)
			t.show(t.statusKey(), ev.Seq, t.status(), silent)
		}
	case session.KindAgentMessage:
		var d session.AgentMessageData
		if json.Unmarshal(ev.Data, &d) != nil || d.Turn != t.turn || t.turn == 0 {
			return
		}
		t.agentish = true
		if strings.TrimSpace(d.Text) != "" {
			t.final = d.Text
		}
	case session.KindToolCall, session.KindToolCallUpdate:
		var d session.ToolCallUpdateData // the fields both kinds share
		if json.Unmarshal(ev.Data, &d) != nil || d.Turn != t.turn || t.turn == 0 {
			return
		}
		t.agentish = true
		t.tool(d.ID, d.Title, d.Status)
		t.show(t.statusKey(), ev.Seq, t.status(), silent)
	case session.KindPlan:
		var d session.PlanData
		if json.Unmarshal(ev.Data, &d) != nil || d.Turn != t.turn || t.turn == 0 {
			return
		}
		t.agentish = true
		done := 0
		for _, e := range d.Entries {
			if e.Status == "completed" {
				done++
			}
		}
		t.plan = fmt.Sprintf("%d of %d steps done", done, len(d.Entries))
		t.show(t.statusKey(), ev.Seq, t.status(), silent)
	case session.KindApprovalRequested:
		var d session.ApprovalRequestedData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		if d.Title != "" {
			d.Summary = d.Title
		}
		a := &approval{key: "approval." + strconv.FormatInt(ev.Seq, 10), summary: d.Summary}
		t.approvals[d.ID] = a
		t.waiting++
		seq := strconv.FormatInt(ev.Seq, 10)
		var opts string
		if len(d.Options) > 0 {
			names := make([]string, 0, len(d.Options))
			for _, o := range d.Options {
				names = append(names, o.Name)
			}
			opts = "\nThe agent offers: " + strings.Join(names, " · ") + ". Approve allows, Deny rejects; the web UI offers each option."
		}
		t.show(a.key, ev.Seq, Message{
			Text: "🔐 Approval needed: " + orNothing(d.Summary, "(no summary)") + opts + "\nOnly drivers of the session can answer.",
			Buttons: []Button{
				{Label: "Approve", Action: ActionApprove, Value: seq, Style: StylePrimary},
				{Label: "Deny", Action: ActionDeny, Value: seq, Style: StyleDanger},
			},
		}, silent)
		if t.turn != 0 {
			t.show(t.statusKey(), ev.Seq, t.status(), silent)
		}
	case session.KindApprovalResolved:
		var d session.ApprovalResolvedData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		a := t.approvals[d.ID]
		if a == nil {
			return // requested before this driver's replay started
		}
		delete(t.approvals, d.ID)
		t.waiting--
		text := "✅ Approved by " + ev.By + ": " + orNothing(a.summary, "(no summary)")
		if !d.Allow {
			text = "🚫 Denied by " + ev.By + ": " + orNothing(a.summary, "(no summary)")
		}
		t.show(a.key, ev.Seq, Message{Text: text}, silent)
		if t.turn != 0 {
			t.show(t.statusKey(), ev.Seq, t.status(), silent)
		}
	case session.KindTurnFinished:
		var d session.TurnFinishedData
		if json.Unmarshal(ev.Data, &d) != nil || d.Turn != t.turn {
			return
		}
		if n := len(t.spans); n > 0 && t.spans[n-1].turn == d.Turn {
			t.spans[n-1].end = ev.Seq
		}
		t.finish(ev.Seq, d, silent)
	case session.KindError:
		var d session.ErrorData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		t.post("error."+strconv.FormatInt(ev.Seq, 10), ev.Seq, Message{Text: "⚠️ " + d.Message}, silent)
	case session.KindPROpened:
		var d session.PROpenedData
		if json.Unmarshal(ev.Data, &d) != nil {
			return
		}
		t.post("pr."+strconv.FormatInt(ev.Seq, 10), ev.Seq, Message{
			Text: "🔀 Pull request opened from branch " + orNothing(d.Branch, "(unknown)"),
			Link: &Link{Text: d.URL, URL: d.URL},
		}, silent)
	}
}

func (t *thread) statusKey() string { return "status." + strconv.FormatInt(t.turn, 10) }

func (t *thread) output(s string) {
	t.outTotal += len(s)
	if room := t.maxFile - len(t.out); room > 0 {
		t.out = append(t.out, truncateUTF8(s, room)...)
	}
	t.tail = append(t.tail, s...)
	if len(t.tail) > 2*tailBytes {
		t.tail = append(t.tail[:0], t.tail[len(t.tail)-tailBytes:]...)
	}
}

// status is the status message of the running turn.
func (t *thread) status() Message {
	text := fmt.Sprintf("⏳ Working on it (turn %d, asked by %s)…", t.turn, t.by)
	if t.waiting > 0 {
		text = fmt.Sprintf("⏸ Waiting for approval (turn %d, asked by %s)…", t.turn, t.by)
	}
	if t.plan != "" {
		text += "\nPlan: " + t.plan
	}
	m := Message{Text: text, Code: lastBytes(t.tail, tailBytes)}
	if t.link != "" {
		m.Link = &Link{Text: "Watch live in Atrium", URL: t.link}
	}
	return m
}

// finish renders the end of the running turn: the status message says how
// it ended, and the result is posted (attached as a file if it is long).
func (t *thread) finish(seq session.Seq, d session.TurnFinishedData, silent bool) {
	took := (time.Duration(d.DurationMS) * time.Millisecond).Round(100 * time.Millisecond)
	var head string
	switch d.Status {
	case session.TurnOK:
		head = fmt.Sprintf("✅ Turn %d finished in %s", d.Turn, took)
	case session.TurnCancelled:
		head = fmt.Sprintf("⏹ Turn %d was cancelled after %s", d.Turn, took)
	case session.TurnTimeout:
		head = fmt.Sprintf("⌛ Turn %d timed out after %s", d.Turn, took)
	default:
		head = fmt.Sprintf("❌ Turn %d failed (exit code %d) after %s", d.Turn, d.ExitCode, took)
	}
	statusKey := t.statusKey()
	t.show(statusKey, seq, Message{Text: head}, silent)

	resultKey := "result." + strconv.FormatInt(d.Turn, 10)
	var link *Link
	if t.link != "" {
		link = &Link{Text: "Open the session in Atrium", URL: t.link}
	}
	out := strings.TrimRight(string(t.out), "\n")
	final := strings.TrimSpace(t.final)
	switch {
	case t.agentish && final != "" && len(final) <= maxMessageText:
		// An agent's turn: its final message is the result.
		t.post(resultKey, seq, Message{Text: head + ":\n\n" + final, Link: link}, silent)
	case t.agentish && final != "":
		content := []byte(final)
		comment := fmt.Sprintf("%s. The agent's final message (%s) is attached.", head, size(len(content)))
		if t.link != "" {
			comment += " " + t.link
		}
		t.upload(seq, resultKey, File{Name: fmt.Sprintf("turn-%d-message.md", d.Turn), Title: "Agent's message, turn " + strconv.FormatInt(d.Turn, 10), Content: content}, comment, silent)
	case t.outTotal == 0 || out == "":
		t.post(resultKey, seq, Message{Text: head + ", with no output.", Link: link}, silent)
	case t.outTotal <= t.inline:
		t.post(resultKey, seq, Message{Text: head + ":", Code: out, Link: link}, silent)
	default:
		content := append([]byte(nil), t.out...)
		comment := fmt.Sprintf("%s. The output (%s) is attached.", head, size(t.outTotal))
		if t.outTotal > len(t.out) {
			comment = fmt.Sprintf("%s. The first %s of its %s of output are attached; the session has all of it.", head, size(len(t.out)), size(t.outTotal))
		}
		if t.link != "" {
			comment += " " + t.link
		}
		name := fmt.Sprintf("turn-%d-output.txt", d.Turn)
		t.upload(seq, resultKey, File{Name: name, Title: "Output of turn " + strconv.FormatInt(d.Turn, 10), Content: content}, comment, silent)
	}
	t.turn, t.turnStart, t.out, t.tail, t.outTotal = 0, 0, nil, nil, 0
	t.final, t.plan, t.agentish, t.titles = "", "", false, nil
}

// maxMessageText is the longest agent message posted as a message; a
// longer one is attached as a file (Telegram's limit is 4,096 characters).
const maxMessageText = 3500

// upload pushes the job that attaches file to the thread as key, once.
func (t *thread) upload(seq session.Seq, key string, file File, comment string, silent bool) {
	t.mu.Lock()
	_, posted := t.refs[key]
	t.mu.Unlock()
	if posted || silent {
		return
	}
	t.q.push(&job{first: seq, last: seq, what: "upload " + key, run: func(ctx context.Context) error {
		if err := t.ch.Upload(ctx, t.th, file, comment); err != nil {
			return err
		}
		t.mu.Lock()
		t.remember(key, "uploaded")
		t.mu.Unlock()
		return nil
	}})
}

// tool notes a tool call's title and status in the status message's tail.
func (t *thread) tool(id, title, status string) {
	if t.titles == nil {
		t.titles = make(map[string]string)
	}
	if title != "" && len(t.titles) < 1000 {
		t.titles[id] = title
	} else if title = t.titles[id]; title == "" {
		title = id
	}
	if status == "" {
		return // a content-only update: nothing new to say
	}
	mark := map[string]string{"pending": "…", "in_progress": "⏳", "completed": "✓", "failed": "✗"}[status]
	if mark == "" {
		mark = "•"
	}
	line := mark + " " + strings.ReplaceAll(title, "\n", " ") + "\n"
	t.tail = append(t.tail, line...)
	if len(t.tail) > 2*tailBytes {
		t.tail = append(t.tail[:0], t.tail[len(t.tail)-tailBytes:]...)
	}
}

// resume shows the running turn's status again after a silent replay: the
// driver that took over does not know how far its predecessor got.
func (t *thread) resume(seq session.Seq) {
	if t.turn != 0 {
		t.show(t.statusKey(), seq, t.status(), false)
	}
}

// agentText picks what a person would read from a harness object: a
// string "text", "result" or "message", or the text parts of an
// assistant message's content (Claude's stream-json).
func agentText(data json.RawMessage) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return ""
	}
	for _, k := range []string{"text", "result", "message", "content"} {
		var s string
		if json.Unmarshal(obj[k], &s) == nil && s != "" {
			return s + "\n"
		}
	}
	var msg struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(obj["message"], &msg) == nil {
		var b strings.Builder
		for _, c := range msg.Content {
			if c.Type == "text" && c.Text != "" {
				b.WriteString(c.Text)
				b.WriteByte('\n')
			}
		}
		return b.String()
	}
	return ""
}

func orNothing(s, alt string) string {
	if strings.TrimSpace(s) == "" {
		return alt
	}
	return s
}

// lastBytes returns about the last n bytes of b, cut at a line start (or a
// rune start) when it had to cut.
func lastBytes(b []byte, n int) string {
	if len(b) <= n {
		return strings.TrimRight(string(b), "\n")
	}
	b = b[len(b)-n:]
	if i := strings.IndexByte(string(b), '\n'); i >= 0 && i < n/2 {
		b = b[i+1:]
	}
	for len(b) > 0 && !utf8.RuneStart(b[0]) {
		b = b[1:]
	}
	return "…\n" + strings.TrimRight(string(b), "\n")
}

// truncateUTF8 returns at most n bytes of s, not cutting a rune.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func size(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
