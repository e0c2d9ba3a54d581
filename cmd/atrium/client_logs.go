package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// logsPageSize is how many events one history request asks for.
const logsPageSize = 500

func newLogsCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		after  int64
		follow bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a session's events",
		Long: `Print the events of a session, oldest first: one line per event with its seq,
time, who caused it, its kind and a summary. Output text is printed as the
harness wrote it; an agent's message is shown whole on its line, a tool call
as its title, status and diff stat, a plan as its checklist.

With --follow, keep printing new events as they happen until Ctrl-C; the
connection is resumed automatically if it drops, without losing or repeating
an event. With --json, print each event exactly as the server sent it, one
JSON object per line.`,
		Example: `  atrium logs s_3kq7xq4m2fdh2dnbw5ad
  atrium logs ID --follow
  atrium logs ID --after 120 --json | jq -r 'select(.kind=="output") | .data.text'`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			if after < 0 {
				return usageError(cmd, "--after must be 0 or more")
			}
			p := &eventPrinter{out: env.stdout, json: asJSON, now: time.Now()}
			id := session.ID(args[0])
			if follow {
				return explain(followLogs(cmd, env, c, id, after, p), conn.server)
			}
			return explain(printHistory(cmd, c, id, after, p), conn.server)
		},
	}
	conn.register(cmd)
	cmd.Flags().Int64Var(&after, "after", 0, "print only events with a seq greater than this")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events until Ctrl-C")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as the server's JSON, one per line")
	return cmd
}

func printHistory(cmd *cobra.Command, c *client.Client, id session.ID, after session.Seq, p *eventPrinter) error {
	ctx := cmd.Context()
	for {
		page, err := c.Events(ctx, id, after, logsPageSize)
		if err != nil {
			return err
		}
		for i, ev := range page.Events {
			if err := p.print(ev, page.Raw[i]); err != nil {
				return err
			}
			after = ev.Seq
		}
		if len(page.Events) == 0 || after >= page.LastSeq {
			return nil
		}
	}
}

func followLogs(cmd *cobra.Command, env *cliEnv, c *client.Client, id session.ID, after session.Seq, p *eventPrinter) error {
	ctx := cmd.Context()
	st, err := c.Watch(ctx, id, after, client.WatchOptions{})
	if err != nil {
		if interrupted(ctx) {
			return nil
		}
		return err
	}
	defer st.Close()
	n := notices{w: env.stderr}
	for f := range st.Frames() {
		switch {
		case f.Event != nil:
			if err := p.print(*f.Event, f.Raw); err != nil {
				return err
			}
		case f.Reconnect != nil:
			n.reconnecting(f)
		case f.Hello != nil:
			n.hello(f)
		}
	}
	if interrupted(ctx) {
		return nil
	}
	return st.Err()
}

// notices prints connection changes of a stream for people.
type notices struct {
	w            io.Writer
	hellos       int  // connections so far
	disconnected bool // a reconnecting notice was printed since the last hello
}

func (n *notices) reconnecting(f client.Frame) {
	if !n.disconnected {
		fmt.Fprintf(n.w, "connection lost (%v); reconnecting…\n", f.Reconnect.Err)
	} else {
		fmt.Fprintf(n.w, "still reconnecting (attempt %d, next in %s): %v\n", f.Reconnect.Attempt, f.Reconnect.Delay.Round(time.Millisecond), f.Reconnect.Err)
	}
	n.disconnected = true
}

// hello reports whether this hello resumed a lost connection (and says so).
func (n *notices) hello(f client.Frame) bool {
	n.hellos++
	n.disconnected = false
	if n.hellos == 1 {
		return false
	}
	fmt.Fprintf(n.w, "resumed at seq %d\n", f.After)
	return true
}

// eventPrinter writes events one per line.
type eventPrinter struct {
	out  io.Writer
	json bool
	now  time.Time
}

func (p *eventPrinter) print(ev session.Event, raw json.RawMessage) error {
	if p.json {
		b := append(bytes.TrimSpace(raw), '\n')
		_, err := p.out.Write(b)
		return err
	}
	// One line per event, whatever its text holds (termsafe.go).
	line := safeLine(fmt.Sprintf("%6d  %s  %-10s %-18s %s", ev.Seq, clock(ev.Time, p.now), ev.By, ev.Kind,
		strings.TrimSuffix(summary(ev), "\n"))) + "\n"
	_, err := io.WriteString(p.out, line)
	return err
}

// summary is a compact description of an event's data. Output text is
// returned as is.
func summary(ev session.Event) string {
	if s, ok := agentKindSummary(ev); ok { // the agent kinds (render.go)
		return s
	}
	switch ev.Kind {
	case session.KindSessionCreated:
		var d session.SessionCreatedData
		if json.Unmarshal(ev.Data, &d) == nil {
			return fmt.Sprintf("title %q", d.Title)
		}
	case session.KindMessage:
		var d session.MessageData
		if json.Unmarshal(ev.Data, &d) == nil {
			return oneLine(d.Text, 200)
		}
	case session.KindTurnStarted:
		var d session.TurnStartedData
		if json.Unmarshal(ev.Data, &d) == nil {
			return fmt.Sprintf("turn %d (prompt seq %d)", d.Turn, d.PromptSeq)
		}
	case session.KindOutput:
		var d session.OutputData
		if json.Unmarshal(ev.Data, &d) == nil {
			if d.Stream == "stderr" {
				return "stderr: " + d.Text
			}
			return d.Text
		}
	case session.KindAgent:
		return agentSummary(ev.Data)
	case session.KindApprovalRequested:
		var d session.ApprovalRequestedData
		if json.Unmarshal(ev.Data, &d) == nil {
			return fmt.Sprintf("turn %d asks %s: %s", d.Turn, d.ID, oneLine(d.Summary, 200))
		}
	case session.KindApprovalResolved:
		var d session.ApprovalResolvedData
		if json.Unmarshal(ev.Data, &d) == nil {
			return fmt.Sprintf("turn %d: %s %s", d.Turn, d.ID, allowWord(d.Allow))
		}
	case session.KindTurnFinished:
		var d session.TurnFinishedData
		if json.Unmarshal(ev.Data, &d) == nil {
			return fmt.Sprintf("turn %d %s (exit %d, %s)", d.Turn, d.Status, d.ExitCode, time.Duration(d.DurationMS)*time.Millisecond)
		}
	case session.KindSandbox:
		var d session.SandboxData
		if json.Unmarshal(ev.Data, &d) == nil {
			if d.Detail != "" {
				return string(d.State) + ": " + oneLine(d.Detail, 200)
			}
			return string(d.State)
		}
	case session.KindMemberChanged:
		var d session.MemberChangedData
		if json.Unmarshal(ev.Data, &d) == nil {
			if d.Role == session.RoleNone {
				return d.User + " removed"
			}
			return fmt.Sprintf("%s is now %s", d.User, d.Role)
		}
	case session.KindPROpened:
		var d session.PROpenedData
		if json.Unmarshal(ev.Data, &d) == nil {
			return fmt.Sprintf("%s (branch %s)", d.URL, d.Branch)
		}
	case session.KindError:
		var d session.ErrorData
		if json.Unmarshal(ev.Data, &d) == nil {
			return fmt.Sprintf("%s: %s", d.Code, d.Message)
		}
	}
	return oneLine(string(ev.Data), 200)
}

// agentSummary shows a harness's agent object whole, on one line: its type
// and its text when it has one (as `logs` shows an agent_message), else its
// type and the rest of its compact JSON. It is never cut: a person reading
// an agent's work needs all of it, and --json is there for scripts.
func agentSummary(data json.RawMessage) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return flat(agentSafe(string(data)))
	}
	var typ, text string
	_ = json.Unmarshal(obj["type"], &typ)
	typ = agentSafe(typ)
	for _, k := range []string{"text", "message", "content", "result"} {
		if json.Unmarshal(obj[k], &text) == nil && text != "" {
			return typ + ": " + flat(agentSafe(text))
		}
	}
	// Decoded and encoded again without HTML escaping: the server stores
	// "<" as \u003c, which a person should read as <.
	var rest map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if dec.Decode(&rest) != nil {
		return flat(agentSafe(string(data)))
	}
	delete(rest, "turn")
	if typ != "" {
		delete(rest, "type")
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(rest)
	compact := agentSafe(strings.TrimSpace(b.String()))
	if typ == "" {
		return compact
	}
	return typ + ": " + compact
}

func allowWord(allow bool) string {
	if allow {
		return "allowed"
	}
	return "denied"
}

// oneLine puts s on one line, shortened to about n bytes.
func oneLine(s string, n int) string {
	s = safeLine(strings.Join(strings.Fields(s), " "))
	if len(s) > n {
		cut := n
		for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
