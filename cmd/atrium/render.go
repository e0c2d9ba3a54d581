package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// How `atrium logs` and `atrium attach` show the agent event kinds (DESIGN
// §7 "Agent events") to a person: the agent's message as its text, a tool
// call as its title and status with the diff stat of its edits, a plan as a
// checklist, usage as numbers. Everything an agent supplies is made safe for
// a terminal first (agentSafe): escape sequences cannot move the cursor,
// recolour or retitle the terminal.

// cliKinds says how the CLI shows each event kind; a kind missing here is
// a kind the CLI does not render (kinds_test.go checks every kind of the
// session package is listed).
var cliKinds = map[session.Kind]string{
	session.KindSessionCreated:    "title",
	session.KindMessage:           "prompt text",
	session.KindTurnStarted:       "turn and prompt seq",
	session.KindOutput:            "output text as written",
	session.KindAgent:             "harness object: type and text",
	session.KindApprovalRequested: "summary and the agent's options",
	session.KindApprovalResolved:  "answer and option",
	session.KindTurnFinished:      "status, exit code, duration",
	session.KindSandbox:           "state and detail",
	session.KindMemberChanged:     "user and role",
	session.KindPROpened:          "URL and branch",
	session.KindError:             "code and message",
	session.KindAgentMessage:      "message text",
	session.KindAgentThought:      "first line of the thought",
	session.KindToolCall:          "title, kind, status, diff stat",
	session.KindToolCallUpdate:    "status, title, diff stat",
	session.KindPlan:              "checklist",
	session.KindUsage:             "tokens and cost",
	session.KindFilesChanged:      "paths",
}

// agentSafe makes agent-supplied text safe to print on a terminal: control
// characters other than newline and tab become their visible symbols (ESC
// is shown as ␛), and a carriage return too, so nothing can rewrite a line.
func agentSafe(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range s {
		switch {
		case r == 0x7f:
			b.WriteRune('␡')
		case r < 0x20 && r != '\n' && r != '\t':
			b.WriteRune(0x2400 + r)
		case r >= 0x80 && r < 0xa0: // C1 controls (CSI is 0x9b)
			b.WriteRune('�')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isControl(r rune) bool {
	return (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r < 0xa0)
}

// indent puts pad before every line of s after the first.
func indent(s, pad string) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+pad)
}

// flat puts multi-line text on one line, marking the line breaks.
func flat(s string) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", " ⏎ ")
}

// agentKindSummary returns how an event of an agent kind (or an agent's
// approval) reads in one line of `logs`, and whether ev is of such a kind.
// Unlike other summaries, a message is shown whole.
func agentKindSummary(ev session.Event) (string, bool) {
	switch ev.Kind {
	case session.KindAgentMessage:
		var d session.AgentMessageData
		if json.Unmarshal(ev.Data, &d) != nil {
			return "", false
		}
		return flat(agentSafe(d.Text)), true
	case session.KindAgentThought:
		var d session.AgentThoughtData
		if json.Unmarshal(ev.Data, &d) != nil {
			return "", false
		}
		return "thinking: " + flat(agentSafe(d.Text)), true
	case session.KindToolCall:
		var d session.ToolCallData
		if json.Unmarshal(ev.Data, &d) != nil {
			return "", false
		}
		return toolLine(d.Kind, d.Title, d.Status, d.Content, d.Locations), true
	case session.KindToolCallUpdate:
		var d session.ToolCallUpdateData
		if json.Unmarshal(ev.Data, &d) != nil {
			return "", false
		}
		s := agentSafe(d.ID)
		if d.Title != "" {
			s += " " + oneLine(agentSafe(d.Title), 200)
		}
		if d.Status != "" {
			s += " → " + agentSafe(d.Status)
		}
		if st := contentStat(d.Content); st != "" {
			s += " · " + st
		}
		return s, true
	case session.KindPlan:
		var d session.PlanData
		if json.Unmarshal(ev.Data, &d) != nil {
			return "", false
		}
		return flat(planText(d, "")), true
	case session.KindUsage:
		var d session.UsageData
		if json.Unmarshal(ev.Data, &d) != nil {
			return "", false
		}
		return usageLine(d), true
	case session.KindFilesChanged:
		var d session.FilesChangedData
		if json.Unmarshal(ev.Data, &d) != nil {
			return "", false
		}
		paths := make([]string, 0, len(d.Paths))
		for i, p := range d.Paths {
			if i == 8 {
				paths = append(paths, fmt.Sprintf("and %d more", len(d.Paths)-8))
				break
			}
			paths = append(paths, agentSafe(p))
		}
		return fmt.Sprintf("%d file(s) changed by %s: %s", len(d.Paths), agentSafe(d.By), strings.Join(paths, ", ")), true
	case session.KindApprovalRequested:
		var d session.ApprovalRequestedData
		if json.Unmarshal(ev.Data, &d) != nil || len(d.Options) == 0 {
			return "", false // a harness's approval: the usual summary
		}
		what := d.Title
		if what == "" {
			what = d.Summary
		}
		s := fmt.Sprintf("turn %d asks %s: %s; options: %s", d.Turn, agentSafe(d.ID), oneLine(agentSafe(what), 200), approvalOptions(d.Options))
		if st := contentStat(d.Content); st != "" {
			s += " · " + st
		}
		return s, true
	case session.KindApprovalResolved:
		var d session.ApprovalResolvedData
		if json.Unmarshal(ev.Data, &d) != nil || d.OptionID == "" {
			return "", false
		}
		return fmt.Sprintf("turn %d: %s %s with option %s", d.Turn, agentSafe(d.ID), allowWord(d.Allow), agentSafe(d.OptionID)), true
	}
	return "", false
}

// toolLine is a tool call in one line: "[edit] Edit a.go (completed) · a.go +3 −1".
func toolLine(kind, title, status string, content []session.ToolCallContent, locs []session.ToolLocation) string {
	if kind == "" {
		kind = "tool"
	}
	s := fmt.Sprintf("[%s] %s", agentSafe(kind), oneLine(agentSafe(title), 200))
	if status != "" {
		s += " (" + agentSafe(status) + ")"
	}
	if st := contentStat(content); st != "" {
		s += " · " + st
	} else if len(locs) > 0 && locs[0].Path != "" {
		s += " · " + agentSafe(locs[0].Path)
		if locs[0].Line != nil {
			s += fmt.Sprintf(":%d", *locs[0].Line)
		}
	}
	return s
}

// contentStat describes the diffs of a tool call's content ("a.go +3 −1,
// b.go new +10") and how much other output it has.
func contentStat(content []session.ToolCallContent) string {
	var parts []string
	outLines := 0
	for _, c := range content {
		switch c.Type {
		case "diff":
			oldLines := splitLines(c.OldText)
			newText := c.NewText
			added, removed := diffStat(oldLines, splitLines(&newText))
			p := agentSafe(c.Path)
			if c.OldText == nil {
				p += " new"
			}
			parts = append(parts, fmt.Sprintf("%s +%d −%d", p, added, removed))
		case "content":
			var blk struct {
				Text string `json:"text"`
			}
			if json.Unmarshal(c.Content, &blk) == nil && blk.Text != "" {
				outLines += len(splitLines(&blk.Text))
			}
		case "terminal":
			parts = append(parts, "terminal "+agentSafe(c.TerminalID))
		}
	}
	if outLines > 0 {
		parts = append(parts, fmt.Sprintf("%d line(s) of output", outLines))
	}
	return strings.Join(parts, ", ")
}

// toolOutputTail returns the last n lines of a tool call's text output.
func toolOutputTail(content []session.ToolCallContent, n int) string {
	var all []string
	for _, c := range content {
		if c.Type != "content" {
			continue
		}
		var blk struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(c.Content, &blk) == nil && blk.Text != "" {
			all = append(all, splitLines(&blk.Text)...)
		}
	}
	if len(all) > n {
		all = append([]string{fmt.Sprintf("… %d earlier line(s)", len(all)-n)}, all[len(all)-n:]...)
	}
	return agentSafe(strings.Join(all, "\n"))
}

func splitLines(s *string) []string {
	if s == nil || *s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(*s, "\n"), "\n")
}

// maxDiffEdits bounds the work of diffStat; beyond it the stat counts lines
// present in one text and not the other.
const maxDiffEdits = 2000

// diffStat returns the lines added and removed from a to b: the length of
// the shortest edit script (Myers), bounded by maxDiffEdits.
func diffStat(a, b []string) (added, removed int) {
	n, m := len(a), len(b)
	bound := min(n+m, maxDiffEdits)
	v := make([]int, 2*bound+3)
	off := bound + 1
	for d := 0; d <= bound; d++ {
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				// d edits; the common lines are (n+m-d)/2.
				common := (n + m - d) / 2
				return m - common, n - common
			}
		}
	}
	// Too different to diff cheaply: count lines by content.
	count := map[string]int{}
	for _, l := range a {
		count[l]++
	}
	common := 0
	for _, l := range b {
		if count[l] > 0 {
			count[l]--
			common++
		}
	}
	return m - common, n - common
}

func planText(d session.PlanData, pad string) string {
	done := 0
	for _, e := range d.Entries {
		if e.Status == "completed" {
			done++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "plan, %d of %d done", done, len(d.Entries))
	for _, e := range d.Entries {
		mark := "[ ]"
		switch e.Status {
		case "completed":
			mark = "[x]"
		case "in_progress":
			mark = "[~]"
		}
		b.WriteString("\n" + pad + mark + " " + oneLine(agentSafe(e.Content), 200))
	}
	return b.String()
}

func usageLine(d session.UsageData) string {
	s := fmt.Sprintf("%d in, %d out", d.InputTokens, d.OutputTokens)
	if d.CachedTokens > 0 {
		s += fmt.Sprintf(", %d cached", d.CachedTokens)
	}
	if d.CostUSD > 0 {
		s += fmt.Sprintf(", $%.4f", d.CostUSD)
	}
	if d.Model != "" {
		s = agentSafe(d.Model) + ": " + s
	}
	return s
}

// approvalOptions lists an agent approval's options for a person:
// "allow-1 (Allow once), reject (Reject)".
func approvalOptions(opts []session.ApprovalOption) string {
	parts := make([]string, 0, len(opts))
	for _, o := range opts {
		parts = append(parts, fmt.Sprintf("%s (%s)", agentSafe(o.ID), oneLine(agentSafe(o.Name), 80)))
	}
	return strings.Join(parts, ", ")
}

// agentStream is what attach remembers of agent text streaming in: the
// message whose deltas are being printed and what they said, so the
// durable message that follows is not printed twice.
type agentStream struct {
	id       string            // the message being printed, "" if none
	nl       bool              // the last delta printed ended a line
	streamed map[string]string // what the deltas of each message said, until its agent_message
}

// maxStreamed bounds the messages whose streamed text attach remembers.
const maxStreamed = 64

// agentEvent prints an event of an agent kind the way attach shows it, and
// reports whether ev was one.
func (a *agentStream) agentEvent(out io.Writer, ev session.Event) bool {
	switch ev.Kind {
	case session.KindAgentMessage:
		var d session.AgentMessageData
		if json.Unmarshal(ev.Data, &d) != nil {
			return false
		}
		if a.id == d.MessageID {
			a.end(out)
		}
		text, seen := a.streamed[d.MessageID]
		delete(a.streamed, d.MessageID)
		if seen && text == d.Text {
			return true // its deltas showed it whole
		}
		// Not streamed, or deltas missed before attaching: shown whole.
		a.end(out)
		fmt.Fprintf(out, "agent> %s\n", indent(agentSafe(d.Text), "       "))
		return true
	case session.KindToolCall:
		var d session.ToolCallData
		if json.Unmarshal(ev.Data, &d) != nil {
			return false
		}
		a.end(out)
		fmt.Fprintf(out, "   ⚙ %s\n", toolLine(d.Kind, d.Title, d.Status, d.Content, d.Locations))
		return true
	case session.KindToolCallUpdate:
		var d session.ToolCallUpdateData
		if json.Unmarshal(ev.Data, &d) != nil {
			return false
		}
		a.end(out)
		s, _ := agentKindSummary(ev)
		fmt.Fprintf(out, "   ⚙ %s\n", s)
		if tail := toolOutputTail(d.Content, 5); tail != "" && (d.Status == "completed" || d.Status == "failed") {
			fmt.Fprintf(out, "     %s\n", indent(tail, "     "))
		}
		return true
	case session.KindPlan:
		var d session.PlanData
		if json.Unmarshal(ev.Data, &d) != nil {
			return false
		}
		a.end(out)
		fmt.Fprintf(out, "-- %s\n", planText(d, "   "))
		return true
	case session.KindApprovalRequested:
		var d session.ApprovalRequestedData
		if json.Unmarshal(ev.Data, &d) != nil || len(d.Options) == 0 {
			return false // a harness's approval: attach's usual lines
		}
		a.end(out)
		what := d.Title
		if what == "" {
			what = d.Summary
		}
		fmt.Fprintf(out, "?? approval %s requested: %s\n", agentSafe(d.ID), oneLine(agentSafe(what), 300))
		if st := contentStat(d.Content); st != "" {
			fmt.Fprintf(out, "   %s\n", st)
		}
		fmt.Fprintf(out, "   the agent offers: %s\n   answer with /approve %s or /deny %s (the web UI offers each option)\n",
			approvalOptions(d.Options), agentSafe(d.ID), agentSafe(d.ID))
		return true
	case session.KindAgentThought, session.KindUsage, session.KindFilesChanged:
		s, ok := agentKindSummary(ev)
		if !ok {
			return false
		}
		a.end(out)
		fmt.Fprintf(out, "-- %s\n", s)
		return true
	}
	return false
}

// delta prints streaming agent text as it arrives, after an "agent>"
// prefix; the agent_message that follows ends the line.
func (a *agentStream) delta(out io.Writer, d session.DeltaFrame) {
	if d.Text == "" {
		return
	}
	if a.streamed == nil {
		a.streamed = make(map[string]string)
	}
	if _, ok := a.streamed[d.MessageID]; !ok && len(a.streamed) >= maxStreamed {
		clear(a.streamed) // agent_messages that never came: forget them
	}
	if a.id != d.MessageID {
		a.end(out)
		a.id = d.MessageID
		fmt.Fprint(out, "agent> ")
	}
	a.streamed[d.MessageID] += d.Text
	t := agentSafe(d.Text)
	if a.nl {
		t = "       " + t
	}
	a.nl = strings.HasSuffix(t, "\n")
	fmt.Fprint(out, strings.ReplaceAll(strings.TrimSuffix(t, "\n"), "\n", "\n       "))
	if a.nl {
		fmt.Fprintln(out)
	}
}

// end finishes a streamed message's line before anything else is printed.
func (a *agentStream) end(out io.Writer) {
	if a.id == "" {
		return
	}
	if !a.nl {
		fmt.Fprintln(out)
	}
	a.id, a.nl = "", false
}
