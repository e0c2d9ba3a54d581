package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
)

// dlqPollInterval is how often `atrium dlq retry --wait` reads the list.
const dlqPollInterval = time.Second

// newDLQCmd is `atrium dlq ls|retry|drop`.
func newDLQCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, retry or drop background runs that failed (dead letters)",
		Long: `Background runs (scheduled prompts, repository tasks) that fail for a
transient reason (no node, sandbox failed to start, forge or object store
unavailable, timeout) are retried with exponential backoff. A run that fails
for good, or runs out of attempts, becomes a dead letter with the reason: it
waits here until someone retries it (it runs again, as the user it acted for)
or drops it. You see your own dead letters; tenant admins see the tenant's.
See docs/automation.md, "Retries and dead letters".`,
		Example: `  atrium dlq ls
  atrium dlq retry dl_3kq7xq4m2fdh2dnbw5ad --wait
  atrium dlq drop dl_3kq7xq4m2fdh2dnbw5ad`,
	}
	cmd.AddCommand(newDLQLsCmd(env), newDLQRetryCmd(env), newDLQDropCmd(env))
	return cmd
}

func newDLQLsCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters, newest first",
		Example: `  atrium dlq ls
  atrium dlq ls --json | jq -r '.[] | select(.kind == "schedule") | .id'`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			list, err := c.ListDeadLetters(cmd.Context())
			if err != nil {
				return explainAutomation(err, conn.server, "dead letter")
			}
			if asJSON {
				if list == nil {
					list = []client.DeadLetter{}
				}
				return writeJSON(env.stdout, list)
			}
			if len(list) == 0 {
				fmt.Fprintln(env.stderr, "no dead letters: every background run succeeded or is still being retried")
				return nil
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tKIND\tREF\tUSER\tFAILED\tATTEMPTS\tREASON")
			for _, e := range list {
				why := "exhausted"
				if e.Permanent {
					why = "permanent"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d (%s)\t%s\n", e.ID, e.Kind, e.Ref, e.User,
					e.FailedAt.Local().Format("2006-01-02 15:04:05"), e.Attempts, why, shortReason(e.Reason, 100))
			}
			return tw.Flush()
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the dead letters as a JSON array (with full reasons)")
	return cmd
}

func newDLQRetryCmd(env *cliEnv) *cobra.Command {
	var (
		conn connFlags
		wait bool
	)
	cmd := &cobra.Command{
		Use:   "retry ID",
		Short: "Run a dead letter's run again",
		Long: `Run a dead letter's run again, as the user it acted for. The server answers at
once and runs it in the background: on success the dead letter goes away, on
failure it stays with the new reason. With --wait, wait for the outcome: exit 1
with the new reason if it failed again.`,
		Example: `  atrium dlq retry dl_3kq7xq4m2fdh2dnbw5ad
  atrium dlq retry dl_3kq7xq4m2fdh2dnbw5ad --wait`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var before client.DeadLetter
			if wait {
				before, err = findDeadLetter(ctx, c, id)
				if err != nil {
					return explainAutomation(err, conn.server, "dead letter")
				}
			}
			if err := c.RetryDeadLetter(ctx, id); err != nil {
				return explainAutomation(err, conn.server, "dead letter")
			}
			if !wait {
				fmt.Fprintf(env.stdout, "retrying %s: it leaves 'atrium dlq ls' when it succeeds, or shows the new reason there\n", id)
				return nil
			}
			fmt.Fprintf(env.stderr, "retrying %s…\n", id)
			after, err := waitRetry(ctx, c, before)
			switch {
			case err != nil && interrupted(ctx):
				return cliError{err: err, msg: "stopped waiting; the retry goes on", hint: "see how it went with 'atrium dlq ls'"}
			case err != nil:
				return explainAutomation(err, conn.server, "dead letter")
			case after != nil:
				return cliError{msg: "the retry failed: " + after.Reason,
					hint: "fix the cause and retry again, or drop it: atrium dlq drop " + id}
			}
			fmt.Fprintf(env.stdout, "%s retried: it succeeded\n", id)
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for the outcome of the retry")
	return cmd
}

// findDeadLetter returns dead letter id from the list, or a not-found error.
func findDeadLetter(ctx context.Context, c *client.Client, id string) (client.DeadLetter, error) {
	list, err := c.ListDeadLetters(ctx)
	if err != nil {
		return client.DeadLetter{}, err
	}
	for _, e := range list {
		if e.ID == id {
			return e, nil
		}
	}
	return client.DeadLetter{}, cliError{msg: "there is no dead letter " + id, hint: "list yours with 'atrium dlq ls'"}
}

// waitRetry polls until the retry of e has ended: nil if e is gone (it
// succeeded), else e as it failed again.
func waitRetry(ctx context.Context, c *client.Client, e client.DeadLetter) (*client.DeadLetter, error) {
	t := time.NewTicker(dlqPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		list, err := c.ListDeadLetters(ctx)
		if err != nil {
			return nil, err
		}
		gone := true
		for _, cur := range list {
			if cur.ID != e.ID {
				continue
			}
			gone = false
			if cur.Attempts != e.Attempts || !cur.FailedAt.Equal(e.FailedAt) {
				return &cur, nil
			}
		}
		if gone {
			return nil, nil
		}
	}
}

func newDLQDropCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:     "drop ID",
		Aliases: []string{"rm"},
		Short:   "Delete a dead letter without running it",
		Example: `  atrium dlq drop dl_3kq7xq4m2fdh2dnbw5ad`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			if err := c.DropDeadLetter(cmd.Context(), args[0]); err != nil {
				return explainAutomation(err, conn.server, "dead letter")
			}
			fmt.Fprintf(env.stdout, "dead letter %s dropped\n", args[0])
			return nil
		},
	}
	conn.register(cmd)
	return cmd
}

// shortReason returns s on one line, cut to n runes.
func shortReason(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
