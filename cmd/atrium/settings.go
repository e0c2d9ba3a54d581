package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
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
  harness=TEMPLATE|JSON    replace the harness from the next turn: a template
                          name, {"command":[…]} or {"agent":NAME}.
  agent=NAME              switch to another installed agent (atrium agents
                          ls); it starts at the next turn and is given the
                          conversation from the history.
  permission_mode=MODE    an agent session's permission mode: ask, auto-edit
                          or auto. It takes effect the next time the agent is
                          started (a running agent keeps its mode).
  turn_timeout=DURATION   how long the session's turns may run, e.g. 10m,
                          from the next turn; at most the server's
                          node.turn_timeout.
  memory_bytes=SIZE       the sandbox's memory limit, e.g. 512MiB (0: the
                          server's), at most sandbox.memory_bytes; applied
                          when the sandbox is next opened.
  pids=N                  the sandbox's process limit (0: the server's), at
                          most sandbox.pids.
  disk_bytes=SIZE         the size of the sandbox's workspace, e.g. 2GiB (0:
                          the server's), at least 16MiB and at most
                          sandbox.workspace_disk_bytes; applied when the
                          workspace's image is next mounted (a shrink below
                          the files it holds fails the sandbox's open).
  egress=JSON             the session's own egress allowlist, a JSON list
                          such as ["github.com","*.npmjs.org"], within the
                          server's sandbox.egress_permit.
  mcp_servers=JSON        the MCP servers given to an agent session's agent,
                          in ACP's shapes, e.g.
                          [{"name":"files","command":"/opt/mcp/files","args":[],"env":[]}]
                          or [{"name":"docs","type":"http","url":"https://…","headers":[]}]
                          (http and sse only to hosts the sandbox may reach);
                          @FILE reads the JSON from FILE; [] removes them.
  invoke_concurrency=N    how many invokes of the session may run at once
                          (0: the server's cap), at most the server's
                          quotas.invokes_per_session.
  setup=COMMAND           a shell command run in /workspace before a turn
                          when the sandbox is new or files were written,
                          e.g. 'pip install -r requirements.txt'; its
                          failure fails the turn. An empty value removes it.

Without --set it prints the title and the session's own settings. The
server refuses keys it does not know, naming them, and values beyond the
operator's limits, naming the limit.`,
		Example: `  atrium settings ID
  atrium settings ID --set title='release notes'
  atrium settings ID --set permission_mode=ask
  atrium settings ID --set turn_timeout=10m
  atrium settings ID --set memory_bytes=512MiB --set pids=256
  atrium settings ID --set disk_bytes=2GiB
  atrium settings ID --set setup='pip install -r requirements.txt'
  atrium settings ID --set mcp_servers=@mcp.json`,
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
				val, err := settingValue(k, v)
				if err != nil {
					return err
				}
				patch.Settings[k] = val
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
				printSettings(env, &s)
				return nil
			}
			s, err := c.PatchSession(cmd.Context(), id, patch)
			if err != nil {
				return explain(err, conn.server)
			}
			fmt.Fprintf(env.stdout, "title: %s\n", s.Title)
			for _, k := range []string{"harness", "agent", "memory_bytes", "pids", "disk_bytes", "egress", "mcp_servers", "setup", "invoke_concurrency"} {
				if _, ok := patch.Settings[k]; ok {
					printSettings(env, &s)
					break
				}
			}
			if m, ok := patch.Settings["permission_mode"]; ok {
				fmt.Fprintf(env.stdout, "permission_mode: %s (from the agent's next start)\n", m)
			}
			if d, ok := patch.Settings["turn_timeout"]; ok {
				fmt.Fprintf(env.stdout, "turn_timeout: %s (from the next turn)\n", d)
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&sets, "set", nil, "KEY=VALUE to change (repeatable): title, harness, agent, permission_mode, turn_timeout, memory_bytes, pids, disk_bytes, egress, mcp_servers, setup, invoke_concurrency")
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

// settingValue turns a --set value into the JSON value the server takes:
// a number for memory_bytes and disk_bytes (with a KiB/MiB/GiB suffix or
// none) and pids,
// a list for mcp_servers (JSON, or @FILE), a string otherwise.
func settingValue(k, v string) (any, error) {
	switch k {
	case "memory_bytes", "disk_bytes":
		n, err := parseSize(v)
		if err != nil {
			return nil, fmt.Errorf("--set %s=%s: %w", k, v, err)
		}
		return n, nil
	case "pids", "invoke_concurrency":
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--set %s=%s: want a number", k, v)
		}
		return n, nil
	case "harness":
		if strings.HasPrefix(strings.TrimSpace(v), "{") {
			var h json.RawMessage
			if err := json.Unmarshal([]byte(v), &h); err != nil {
				return nil, fmt.Errorf("--set harness: not JSON (%v); give a template name or {\"command\":[…]}", err)
			}
			return h, nil
		}
		return v, nil
	case "egress":
		var l []string
		if err := json.Unmarshal([]byte(v), &l); err != nil {
			return nil, fmt.Errorf("--set egress: want a JSON list such as [\"github.com\"] (%v)", err)
		}
		return l, nil
	case "mcp_servers":
		data := []byte(v)
		if name, ok := strings.CutPrefix(v, "@"); ok {
			var err error
			if data, err = os.ReadFile(name); err != nil {
				return nil, fmt.Errorf("--set mcp_servers=@%s: %w", name, err)
			}
		}
		var l json.RawMessage
		if err := json.Unmarshal(data, &l); err != nil {
			return nil, fmt.Errorf("--set mcp_servers: not JSON (%v); give a list such as [{\"name\":\"files\",\"command\":\"/opt/mcp/files\"}] or @FILE", err)
		}
		return l, nil
	}
	return v, nil
}

// parseSize parses a byte count with an optional KiB, MiB or GiB suffix
// (KB, MB and GB, and K, M, G, mean the same).
func parseSize(v string) (int64, error) {
	s := strings.TrimSpace(v)
	mult := int64(1)
units:
	for _, u := range []struct {
		suffixes []string
		mult     int64
	}{{[]string{"GiB", "GB", "G"}, 1 << 30}, {[]string{"MiB", "MB", "M"}, 1 << 20}, {[]string{"KiB", "KB", "K"}, 1 << 10}} {
		for _, suf := range u.suffixes {
			if t, ok := strings.CutSuffix(s, suf); ok {
				s, mult = strings.TrimSpace(t), u.mult
				break units
			}
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, errors.New("want a size such as 536870912, 512MiB or 2GiB")
	}
	return n * mult, nil
}

// printSettings prints the session's own settings, one per line.
func printSettings(env *cliEnv, s *session.Session) {
	if len(s.Egress) > 0 {
		fmt.Fprintf(env.stdout, "egress: %s\n", strings.Join(s.Egress, ", "))
	}
	st := s.Settings
	if st == nil {
		return
	}
	if h := st.Harness; h != nil {
		what := "template " + h.Template
		if len(h.Command) > 0 {
			b, _ := json.Marshal(h.Command)
			what = "command " + string(b)
		}
		if h.Stdin != "" {
			what += " (stdin " + h.Stdin + ")"
		}
		fmt.Fprintf(env.stdout, "harness: %s\n", what)
	}
	if st.Agent != "" {
		fmt.Fprintf(env.stdout, "agent: %s\n", st.Agent)
	}
	if st.PermissionMode != "" {
		fmt.Fprintf(env.stdout, "permission_mode: %s\n", st.PermissionMode)
	}
	if st.TurnTimeout != "" {
		fmt.Fprintf(env.stdout, "turn_timeout: %s\n", st.TurnTimeout)
	}
	if st.MemoryBytes > 0 {
		fmt.Fprintf(env.stdout, "memory_bytes: %d\n", st.MemoryBytes)
	}
	if st.Pids > 0 {
		fmt.Fprintf(env.stdout, "pids: %d\n", st.Pids)
	}
	if st.DiskBytes > 0 {
		fmt.Fprintf(env.stdout, "disk_bytes: %d\n", st.DiskBytes)
	}
	for _, m := range st.MCPServers {
		where := m.Command
		if m.URL != "" {
			where = m.URL
		}
		fmt.Fprintf(env.stdout, "mcp_server: %s (%s) %s\n", m.Name, m.ServerType(), where)
	}
	if st.InvokeConcurrency > 0 {
		fmt.Fprintf(env.stdout, "invoke_concurrency: %d\n", st.InvokeConcurrency)
	}
	if st.Setup != "" {
		fmt.Fprintf(env.stdout, "setup: %s\n", st.Setup)
	}
}
