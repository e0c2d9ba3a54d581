package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
)

func newTaskLsCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		sess   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls [--session ID]",
		Short: "List your repository tasks, newest first (a tenant admin sees the tenant's)",
		Example: `  atrium task ls
  atrium task ls --session s_3kq7xq4m2fdh2dnbw5ad
  atrium task ls --json | jq -r '.[] | select(.status == "pr_opened") | .pr_url'`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			list, err := c.ListTasks(cmd.Context(), sess)
			if err != nil {
				return explainTask(err, conn.server)
			}
			if asJSON {
				if list == nil {
					list = []client.Task{}
				}
				return writeJSON(env.stdout, list)
			}
			if len(list) == 0 {
				if sess != "" {
					fmt.Fprintf(env.stderr, "no tasks of session %s\n", safeLine(sess))
					return nil
				}
				fmt.Fprintln(env.stderr, `no tasks; start one with: atrium task run --repo URL "PROMPT"`)
				return nil
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATUS\tREPO\tBASE\tSESSION\tTITLE\tPR")
			for _, t := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", safeLine(t.ID), safeLine(t.Status), safeLine(t.Repo), safeLine(t.Base),
					safeLine(string(t.Session)), safeLine(t.Title), safeLine(t.PRURL))
			}
			return tw.Flush()
		},
	}
	conn.register(cmd)
	cmd.Flags().StringVar(&sess, "session", "", "only the tasks of this session")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the tasks as a JSON array")
	return cmd
}
