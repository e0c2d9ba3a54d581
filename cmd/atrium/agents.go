package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/session"
)

// agentDirFlags are the agents commands' --data and --config: where the
// server keeps its data (agents are installed per node, into its data
// directory).
type agentDirFlags struct {
	data, config string
}

func (a *agentDirFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&a.data, "data", server.DefaultDataDir, "the server's data directory")
	f.StringVarP(&a.config, "config", "c", "", "the server's configuration file, to read its data_dir and agents")
}

// catalog opens the agent catalog of the data directory the flags name.
func (a *agentDirFlags) catalog(cmd *cobra.Command, env *cliEnv) (*agents.Catalog, error) {
	dir := a.data
	var extra []agents.Spec
	if a.config != "" {
		if cmd.Flags().Changed("data") {
			return nil, usageError(cmd, "give --data or --config, not both")
		}
		f, err := config.Load(a.config, env.getenv)
		if err != nil {
			return nil, err
		}
		dir, extra = f.DataDir, f.Agents
	}
	return newAgentCatalog(dir, extra)
}

// newAgentCatalog returns the catalog of the agents installed in dataDir,
// the built-ins plus extra (the configuration's agents).
func newAgentCatalog(dataDir string, extra []agents.Spec) (*agents.Catalog, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	return agents.New(agents.Config{
		Dir:    filepath.Join(abs, agents.DirName),
		Homes:  filepath.Join(abs, agents.HomesName),
		Agents: extra,
	})
}

func newAgentsCmd(env *cliEnv) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agents",
		Short: "Install and list the coding agents sessions can run",
		Long: `Coding agents (Claude Code, Codex, Gemini CLI, OpenCode, or any other agent that
speaks the Agent Client Protocol) run inside each session's sandbox. They are npm
packages installed into the server's data directory, on every node, and mounted
read-only into sandboxes. The built-in agents install at the versions Atrium's
tests run; the configuration's agents list adds others.`,
		Example: `  atrium agents install claude
  atrium agents install claude codex gemini opencode --data /var/lib/atrium
  atrium agents ls`,
	}
	cmd.AddCommand(newAgentsInstallCmd(env), newAgentsLsCmd(env))
	return cmd
}

func newAgentsInstallCmd(env *cliEnv) *cobra.Command {
	var dirs agentDirFlags
	var version string
	cmd := &cobra.Command{
		Use:   "install NAME...",
		Short: "Install agents with npm into the data directory",
		Long: `Install agents with npm (which must be on PATH) into <data dir>/agents/NAME/VERSION,
and make the installed version the one new agent processes use. Without
--version, an agent installs at its pinned version, the one Atrium's tests run.
An install is atomic: a failed one leaves the previous state as it was.
Installing a version already there only selects it. npm's progress goes to
standard error.

Run it on every node, as the user the server runs as (or give --data / --config
naming the server's data directory).`,
		Example: `  atrium agents install claude
  atrium agents install claude codex --data /var/lib/atrium
  atrium agents install claude --version 0.23.1
  sudo -u atrium atrium agents install gemini --config /etc/atrium/atrium.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "name the agents to install (built in: claude, codex, gemini, opencode)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if version != "" && len(args) > 1 {
				return usageError(cmd, "--version applies to one agent: install them one at a time")
			}
			cat, err := dirs.catalog(cmd, env)
			if err != nil {
				return err
			}
			for _, name := range args {
				if _, err := cat.Spec(name); err != nil {
					return usageError(cmd, "%s", session.AsError(err).Message)
				}
			}
			for _, name := range args {
				in, err := cat.Install(cmd.Context(), name, version, env.stderr)
				if err != nil {
					if errors.Is(err, agents.ErrNoNPM) {
						return cliError{err: err, msg: "npm is not installed",
							hint: "install Node.js and npm (Debian and Ubuntu: apt-get install nodejs npm), then run this again"}
					}
					return err
				}
				fmt.Fprintf(env.stdout, "%s %s\n", in.Name, in.Version)
			}
			return nil
		},
	}
	dirs.register(cmd)
	cmd.Flags().StringVar(&version, "version", "", "the npm version to install (default: the pinned one)")
	return cmd
}

// agentRow is one line of `atrium agents ls --json`.
type agentRow struct {
	Name      string `json:"name"`
	Package   string `json:"package"`
	Pinned    string `json:"pinned_version"`
	Installed bool   `json:"installed"`
	Version   string `json:"version,omitempty"`
	Current   bool   `json:"current,omitempty"`
	Path      string `json:"path,omitempty"`
	SizeBytes int64  `json:"size_bytes,omitempty"`
}

func newAgentsLsCmd(env *cliEnv) *cobra.Command {
	var dirs agentDirFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the known agents and their installed versions",
		Long: `List every known agent (built in or configured) with each installed version,
its path and size on disk. The version marked * is the one new agent processes
use; an agent with no version is not installed on this node.`,
		Example: `  atrium agents ls
  atrium agents ls --data /var/lib/atrium --json | jq -r '.[] | select(.installed) | .name'`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cat, err := dirs.catalog(cmd, env)
			if err != nil {
				return err
			}
			list, err := cat.List()
			if err != nil {
				return err
			}
			var rows []agentRow
			for _, name := range cat.Names() {
				s, _ := cat.Spec(name)
				base := agentRow{Name: name, Package: s.Package, Pinned: s.Version}
				n := 0
				for _, in := range list {
					if in.Name != name {
						continue
					}
					r := base
					r.Installed, r.Version, r.Current, r.Path = true, in.Version, in.Current, in.Dir
					r.SizeBytes, _ = agents.Size(in.Dir)
					rows = append(rows, r)
					n++
				}
				if n == 0 {
					rows = append(rows, base)
				}
			}
			if asJSON {
				return writeJSON(env.stdout, rows)
			}
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tPINNED\tSIZE\tPATH")
			for _, r := range rows {
				if !r.Installed {
					fmt.Fprintf(tw, "%s\t-\t%s\t-\tnot installed: atrium agents install %s\n", r.Name, r.Pinned, r.Name)
					continue
				}
				v := r.Version
				if r.Current {
					v += " *"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, v, r.Pinned, agents.FormatSize(r.SizeBytes), r.Path)
			}
			return tw.Flush()
		},
	}
	dirs.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

// checkAgents is doctor's line about the agents installed on this node.
// None installed is no failure: harness sessions need none.
func checkAgents(dataDir string, extra []agents.Spec) doctorCheck {
	c := doctorCheck{Name: "agents"}
	cat, err := newAgentCatalog(dataDir, extra)
	if err != nil {
		c.Detail, c.Fix = err.Error(), "correct the agents list of the configuration (docs/agents.md)"
		return c
	}
	var have []string
	for _, name := range cat.Names() {
		if in, err := cat.Lookup(name); err == nil {
			have = append(have, in.Name+" "+in.Version)
		}
	}
	c.OK = true
	if len(have) == 0 {
		c.Detail = "none installed: agent sessions need one (atrium agents install claude)"
		return c
	}
	c.Detail = "installed: " + strings.Join(have, ", ")
	return c
}
