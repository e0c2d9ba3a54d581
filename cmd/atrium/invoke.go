package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
	wire "github.com/atriumhq/atrium/session/api"
)

// invokeQueuedNotice is how long `atrium invoke` waits for its turn to
// start before it says the prompt is queued.
const invokeQueuedNotice = time.Second

// Exit statuses of `atrium invoke` for turns that did not run to an exit
// code of their own.
const (
	exitCancelled = 130 // as a shell reports SIGINT
	exitTimeout   = 124 // as timeout(1) does
)

func newInvokeCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "invoke ID TEXT",
		Short: "Run a prompt in a session and exit with its exit code",
		Long: `Prompt a session and stream that prompt's turn: the harness's stdout to stdout,
its stderr to stderr. The command exits with the turn's exit code: 0 when it
finished ok, the harness's exit code when it failed, 130 when it was cancelled
and 124 when it timed out. TEXT "-" reads the prompt from stdin.

Unlike 'atrium send --wait', the turn belongs to this command: Ctrl-C (or
losing the connection) cancels it, even while it still waits in the queue.
The server caps how many invokes run at once per session and per tenant, and
may limit turns per hour; over a limit the command fails at once and says
when to retry.

With --json, print the invoke's events as JSON lines, {"event":NAME,"data":{…}}:
start {invoke_id,session,seq,turn}, stdout/stderr {text}, agent {…},
approval_requested {…}, error {code,message}, exit {exit_code,status,duration_ms},
and in an agent session agent_message, tool_call, tool_call_update and plan
with their events' data.

In an agent session the command prints the agent's final message of the turn
to stdout, and its earlier messages, tool calls and plans to stderr.`,
		Example: `  atrium invoke ID 'make test' && echo passed
  atrium invoke ID 'uname -a' > out.txt
  git diff | atrium invoke ID -
  atrium invoke ID 'ls' --json | jq -c 'select(.event=="exit")'`,
		Args: exactArgs("ID", "TEXT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := readPrompt(cmd, env, args[1])
			if err != nil {
				return err
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			return explain(invoke(cmd.Context(), env, c, session.ID(args[0]), text, asJSON), conn.server)
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the invoke's events as JSON lines")
	return cmd
}

// invoke posts the invoke and prints its stream until exit; its error
// carries the exit status.
func invoke(ctx context.Context, env *cliEnv, c *client.Client, id session.ID, text string, asJSON bool) error {
	if err := id.Validate(); err != nil {
		return cliError{err: err, msg: fmt.Sprintf("%q is not a session id", id), hint: "list the sessions you can see with 'atrium ls'"}
	}
	body, _ := json.Marshal(map[string]string{"text": text, "client_id": client.NewClientID()})
	path := "/v1/sessions/" + url.PathEscape(string(id)) + "/invoke"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Server+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build invoke request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	tok := c.Token
	if c.Tokens != nil {
		if tok, err = c.Tokens.Token(ctx); err != nil {
			return fmt.Errorf("get bearer token: %w", err)
		}
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if interrupted(ctx) {
			return exitError{code: exitCancelled, msg: "interrupted before the prompt was sent"}
		}
		return fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := responseError(resp)
		if err.Code == session.CodeTooManyRequests {
			return cliError{err: err, msg: err.Message, hint: "an invoke cap or a tenant quota of the server (docs/automation.md#invoke): wait, or cancel another invoke"}
		}
		return err
	}

	started := make(chan struct{})
	notice := time.AfterFunc(invokeQueuedNotice, func() {
		select {
		case <-started:
		default:
			fmt.Fprintf(env.stderr, "queued behind the session's other turns; waiting… (Ctrl-C cancels it)\n")
		}
	})
	defer notice.Stop()
	safe := *env
	safe.stdout, safe.stderr = safeOutput(env.stdout), safeOutput(env.stderr)
	p := invokePrinter{env: &safe, id: id, asJSON: asJSON, started: started}
	err = readSSE(resp.Body, p.event)
	if p.exit != nil {
		return p.result()
	}
	if interrupted(ctx) {
		return exitError{code: exitCancelled, msg: "interrupted: the invoke's turn was cancelled"}
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return cliError{err: err, msg: "the invoke's stream ended before its turn finished: " + err.Error(),
		hint: "the turn was cancelled; check the server's logs, then run it again"}
}

// responseError decodes a refused invoke's error body.
func responseError(resp *http.Response) *session.Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb session.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		return eb.Error
	}
	return &session.Error{Code: session.CodeInternal, Message: "server answered " + resp.Status}
}

// readSSE calls fn with each event of an SSE stream until it ends, fn
// fails or fn returns done.
func readSSE(r io.Reader, fn func(name string, data []byte) (done bool, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), session.MaxFrameBytes*2)
	var (
		name string
		data []byte
	)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if name != "" {
				done, err := fn(name, data)
				if err != nil || done {
					return err
				}
			}
			name, data = "", nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")...)
		}
	}
	return sc.Err()
}

// invokePrinter shows the events of one invoke.
type invokePrinter struct {
	env     *cliEnv
	id      session.ID
	asJSON  bool
	started chan struct{}    // closed at the start event
	exit    *wire.InvokeExit // set by the exit event
	reason  string           // the message of the last error event
	// message is the agent's latest message of the turn, printed to
	// stdout at exit as the turn's answer; earlier ones go to stderr.
	message *string
	agent   agentStream // renders tool calls and plans on stderr
}

func (p *invokePrinter) event(name string, data []byte) (bool, error) {
	if name == "start" {
		close(p.started)
	}
	if name == "error" {
		var d session.ErrorData
		if json.Unmarshal(data, &d) == nil {
			p.reason = cmp.Or(d.Message, string(d.Code))
		}
	}
	if name == "exit" {
		var x wire.InvokeExit
		if err := json.Unmarshal(data, &x); err != nil {
			return true, fmt.Errorf("decode exit event: %w", err)
		}
		p.exit = &x
	}
	if p.asJSON {
		line, err := json.Marshal(struct {
			Event string          `json:"event"`
			Data  json.RawMessage `json:"data"`
		}{name, data})
		if err != nil {
			return true, fmt.Errorf("event %s: %w", name, err)
		}
		if _, err := p.env.stdout.Write(append(line, '\n')); err != nil {
			return true, err
		}
		return name == "exit", nil
	}
	var d struct {
		Text    string       `json:"text"`
		ID      string       `json:"id"`
		Summary string       `json:"summary"`
		Code    session.Code `json:"code"`
		Message string       `json:"message"`
	}
	_ = json.Unmarshal(data, &d)
	var err error
	switch name {
	case "stdout":
		_, err = io.WriteString(p.env.stdout, d.Text)
	case "stderr":
		_, err = io.WriteString(p.env.stderr, d.Text)
	case "agent":
		_, err = fmt.Fprintln(p.env.stdout, agentSummary(data))
	case string(session.KindAgentMessage):
		if p.message != nil {
			_, err = fmt.Fprintf(p.env.stderr, "agent> %s\n", indent(agentSafe(*p.message), "       "))
		}
		text := d.Text
		p.message = &text
	case string(session.KindToolCall), string(session.KindToolCallUpdate), string(session.KindPlan):
		p.agent.agentEvent(p.env.stderr, session.Event{Kind: session.Kind(name), Data: data})
	case "exit":
		if p.message != nil {
			text := agentSafe(*p.message)
			if !strings.HasSuffix(text, "\n") {
				text += "\n"
			}
			_, err = io.WriteString(p.env.stdout, text)
		}
	case "approval_requested":
		_, err = fmt.Fprintf(p.env.stderr, "approval needed (%s): %s\n  answer with: atrium approve %s %s   (or add --deny)\n", d.ID, d.Summary, p.id, d.ID)
	case "error":
		_, err = fmt.Fprintf(p.env.stderr, "error: %s: %s\n", d.Code, d.Message)
	}
	return name == "exit", err
}

// result is the command's outcome for the turn's exit.
func (p *invokePrinter) result() error {
	x := p.exit
	switch x.Status {
	case session.TurnOK:
		return nil
	case session.TurnCancelled:
		return exitError{code: exitCancelled, msg: "the turn was cancelled"}
	case session.TurnTimeout:
		return exitError{code: exitTimeout, msg: "the turn timed out (the server's turn_timeout)"}
	}
	if x.ExitCode > 0 && x.ExitCode < 256 && p.reason == "" {
		return exitError{code: x.ExitCode} // the harness said why on stderr.
	}
	msg := fmt.Sprintf("the turn %s (exit code %d)", x.Status, x.ExitCode)
	if p.reason != "" {
		msg += ": " + safeText(p.reason)
	}
	code := 1
	if x.ExitCode > 0 && x.ExitCode < 256 {
		code = x.ExitCode
	}
	return exitError{code: code, msg: msg}
}
