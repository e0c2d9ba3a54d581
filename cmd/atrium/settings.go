package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// settingsCommands are `atrium settings` and `atrium rename`.
func settingsCommands(env *cliEnv) []*cobra.Command {
	return []*cobra.Command{newSettingsCmd(env), newRenameCmd(env)}
}

// newSettingsCmd is `atrium settings ID [--set KEY=VALUE]…`.
func newSettingsCmd(env *cliEnv) *cobra.Command {
	var (
		conn connFlags
		sets []string
	)
	cmd := &cobra.Command{
		Use:   "settings ID [--set KEY=VALUE]…",
		Short: "Show a session's title, or change its title and settings (owner)",
		Long: `Without --set, prints the session's title. With --set, changes it (owner only):

  title=TEXT              the session's title (as 'atrium rename')
  permission_mode=MODE    an agent session's permission mode: ask, auto-edit
                          or auto. It takes effect the next time the agent is
                          started (a running agent keeps its mode).
  turn_timeout=DURATION   how long the session's turns may run, e.g. 10m,
                          from the next turn; at most the server's
                          node.turn_timeout.

The server refuses keys it does not know, naming them.`,
		Example: `  atrium settings ID
  atrium settings ID --set title='release notes'
  atrium settings ID --set permission_mode=ask
  atrium settings ID --set turn_timeout=10m`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var patch client.SessionPatch
			for _, kv := range sets {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--set %q: want KEY=VALUE, e.g. --set permission_mode=ask", kv)
				}
				if k == "title" {
					patch.Title = &v
					continue
				}
				if patch.Settings == nil {
					patch.Settings = map[string]any{}
				}
				patch.Settings[k] = v
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			id := session.ID(args[0])
			if len(sets) == 0 {
				s, err := c.GetSession(cmd.Context(), id)
				if err != nil {
					return explain(err, conn.server)
				}
				fmt.Fprintf(env.stdout, "title: %s\n", s.Title)
				return nil
			}
			s, err := c.PatchSession(cmd.Context(), id, patch)
			if err != nil {
				return explain(err, conn.server)
			}
			fmt.Fprintf(env.stdout, "title: %s\n", s.Title)
			if m, ok := patch.Settings["permission_mode"]; ok {
				fmt.Fprintf(env.stdout, "permission_mode: %s (from the agent's next start)\n", m)
			}
			if d, ok := patch.Settings["turn_timeout"]; ok {
				fmt.Fprintf(env.stdout, "turn_timeout: %s (from the next turn)\n", d)
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&sets, "set", nil, "KEY=VALUE to change (repeatable): title, permission_mode, turn_timeout")
	conn.register(cmd)
	return cmd
}

// newRenameCmd is `atrium rename ID TITLE`.
func newRenameCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:     "rename ID TITLE",
		Short:   "Change a session's title (owner)",
		Example: `  atrium rename ID 'fix the flaky test'`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			s, err := c.PatchSession(cmd.Context(), session.ID(args[0]), client.SessionPatch{Title: &args[1]})
			if err != nil {
				return explain(err, conn.server)
			}
			fmt.Fprintf(env.stdout, "title: %s\n", s.Title)
			return nil
		},
	}
	conn.register(cmd)
	return cmd
}
