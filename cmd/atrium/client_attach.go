package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// attachSendTimeout bounds sending one line typed in attach.
const attachSendTimeout = 30 * time.Second

func newAttachCmd(env *cliEnv) *cobra.Command {
	var (
		conn    connFlags
		history int64
	)
	cmd := &cobra.Command{
		Use:   "attach ID",
		Short: "Watch a session live and prompt it from the terminal",
		Long: `Attach to a session: print its recent events, then every new event as it
happens, and who else is watching. An agent's text is printed as it writes
it (after "agent>"); its tool calls show their title, status and diff stat.
Each line you type is sent as a prompt (you need the driver or owner role);
the server's acknowledgement is shown.

Commands you can type:
  /cancel        stop the running turn
  /approve ID    allow a pending approval
  /deny ID       deny a pending approval
  /help          list these commands
  /quit          detach (so do Ctrl-D and Ctrl-C)

If the connection drops, attach reconnects by itself and resumes exactly where
it was; nothing is missed or shown twice. Detaching leaves the session and its
running turn alone. A turn that fails shows why (its last error); attach then
exits with status 1 if the last turn that finished while it watched failed.`,
		Example: `  atrium attach s_3kq7xq4m2fdh2dnbw5ad
  atrium attach ID --history 0     # only new events
  atrium attach ID --history -1    # the whole history first`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			return explain(attach(cmd.Context(), env, c, session.ID(args[0]), history), conn.server)
		},
	}
	conn.register(cmd)
	cmd.Flags().Int64Var(&history, "history", 20, "how many past events to show first (-1: all)")
	return cmd
}

func attach(ctx context.Context, env *cliEnv, c *client.Client, id session.ID, history int64) error {
	s, err := c.GetSession(ctx, id)
	if err != nil {
		if interrupted(ctx) {
			return nil
		}
		return err
	}
	after := session.Seq(0)
	if history >= 0 {
		after = max(0, s.LastSeq-history)
	}
	st, err := c.Watch(ctx, id, after, client.WatchOptions{Deltas: true})
	if err != nil {
		if interrupted(ctx) {
			return nil
		}
		return err
	}
	defer st.Close()

	// Lines typed. The reader goroutine ends at EOF; a terminal read
	// cannot be interrupted, so when attach returns first the goroutine is
	// left blocked in Read until the process exits.
	lines := make(chan string)
	quit := make(chan struct{})
	defer close(quit)
	if env.stdin != nil {
		go readLines(env.stdin, lines, quit)
	} else {
		close(lines)
	}

	v := attachView{env: env, id: id, now: time.Now(), pending: map[string]bool{}}
	var linger <-chan time.Time // set at EOF while prompts await their answer
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-linger:
			if len(v.pending) == 0 {
				fmt.Fprintf(env.stderr, "detached before the history arrived: see it with 'atrium logs %s'\n", id)
				return v.result
			}
			fmt.Fprintf(env.stderr, "detached; %d prompt(s) got no answer yet: check with 'atrium logs %s'\n", len(v.pending), id)
			return v.result
		case f, ok := <-st.Frames():
			if !ok {
				if interrupted(ctx) {
					return nil
				}
				return st.Err()
			}
			v.frame(f)
			if linger != nil && len(v.pending) == 0 && v.caughtUp(after) {
				fmt.Fprintln(env.stderr, "detached")
				return v.result
			}
		case line, ok := <-lines:
			if !ok {
				// EOF: piped prompts still deserve their ack or error,
				// and the history asked for is shown first.
				if len(v.pending) == 0 && v.caughtUp(after) {
					fmt.Fprintln(env.stderr, "detached")
					return v.result
				}
				lines = nil
				linger = time.After(attachSendTimeout)
				continue
			}
			if done := v.input(ctx, st, line); done {
				fmt.Fprintln(env.stderr, "detached")
				return v.result
			}
		}
	}
}

func readLines(r io.Reader, lines chan<- string, quit <-chan struct{}) {
	defer close(lines)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), session.MaxTextBytes)
	for sc.Scan() {
		select {
		case lines <- sc.Text():
		case <-quit:
			return
		}
	}
}

// attachView renders a stream for a person at a terminal: events on
// stdout, notices on stderr.
type attachView struct {
	env      *cliEnv
	out      io.Writer   // env.stdout, showing control characters as escapes (termsafe.go)
	live     session.Seq // events after it happened while attached
	seen     session.Seq // the last event shown
	reason   string      // the message of the last error event since a turn finished
	result   error       // the last finished turn's turnResult: attach's exit
	id       session.ID
	now      time.Time
	notices  notices
	attached bool
	watching []string        // users watching, sorted, deduplicated
	pending  map[string]bool // client_ids of prompts sent and not yet acked or refused
	agent    agentStream     // agent text streaming in (render.go)
}

func (v *attachView) frame(f client.Frame) {
	if v.out == nil {
		v.out = safeOutput(v.env.stdout)
	}
	out, errw := v.out, safeOutput(v.env.stderr)
	switch {
	case f.Reconnect != nil:
		v.notices.w = errw
		v.notices.reconnecting(f)
	case f.Hello != nil:
		v.notices.w = errw
		if v.notices.hello(f) || v.attached {
			return
		}
		v.attached = true
		h := f.Hello
		v.live = h.LastSeq
		title := ""
		if h.Session.Title != "" {
			title = fmt.Sprintf(" %q", h.Session.Title)
		}
		fmt.Fprintf(errw, "attached to %s%s as %s (%s); last seq %d\n", h.Session.ID, title, h.You.User, h.You.Role, h.LastSeq)
		if h.You.Role.AtLeast(session.RoleDriver) {
			fmt.Fprintln(errw, "type a prompt and press Enter; /help lists commands; Ctrl-D detaches")
		} else {
			fmt.Fprintln(errw, "you are a viewer: you can watch but not prompt; Ctrl-D detaches")
		}
	case f.Presence != nil:
		v.presence(f.Presence.Watchers)
	case f.Ack != nil:
		delete(v.pending, f.Ack.ClientID)
		fmt.Fprintf(errw, "✓ prompt queued as seq %d\n", f.Ack.Seq)
	case f.Error != nil:
		delete(v.pending, f.Error.ClientID)
		msg := f.Error.Message
		if msg == "" {
			msg = string(f.Error.Code)
		}
		fmt.Fprintf(errw, "error: %s\n", msg)
		if f.Error.Code == session.CodeForbidden {
			fmt.Fprintf(errw, "  hint: ask the owner for the driver role: atrium share %s YOU --role driver\n", v.id)
		}
	case f.Event != nil:
		v.seen = max(v.seen, f.Event.Seq)
		v.event(out, errw, *f.Event)
	case f.Delta != nil:
		v.agent.delta(out, *f.Delta)
	}
}

func (v *attachView) event(out, errw io.Writer, ev session.Event) {
	if v.agent.agentEvent(out, ev) { // the agent kinds (render.go)
		return
	}
	v.agent.end(out)
	switch ev.Kind {
	case session.KindMessage:
		var d session.MessageData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(out, "[%d] %s> %s\n", ev.Seq, ev.By, d.Text)
	case session.KindTurnStarted:
		var d session.TurnStartedData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(out, "-- turn %d started (prompt seq %d)\n", d.Turn, d.PromptSeq)
	case session.KindOutput:
		var d session.OutputData
		_ = json.Unmarshal(ev.Data, &d)
		w := out
		if d.Stream == "stderr" {
			w = errw
		}
		io.WriteString(w, d.Text)
		if !strings.HasSuffix(d.Text, "\n") {
			io.WriteString(w, "\n")
		}
	case session.KindTurnFinished:
		res := turnResult(ev, v.reason)
		if ev.Seq > v.live {
			v.result = res
		}
		line := summary(ev)
		if res != nil && v.reason != "" {
			line += ": " + oneLine(v.reason, 500)
		}
		v.reason = ""
		fmt.Fprintf(out, "-- %s\n", line)
	case session.KindError:
		v.reason = errorMessage(ev)
		fmt.Fprintf(out, "-- %s %s: %s\n", ev.Kind, ev.By, summary(ev))
	case session.KindApprovalRequested:
		var d session.ApprovalRequestedData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(out, "?? approval %s requested: %s\n   answer with /approve %s or /deny %s\n", d.ID, d.Summary, d.ID, d.ID)
	case session.KindApprovalResolved:
		var d session.ApprovalResolvedData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(out, "-- approval %s %s by %s\n", d.ID, allowWord(d.Allow), ev.By)
	default:
		fmt.Fprintf(out, "-- %s %s: %s\n", ev.Kind, ev.By, summary(ev))
	}
}

// caughtUp reports whether the hello has come and the history from after
// to the session's end at attach time has been shown.
func (v *attachView) caughtUp(after session.Seq) bool {
	return v.attached && (v.seen >= v.live || v.live <= after)
}

// presence prints who joined and left, then who is watching now.
func (v *attachView) presence(ws []session.Watcher) {
	var users []string
	for _, w := range ws {
		users = append(users, w.User)
	}
	slices.Sort(users)
	users = slices.Compact(users)
	if slices.Equal(users, v.watching) {
		return
	}
	if v.watching != nil {
		for _, u := range users {
			if !slices.Contains(v.watching, u) {
				fmt.Fprintf(v.env.stderr, "%s joined\n", u)
			}
		}
		for _, u := range v.watching {
			if !slices.Contains(users, u) {
				fmt.Fprintf(v.env.stderr, "%s left\n", u)
			}
		}
	}
	if users == nil {
		users = []string{}
	}
	v.watching = users
	fmt.Fprintf(v.env.stderr, "watching: %s\n", strings.Join(users, ", "))
}

// input handles one typed line; it reports whether to detach.
func (v *attachView) input(ctx context.Context, st *client.Stream, line string) (detach bool) {
	errw := v.env.stderr
	text := strings.TrimSpace(line)
	if text == "" {
		return false
	}
	sctx, cancel := context.WithTimeout(ctx, attachSendTimeout)
	defer cancel()
	var err error
	if strings.HasPrefix(line, "/") {
		cmd, arg, _ := strings.Cut(text, " ")
		arg = strings.TrimSpace(arg)
		switch cmd {
		case "/quit", "/exit", "/detach":
			return true
		case "/help":
			fmt.Fprintln(errw, "/cancel  /approve ID  /deny ID  /quit; any other line is sent as a prompt")
			return false
		case "/cancel":
			err = st.Cancel(sctx)
		case "/approve", "/deny":
			if arg == "" {
				fmt.Fprintf(errw, "usage: %s APPROVAL_ID\n", cmd)
				return false
			}
			err = st.Approve(sctx, arg, cmd == "/approve")
		default:
			fmt.Fprintf(errw, "unknown command %s; /help lists commands (start a prompt with a space to send a leading /)\n", cmd)
			return false
		}
	} else {
		cid := client.NewClientID()
		if err = st.Prompt(sctx, text, cid); err == nil {
			v.pending[cid] = true
		}
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(errw, "not sent: %v\n", explain(err, ""))
	}
	return false
}
