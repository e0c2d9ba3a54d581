package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

func newSendCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		wait   bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "send ID TEXT",
		Short: "Prompt a session",
		Long: `Send a prompt to a session and print the seq of its message event once it is
durable. The prompt is queued: its turn runs after the turns queued before it.
TEXT "-" reads the prompt from stdin.

With --wait, follow the session until the turn of this prompt finishes,
printing its output as it streams (the harness's stdout to stdout, its stderr
to stderr; for a coding agent, its messages to stdout and its tool calls, plans
and approval requests to stderr). The exit status is 0 when the turn finished ok and 1 otherwise
(failed, cancelled or timed out; the message says which, with the exit code).
Ctrl-C stops waiting, not the turn. With --json, print {"seq":N}, or with
--wait the turn's events as JSON lines.`,
		Example: `  atrium send ID 'uname -a'
  atrium send ID 'make test' --wait && echo passed
  git diff | atrium send ID - --wait
  atrium send ID 'ls' --wait --json | jq -c .`,
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
			id := session.ID(args[0])
			seq, err := c.Send(cmd.Context(), id, text, client.NewClientID())
			if err != nil {
				return explain(err, conn.server)
			}
			if !wait {
				if asJSON {
					return json.NewEncoder(env.stdout).Encode(map[string]session.Seq{"seq": seq})
				}
				_, err := fmt.Fprintln(env.stdout, seq)
				return err
			}
			if !asJSON {
				fmt.Fprintf(env.stderr, "sent as seq %d; waiting for its turn…\n", seq)
			}
			return explain(waitTurn(cmd, env, c, id, seq, asJSON), conn.server)
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "follow the prompt's turn, print its output, exit 1 unless it finishes ok")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"seq":N}; with --wait, the turn's events as JSON lines`)
	return cmd
}

// waitTurn follows id from seq until the turn started for the prompt at seq
// finishes, printing the turn's output.
func waitTurn(cmd *cobra.Command, env *cliEnv, c *client.Client, id session.ID, seq session.Seq, asJSON bool) error {
	ctx := cmd.Context()
	safe := *env
	safe.stdout, safe.stderr = safeOutput(env.stdout), safeOutput(env.stderr)
	env = &safe
	st, err := c.Watch(ctx, id, seq, client.WatchOptions{})
	if err != nil {
		if interrupted(ctx) {
			return stillRunning(id, seq)
		}
		return err
	}
	defer st.Close()
	var turn int64    // 0 until the prompt's turn started
	var reason string // the message of the turn's last error event
	n := notices{w: env.stderr}
	for f := range st.Frames() {
		switch {
		case f.Reconnect != nil:
			n.reconnecting(f)
		case f.Hello != nil:
			n.hello(f)
		case f.Event != nil:
			ev := *f.Event
			var head session.TurnStartedData
			_ = json.Unmarshal(ev.Data, &head)
			if turn == 0 {
				if ev.Kind != session.KindTurnStarted || head.PromptSeq != seq {
					continue
				}
				turn = head.Turn
			}
			if ev.Kind == session.KindError {
				// Errors name no turn: those while it runs are its own.
				reason = errorMessage(ev)
			} else if head.Turn != turn {
				continue
			}
			if asJSON {
				if _, err := env.stdout.Write(append(bytes.TrimSpace(f.Raw), '\n')); err != nil {
					return err
				}
			} else if err := printTurnEvent(env, id, ev); err != nil {
				return err
			}
			if ev.Kind == session.KindTurnFinished {
				return turnResult(ev, reason)
			}
		}
	}
	if interrupted(ctx) {
		return stillRunning(id, seq)
	}
	return st.Err()
}

// printTurnEvent shows one event of the followed turn: output as the
// harness wrote it, other events as notes on stderr.
func printTurnEvent(env *cliEnv, id session.ID, ev session.Event) error {
	switch ev.Kind {
	case session.KindOutput:
		var d session.OutputData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			return fmt.Errorf("decode output event %d: %w", ev.Seq, err)
		}
		w := env.stdout
		if d.Stream == "stderr" {
			w = env.stderr
		}
		_, err := io.WriteString(w, d.Text)
		return err
	case session.KindAgent:
		_, err := fmt.Fprintln(env.stdout, agentSummary(ev.Data))
		return err
	case session.KindAgentMessage: // an ACP agent's answer: its text as it wrote it
		var d session.AgentMessageData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			return fmt.Errorf("decode agent_message event %d: %w", ev.Seq, err)
		}
		_, err := fmt.Fprintln(env.stdout, strings.TrimRight(d.Text, "\n"))
		return err
	case session.KindToolCall, session.KindToolCallUpdate, session.KindPlan:
		fmt.Fprintf(env.stderr, "%s: %s\n", ev.Kind, summary(ev))
	case session.KindApprovalRequested:
		var d session.ApprovalRequestedData
		_ = json.Unmarshal(ev.Data, &d)
		fmt.Fprintf(env.stderr, "approval needed (%s): %s\n  answer with: atrium approve %s %s   (or add --deny)\n", d.ID, d.Summary, id, d.ID)
	case session.KindApprovalResolved, session.KindError, session.KindPROpened:
		fmt.Fprintf(env.stderr, "%s: %s\n", ev.Kind, summary(ev))
	}
	return nil
}

// turnResult is nil for a turn that finished ok, else an error (exit 1)
// naming its status and exit code, and why it failed when an error event
// said so (reason).
func turnResult(ev session.Event, reason string) error {
	var d session.TurnFinishedData
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		return fmt.Errorf("decode turn_finished event %d: %w", ev.Seq, err)
	}
	if d.Status == session.TurnOK {
		return nil
	}
	msg := fmt.Sprintf("turn %d %s (exit code %d)", d.Turn, d.Status, d.ExitCode)
	if reason != "" {
		msg += ": " + reason
	}
	return exitError{code: 1, msg: safeText(msg)}
}

// errorMessage is the message of an error event, or its code when it has
// none.
func errorMessage(ev session.Event) string {
	var d session.ErrorData
	if json.Unmarshal(ev.Data, &d) != nil {
		return ""
	}
	if d.Message == "" {
		return string(d.Code)
	}
	return d.Message
}

func stillRunning(id session.ID, seq session.Seq) error {
	return exitError{code: 130, msg: strings.Join([]string{
		"interrupted; the prompt's turn goes on in the session",
		fmt.Sprintf("  follow it with: atrium logs %s --follow --after %d", id, seq),
	}, "\n")}
}
