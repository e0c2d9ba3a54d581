package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/session"
)

// newSecretCmd is `atrium secret set|ls|rm`.
func newSecretCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage a session's secrets (environment of its harness)",
		Long: `A session's secrets are environment variables of its harness at every turn,
set by the session's owner. The server never shows a value again, logs it or
puts it in an event.`,
		Example: `  atrium secret set ID GITHUB_TOKEN < token.txt
  printf %s "$TOKEN" | atrium secret set ID GITHUB_TOKEN
  atrium secret set ID NPM_TOKEN --value-file ~/.npm-token
  atrium secret ls ID
  atrium secret rm ID GITHUB_TOKEN`,
	}
	cmd.AddCommand(newSecretSetCmd(env), newSecretLsCmd(env), newSecretRmCmd(env))
	return cmd
}

func newSecretSetCmd(env *cliEnv) *cobra.Command {
	var (
		conn      connFlags
		valueFile string
		value     string
	)
	cmd := &cobra.Command{
		Use:   "set ID NAME",
		Short: "Set a secret from stdin or --value-file",
		Long: `Set secret NAME of session ID. The value is read from standard input (one
trailing newline is dropped) or from --value-file. --value exists but puts
the secret in your shell history and in the process list: avoid it.`,
		Example: `  atrium secret set ID GITHUB_TOKEN < token.txt
  atrium secret set ID GITHUB_TOKEN --value-file token.txt`,
		Args: exactArgs("ID", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, name := session.ID(args[0]), args[1]
			if err := session.ValidSecretName(name); err != nil {
				return usageError(cmd, "%s", session.AsError(err).Message)
			}
			var v []byte
			var err error
			switch {
			case valueFile != "" && cmd.Flags().Changed("value"):
				return usageError(cmd, "give --value-file or --value, not both")
			case cmd.Flags().Changed("value"):
				fmt.Fprintln(env.stderr, "warning: --value leaves the secret in your shell history and the process list; prefer stdin or --value-file")
				v = []byte(value)
			case valueFile != "":
				v, err = os.ReadFile(valueFile)
				if err != nil {
					return fmt.Errorf("read --value-file: %w", err)
				}
			default:
				v, err = io.ReadAll(io.LimitReader(env.stdin, session.MaxSecretBytes+2))
				if err != nil {
					return fmt.Errorf("read the secret from stdin: %w", err)
				}
			}
			s := strings.TrimSuffix(strings.TrimSuffix(string(v), "\n"), "\r")
			if len(s) > session.MaxSecretBytes {
				return usageError(cmd, "the value is longer than %d bytes", session.MaxSecretBytes)
			}
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			if err := c.SetSecret(cmd.Context(), id, name, s); err != nil {
				return explain(err, conn.server)
			}
			fmt.Fprintf(env.stdout, "secret %s set on %s (harnesses see it from the next turn)\n", name, id)
			return nil
		},
	}
	conn.register(cmd)
	cmd.Flags().StringVar(&valueFile, "value-file", "", "read the value from this file")
	cmd.Flags().StringVar(&value, "value", "", "the value itself (unsafe: visible in shell history and ps)")
	return cmd
}

func newSecretLsCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "ls ID",
		Short:   "List a session's secrets (names only)",
		Example: `  atrium secret ls ID`,
		Args:    exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			list, err := c.ListSecrets(cmd.Context(), session.ID(args[0]))
			if err != nil {
				return explain(err, conn.server)
			}
			if asJSON {
				return writeJSON(env.stdout, list)
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tUPDATED\tBY")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, s.UpdatedAt.Format("2006-01-02 15:04:05Z07:00"), s.UpdatedBy)
			}
			return tw.Flush()
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

func newSecretRmCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:     "rm ID NAME",
		Short:   "Remove a session's secret",
		Example: `  atrium secret rm ID GITHUB_TOKEN`,
		Args:    exactArgs("ID", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			if err := c.DeleteSecret(cmd.Context(), session.ID(args[0]), args[1]); err != nil {
				return explain(err, conn.server)
			}
			fmt.Fprintf(env.stdout, "secret %s removed from %s\n", args[1], args[0])
			return nil
		},
	}
	conn.register(cmd)
	return cmd
}

// newEgressCmd is `atrium egress set ID HOST…`.
func newEgressCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "egress",
		Short: "Manage the hosts a session's sandbox may reach",
		Long: `A session's sandbox has no network except the hosts of the server's
sandbox.egress allowlist and the session's own list, which its owner sets
within what the server's sandbox.egress_permit covers. A change applies from
the next turn.`,
	}
	var conn connFlags
	set := &cobra.Command{
		Use:   "set ID [HOST…]",
		Short: "Replace the session's own egress allowlist (no HOST: clear it)",
		Example: `  atrium egress set ID github.com '*.npmjs.org'
  atrium egress set ID              # only the server's default list`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			s, err := c.SetEgress(cmd.Context(), session.ID(args[0]), args[1:])
			if err != nil {
				return explain(err, conn.server)
			}
			if len(s.Egress) == 0 {
				fmt.Fprintf(env.stdout, "%s has no egress of its own (the server's default list still applies)\n", s.ID)
			} else {
				fmt.Fprintf(env.stdout, "%s may reach: %s (from the next turn)\n", s.ID, strings.Join(s.Egress, ", "))
			}
			return nil
		},
	}
	conn.register(set)
	cmd.AddCommand(set)
	return cmd
}
