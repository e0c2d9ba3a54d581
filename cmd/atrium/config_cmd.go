package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
)

func newConfigCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check configuration files",
	}
	var dev bool
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a configuration file and print the effective configuration",
		Long: `Validate a configuration file as 'atrium serve --config FILE' would, with the
environment overrides (ATRIUM_<KEY_PATH>, e.g. ATRIUM_AUTH_OIDC_CLIENT_SECRET) applied
and defaults filled in, and print the effective configuration with secrets redacted.
Every problem is listed with the setting it concerns. Exit status 1 if any.

See docs/configuration.md for every setting and its default.`,
		Example: `  atrium config check /etc/atrium/atrium.yaml
  ATRIUM_AUTH_COOKIE_KEY=$(openssl rand -base64 32) atrium config check atrium.yaml
  atrium config check --dev dev.yaml     # as 'atrium dev --config' would`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := config.Load(args[0], env.getenv)
			if err != nil {
				return err
			}
			out, err := f.Redacted()
			if err != nil {
				return fmt.Errorf("print config: %w", err)
			}
			if err := f.Validate(dev); err != nil {
				return fmt.Errorf("%s is not valid:\n%w", args[0], err)
			}
			fmt.Fprintf(env.stdout, "# %s is valid.\n# This process runs: %s.\n# Effective configuration (secrets redacted):\n%s", args[0], rolesDetail(f), out)
			return nil
		},
	}
	check.Flags().BoolVar(&dev, "dev", false, "validate for 'atrium dev' (allows the dev identity)")
	cmd.AddCommand(check)
	return cmd
}
