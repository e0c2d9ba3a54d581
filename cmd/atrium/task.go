package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
)

// taskPollInterval is how often `atrium task run` reads the task's state.
const taskPollInterval = time.Second

// newTaskCmd is `atrium task run|ls|show`.
func newTaskCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Run repository tasks that open pull requests",
		Long: `A repository task works on a repository in a fresh session: its sandbox clones
the repository, the harness runs the prompt, and if anything changed the work
is committed (with you as the author), pushed to branch atrium/<task id>, and
a pull request is opened on the forge (GitHub, Gitea, Forgejo). The server
checks that your forge login may push to the repository before anything
starts. See docs/automation.md, "Repository tasks".`,
		Example: `  atrium task run --repo https://github.com/acme/widgets --base main "make fmt"
  atrium task run --repo https://github.com/acme/widgets --title "Fix typo" --detach "sed -i s/teh/the/ README.md"
  atrium task ls
  atrium task show task_3kq7xq4m2fdh2dnbw5ad`,
	}
	cmd.AddCommand(newTaskRunCmd(env), newTaskLsCmd(env), newTaskShowCmd(env))
	return cmd
}

func newTaskRunCmd(env *cliEnv) *cobra.Command {
	var (
		conn    connFlags
		req     client.TaskRequest
		command []string
		agent   string
		retry   retryFlags
		detach  bool
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "run --repo URL [--base BRANCH] PROMPT",
		Short: "Start a task and wait for its pull request",
		Long: `Start a repository task and wait until it is done, printing its progress to
stderr. When it opened a pull request, its URL is printed to stdout. When the
work changed nothing, nothing is pushed and the command says so (exit 0). A
task that failed exits 1 with the reason and its dead letter, which
'atrium dlq retry ID' runs again. PROMPT "-" reads the prompt from stdin.

By default the prompt runs as a shell command in the repository (the shell
harness); --command runs another harness with the prompt on its stdin (the
harness contract). --agent runs a coding agent installed on the server's nodes
(claude, codex, gemini, opencode: see 'atrium agents ls') in the session: the
repository is put into its workspace on the task's branch, the agent works on
the prompt in one turn, and what it changed is committed and pushed by the
server. Approvals the agent asks for follow the server's permission mode; a
driver can answer them in the session ('atrium attach SESSION').

The server retries what failed on its side (a sandbox that did not start, the
forge or a node that did not answer). With --retry-attempts N a turn that
failed or timed out is tried again too, up to N tries in all: the prompt is
sent again to the same session, whose workspace is as the last try left it,
after --retry-backoff (doubled each time, up to --retry-max-backoff).

With --detach, print the task id and session and return at once; 'atrium task
show ID' tells how it went.`,
		Example: `  atrium task run --repo https://github.com/acme/widgets --base main "make fmt"
  atrium task run --repo https://gitea.example.com/acme/widgets --title "Update deps" "go get -u ./... && go mod tidy"
  atrium task run --repo https://github.com/acme/widgets --agent claude "Fix the flaky test in store_test.go"
  atrium task run --repo https://github.com/acme/widgets --agent claude --retry-attempts 3 --retry-backoff 2m "Make the build pass"
  atrium task run --repo https://github.com/acme/widgets --detach --json "make fmt"`,
		Args: exactArgs("PROMPT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := readPrompt(cmd, env, args[0])
			if err != nil {
				return err
			}
			if req.Repo == "" {
				return usageError(cmd, "--repo is required: the repository's https URL, e.g. https://github.com/acme/widgets")
			}
			req.Prompt = text
			if len(command) > 0 && agent != "" {
				return usageError(cmd, "give --agent or --command, not both: --agent runs an installed coding agent, --command a harness")
			}
			if len(command) > 0 {
				req.Harness.Command = command
			}
			req.Harness.Agent = agent
			if req.Retry, err = retry.policy(cmd); err != nil {
				return err
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, err := c.StartTask(ctx, req)
			if err != nil {
				return explainTask(err, conn.server)
			}
			if detach {
				if asJSON {
					return writeJSON(env.stdout, st)
				}
				fmt.Fprintf(env.stdout, "%s\t%s\n", st.Task, st.Session)
				return nil
			}
			fmt.Fprintf(env.stderr, "task %s started in session %s (branch %s)\n", st.Task, st.Session, st.Branch)
			fmt.Fprintf(env.stderr, "  watch it: atrium logs %s --follow\n", st.Session)
			t, err := waitTask(cmd, env, c, st.Task)
			if err != nil {
				if interrupted(ctx) {
					return cliError{err: err, msg: "stopped waiting; the task goes on",
						hint: "see how it went with 'atrium task show " + st.Task + "'"}
				}
				return explainTask(err, conn.server)
			}
			return printTaskEnd(env, t, asJSON)
		},
	}
	conn.register(cmd)
	cmd.Flags().StringVar(&req.Repo, "repo", "", "repository URL, e.g. https://github.com/acme/widgets (required)")
	cmd.Flags().StringVar(&req.Base, "base", "main", "branch the pull request merges into")
	cmd.Flags().StringVar(&req.Title, "title", "", "pull request title (default: the prompt's first line)")
	cmd.Flags().StringArrayVar(&command, "command", nil, "harness argv, one --command per argument (default: the shell harness)")
	cmd.Flags().StringVar(&agent, "agent", "", "run this coding agent on the prompt (see 'atrium agents ls'), e.g. claude")
	retry.register(cmd)
	cmd.Flags().StringVar(&req.CallbackURL, "callback-url", "", "URL the server POSTs the signed result to (if the server allows it)")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "print the task id and session and return without waiting")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the task (or, with --detach, {task,session,branch}) as JSON")
	return cmd
}

func newTaskShowCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a task: its status, session, branch and pull request",
		Example: `  atrium task show task_3kq7xq4m2fdh2dnbw5ad
  atrium task show task_3kq7xq4m2fdh2dnbw5ad --json | jq -r .pr_url`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			t, err := c.GetTask(cmd.Context(), args[0])
			if err != nil {
				return explainTask(err, conn.server)
			}
			if asJSON {
				return writeJSON(env.stdout, t)
			}
			fmt.Fprintf(env.stdout, "task     %s\nstatus   %s\nrepo     %s (base %s)\ntitle    %s\nsession  %s\nbranch   %s\n",
				t.ID, t.Status, t.Repo, t.Base, t.Title, t.Session, t.Branch)
			if t.Agent != "" {
				fmt.Fprintf(env.stdout, "agent    %s\n", t.Agent)
			}
			fmt.Fprintf(env.stdout, "retries  %s", retryDetail(t.Retry))
			if t.Attempts > 0 {
				fmt.Fprintf(env.stdout, "; %d attempt(s) made", t.Attempts)
			}
			fmt.Fprintln(env.stdout)
			if t.Commit != "" {
				fmt.Fprintf(env.stdout, "commit   %s\n", t.Commit)
			}
			if t.PRURL != "" {
				fmt.Fprintf(env.stdout, "pr       %s\n", t.PRURL)
			}
			if t.Error != "" {
				fmt.Fprintf(env.stdout, "error    %s\n", t.Error)
			}
			if t.DeadLetter != "" {
				fmt.Fprintf(env.stdout, "dead letter %s (retry: atrium dlq retry %s)\n", t.DeadLetter, t.DeadLetter)
			}
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the task as JSON")
	return cmd
}

// waitTask polls task id until it is no longer running, printing each new
// status to stderr.
func waitTask(cmd *cobra.Command, env *cliEnv, c *client.Client, id string) (client.Task, error) {
	ctx := cmd.Context()
	tick := time.NewTicker(taskPollInterval)
	defer tick.Stop()
	last := ""
	for {
		t, err := c.GetTask(ctx, id)
		if err != nil {
			return client.Task{}, err
		}
		if t.Status != last {
			last = t.Status
			if t.Status == "running" {
				fmt.Fprintln(env.stderr, "  running: cloning, working, pushing…")
			}
		}
		if t.Status != "running" {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return client.Task{}, ctx.Err()
		case <-tick.C:
		}
	}
}

// printTaskEnd says how a finished task went: the pull request's URL on
// stdout, or why there is none.
func printTaskEnd(env *cliEnv, t client.Task, asJSON bool) error {
	if asJSON {
		if err := writeJSON(env.stdout, t); err != nil {
			return err
		}
	}
	switch t.Status {
	case "pr_opened":
		if !asJSON {
			fmt.Fprintf(env.stderr, "pull request opened from %s (commit %.12s)\n", t.Branch, t.Commit)
			fmt.Fprintln(env.stdout, t.PRURL)
		}
		return nil
	case "nothing_to_do":
		fmt.Fprintln(env.stderr, "nothing to do: the task changed nothing, so no branch was pushed and no pull request opened")
		return nil
	}
	hint := "see the session's output: atrium logs " + string(t.Session)
	if t.DeadLetter != "" {
		hint += "; once fixed, run it again: atrium dlq retry " + t.DeadLetter
	}
	return cliError{err: fmt.Errorf("task %s failed: %s", t.ID, t.Error), msg: "task " + t.ID + " failed: " + t.Error, hint: hint}
}

// explainTask is explain with hints for tasks.
func explainTask(err error, server string) error {
	err = explain(err, server)
	var ce cliError
	if e, ok := err.(cliError); ok {
		ce = e
		switch {
		case ce.hint == "ask the session's owner for a role: atrium share ID YOU --role driver":
			ce.hint = "tasks need write access to the repository on its forge, and your user mapped to a forge login in the server's tasks.forges"
		case ce.hint == "list the sessions you can see with 'atrium ls'":
			ce.hint = "check the task id (tasks are visible to their user and tenant admins)"
		}
		return ce
	}
	return err
}
