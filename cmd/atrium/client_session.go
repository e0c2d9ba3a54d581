package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

func newNewCmd(env *cliEnv) *cobra.Command {
	var (
		conn    connFlags
		title   string
		harness string
		command string
		agent   string
		stdin   string
		perm    string
		egress  []string
		sets    []string
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "new",
		Short: "Create a session and print its id",
		Long: `Create a session that you own and print its id.

The harness is what runs once per turn in the session's sandbox: a template
the server defines (--harness; the default template is 'shell', which runs
each prompt with bash), or a command of your own (--command, as a JSON array
or a shell-style string). A command reads its turn as a JSON line on stdin,
or with --stdin text the prompt alone and then end of input. The harness
contract is in DESIGN.md §6.

With --agent, turns run a coding agent instead (claude, codex, gemini,
opencode: see 'atrium agents ls'), one process that keeps the conversation
across turns.

--set KEY=VALUE (repeatable) gives any setting 'atrium settings ID --set'
takes (turn_timeout, memory_bytes, setup, mcp_servers, …) at creation; the
server refuses the whole create, naming the setting, when one is not
allowed.`,
		Example: `  atrium new --title "fix the flaky test"
  ID=$(atrium new --title demo) && atrium send "$ID" 'ls -la' --wait
  atrium new --command '["python3","-u","agent.py"]'
  atrium new --egress github.com --egress '*.npmjs.org'
  atrium new --agent claude --title "fix the flaky test"
  atrium new --agent codex --permission-mode auto
  atrium new --agent claude --set turn_timeout=10m --set setup='npm ci'
  atrium new --command 'python3 -u summarize.py' --stdin text --json`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := client.CreateRequest{Title: title, Egress: egress}
			switch {
			case agent != "" && (harness != "" || command != ""):
				return usageError(cmd, "give --agent, --harness or --command, not several")
			case agent != "":
				req.Harness.Agent = agent
			case harness != "" && command != "":
				return usageError(cmd, "give --harness or --command, not both")
			case harness != "":
				req.Harness.Template = harness
			case command != "":
				argv, err := parseCommand(command)
				if err != nil {
					return usageError(cmd, "--command: %v", err)
				}
				req.Harness.Command = argv
			}
			if stdin != "" && (agent != "" || command == "" && harness == "") {
				return usageError(cmd, "--stdin applies to a --command or --harness")
			}
			req.Harness.Stdin = stdin
			req.Harness.PermissionMode = perm
			if err := req.Harness.Validate(); err != nil {
				return usageError(cmd, "%s", session.AsError(err).Message)
			}
			if len(title) > session.MaxTitleBytes {
				return usageError(cmd, "--title is longer than %d bytes", session.MaxTitleBytes)
			}
			for _, kv := range sets {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usageError(cmd, "--set %q: want KEY=VALUE, e.g. --set turn_timeout=10m", kv)
				}
				if k == "title" {
					return usageError(cmd, "give the title with --title, not --set")
				}
				val, err := settingValue(k, v)
				if err != nil {
					return usageError(cmd, "%v", err)
				}
				raw, err := json.Marshal(val)
				if err != nil {
					return usageError(cmd, "--set %s: %v", k, err)
				}
				if req.Settings == nil {
					req.Settings = map[string]json.RawMessage{}
				}
				req.Settings[k] = raw
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			s, err := c.CreateSession(cmd.Context(), req)
			if err != nil {
				return explain(err, conn.server)
			}
			if asJSON {
				return writeJSON(env.stdout, s)
			}
			_, err = fmt.Fprintln(env.stdout, s.ID)
			return err
		},
	}
	conn.register(cmd)
	f := cmd.Flags()
	f.StringVar(&title, "title", "", "the session's title")
	f.StringArrayVar(&egress, "egress", nil, "a host the sandbox may reach (repeat; the server's sandbox.egress_permit must cover it)")
	f.StringVar(&harness, "harness", "", "harness template name (default: the server's default, 'shell')")
	f.StringVar(&command, "command", "", `harness command: a JSON array ('["prog","arg"]') or a shell-style string ('prog arg')`)
	f.StringVar(&agent, "agent", "", "run a coding agent over ACP (claude, codex, gemini, opencode, or one from the server's config)")
	f.StringVar(&perm, "permission-mode", "", `an agent session's permission mode: "ask", "auto-edit" or "auto" (default: the server's agent_mode)`)
	f.StringVar(&stdin, "stdin", "", `how a harness gets its turn: "json" (default) or "text" (the prompt alone, then end of input)`)
	f.StringArrayVar(&sets, "set", nil, "KEY=VALUE setting of the new session (repeatable; the keys of 'atrium settings --set')")
	f.BoolVar(&asJSON, "json", false, "print the created session as JSON")
	return cmd
}

// parseCommand reads an argv from a JSON array of strings or a shell-style
// string.
func parseCommand(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	var argv []string
	if strings.HasPrefix(s, "[") {
		if err := json.Unmarshal([]byte(s), &argv); err != nil {
			return nil, fmt.Errorf("not a JSON array of strings: %v", err)
		}
	} else {
		var err error
		if argv, err = shellSplit(s); err != nil {
			return nil, err
		}
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("the command is empty")
	}
	return argv, nil
}

// shellSplit splits s into words like a POSIX shell does for simple
// commands: whitespace separates words; single quotes keep everything
// literally; double quotes keep everything but \" \\ \$ \`; a backslash
// outside quotes escapes the next character. It expands nothing.
func shellSplit(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
	)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == ' ' || ch == '\t' || ch == '\n':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case ch == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			in = true
		case ch == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated double quote")
			}
			in = true
		case ch == '\\':
			if i+1 >= len(s) {
				return nil, errors.New("trailing backslash")
			}
			i++
			cur.WriteByte(s[i])
			in = true
		default:
			cur.WriteByte(ch)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

func newLsCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
		quiet  bool
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the sessions you can see",
		Long:    `List the sessions you own or that were shared with you, oldest first.`,
		Example: `  atrium ls
  atrium ls -q | tail -n1          # the id of the newest session
  atrium ls --json | jq -r '.[].id'`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			list, err := c.ListSessions(cmd.Context())
			if err != nil {
				return explain(err, conn.server)
			}
			if asJSON {
				if list == nil {
					list = []session.Session{}
				}
				return writeJSON(env.stdout, list)
			}
			if quiet {
				for _, s := range list {
					fmt.Fprintln(env.stdout, s.ID)
				}
				return nil
			}
			if len(list) == 0 {
				fmt.Fprintln(env.stderr, "No sessions yet. Create one with: atrium new --title NAME")
				return nil
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTITLE\tSTATE\tROLE\tLAST SEQ\tUSAGE\tCREATED")
			now := time.Now()
			for _, s := range list {
				title := oneLine(s.Title, 40)
				if title == "" {
					title = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, title, s.State, s.Role, s.LastSeq, usageTotals(s.Usage), created(s.CreatedAt, now))
			}
			return tw.Flush()
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the session ids, one a line")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sessions as a JSON array")
	return cmd
}

// usageTotals formats a session's usage totals for a table: "-" if none.
func usageTotals(u *session.UsageTotals) string {
	if u == nil {
		return "-"
	}
	return fmt.Sprintf("%d in, %d out, $%.4f", u.InputTokens, u.OutputTokens, u.CostUSD)
}

// created formats a creation time: local date and minute.
func created(t session.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	lt := t.Local()
	if lt.Year() == now.Year() {
		return lt.Format("Jan 02 15:04")
	}
	return lt.Format("2006-01-02 15:04")
}

func newCancelCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Stop the session's running turn",
		Long: `Stop the turn that is running in a session (its harness gets SIGTERM, then
SIGKILL after a grace period). Prompts queued behind it still run. Needs the
driver or owner role.`,
		Example: `  atrium cancel s_3kq7xq4m2fdh2dnbw5ad`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			id := session.ID(args[0])
			if err := c.Cancel(cmd.Context(), id); err != nil {
				if errors.Is(err, session.ErrConflict) {
					return cliError{err: err, msg: "nothing to cancel: no turn is running in " + string(id),
						hint: "see what happened with 'atrium logs " + string(id) + "'"}
				}
				return explain(err, conn.server)
			}
			fmt.Fprintf(env.stdout, "cancel requested for the running turn of %s\n", id)
			return nil
		},
	}
	conn.register(cmd)
	return cmd
}

func newShareCmd(env *cliEnv) *cobra.Command {
	var (
		conn connFlags
		role string
	)
	cmd := &cobra.Command{
		Use:   "share ID USER --role viewer|driver|owner|none",
		Short: "Give someone a role on a session, or take it away",
		Long: `Give USER a role on a session you own: a viewer reads and watches; a driver
also prompts, cancels and answers approvals; an owner also shares the session
and deletes it. --role none removes them (the session's creator stays its
owner).`,
		Example: `  atrium share ID bob --role driver
  atrium share ID carol --role viewer
  atrium share ID dana --role owner
  atrium share ID bob --role none`,
		Args: exactArgs("ID", "USER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("role") {
				return usageError(cmd, "--role is required: viewer, driver, owner or none")
			}
			r, err := session.ParseRole(role)
			if err != nil {
				return usageError(cmd, "--role %q: want viewer, driver, owner or none", role)
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			id, user := session.ID(args[0]), args[1]
			if err := c.SetMember(cmd.Context(), id, user, r); err != nil {
				return explain(err, conn.server)
			}
			if r == session.RoleNone {
				fmt.Fprintf(env.stdout, "%s no longer has a role on %s\n", user, id)
			} else {
				fmt.Fprintf(env.stdout, "%s is now a %s of %s\n", user, r, id)
			}
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().StringVar(&role, "role", "", "viewer, driver, owner, or none to remove")
	return cmd
}

func newApproveCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		deny   bool
		option string
		wait   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "approve ID APPROVAL_ID",
		Short: "Answer a harness's approval request",
		Long: `Answer an approval request of the running turn (an approval_requested event,
shown by 'atrium logs' and 'atrium attach'): allow it, or deny it with --deny.
Needs the driver or owner role.

An approval that is not pending yet (the turn asking for it is queued or just
starting) is waited for, up to --wait.

A coding agent's request offers options (shown by logs and attach, e.g.
allow_always, allow, reject): --option answers with one of them. Plain approve
picks the agent's allow-once option, --deny its reject-once one.`,
		Example: `  atrium approve ID a1
  atrium approve ID a1 --deny
  atrium approve ID t1-p1 --option allow_always   # an agent keeps "always" as its own rule
  atrium approve ID a1 --wait 0    # fail at once if a1 is not pending`,
		Args: exactArgs("ID", "APPROVAL_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			id, aid := session.ID(args[0]), args[1]
			deadline := time.Now().Add(wait)
			said := false
			for {
				if option != "" {
					err = c.ApproveOption(cmd.Context(), id, aid, option)
				} else {
					err = c.Approve(cmd.Context(), id, aid, !deny)
				}
				if !errors.Is(err, session.ErrNotFound) || !time.Now().Before(deadline) || cmd.Context().Err() != nil {
					break
				}
				if !said {
					fmt.Fprintf(env.stderr, "approval %s is not pending yet; waiting up to %v…\n", safeLine(aid), wait)
					said = true
				}
				select {
				case <-cmd.Context().Done():
				case <-time.After(approveRetry): // Polling interval.
				}
			}
			if err != nil {
				if errors.Is(err, session.ErrNotFound) {
					return cliError{err: err, msg: fmt.Sprintf("no pending approval %q in %s (or no such session)", aid, id),
						hint: "pending approvals show in 'atrium logs " + string(id) + "' as approval_requested"}
				}
				return explain(err, conn.server)
			}
			if option != "" {
				fmt.Fprintf(env.stdout, "%s answered with option %s\n", aid, safeLine(option))
				return nil
			}
			fmt.Fprintf(env.stdout, "%s %s\n", aid, allowWord(!deny))
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&deny, "deny", false, "deny instead of allow")
	cmd.Flags().StringVar(&option, "option", "", "answer with one of the agent's options (its id, e.g. allow_always)")
	cmd.MarkFlagsMutuallyExclusive("deny", "option")
	cmd.Flags().DurationVar(&wait, "wait", DefaultApproveWait, "how long to wait for the approval to be requested")
	return cmd
}

// DefaultApproveWait is how long `atrium approve` waits for an approval that
// is not pending yet; approveRetry is how often it asks again meanwhile.
const (
	DefaultApproveWait = 15 * time.Second
	approveRetry       = 200 * time.Millisecond
)

func newRmCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:   "rm ID",
		Short: "Delete a session and its history",
		Long: `Delete a session: its running turn is stopped, its history and workspace are
removed, and everyone watching it is disconnected. It does not ask. Owner only.`,
		Example: `  atrium rm s_3kq7xq4m2fdh2dnbw5ad`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			id := session.ID(args[0])
			if err := c.DeleteSession(cmd.Context(), id); err != nil {
				return explain(err, conn.server)
			}
			fmt.Fprintf(env.stdout, "deleted %s\n", id)
			return nil
		},
	}
	conn.register(cmd)
	return cmd
}
