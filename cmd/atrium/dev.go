package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

// DevDrainGrace is how long `atrium dev` lets running turns finish on Ctrl-C
// (unless a configuration sets node.drain_grace).
const DevDrainGrace = 2 * time.Second

func newDevCmd(env *cliEnv) *cobra.Command {
	var (
		path                           string
		listen, data                   string
		hibernate, turnTimeout, cancel time.Duration
		drain                          time.Duration
		unsafe, verbose                bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run gateway, node, embedded NATS and local sandboxes in one process",
		Long: `Run a complete single-machine Atrium: the gateway (REST, SSE, WebSocket), a node
hosting the session actors, an embedded NATS server (JetStream stored under the
data dir) between them, and local bubblewrap sandboxes.

Authentication is the dev identity: any client on this machine may act as any
user by sending 'Authorization: Bearer dev:<user>'. It is accepted from loopback
addresses only. Do not expose a dev server to a network. If a configuration
(--config, or ATRIUM_* variables such as ATRIUM_AUTH_MODE=oidc) chooses another
auth.mode, that is used instead and the dev identity is off.

A configuration may also give roles and an external NATS cluster (nats.urls):
deploy/cluster/ runs its gateways this way, with the dev identity, next to
nodes run by 'atrium serve' (see docs/scale-out.md).

Ctrl-C stops it cleanly: running turns get --drain-grace to finish, then are
cancelled and recorded, every acknowledged event is on disk, files are closed.`,
		Example: `  atrium dev
  atrium dev --listen 127.0.0.1:9000 --data /var/tmp/atrium --hibernate-after 1m
  atrium dev --unsafe-no-sandbox   # no bubblewrap: harnesses run unisolated
  atrium dev --config oidc.yaml    # log in through an OIDC provider instead
  atrium dev --config deploy/cluster/gateway-1.yaml   # a dev gateway of a local cluster`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := config.Load(path, env.getenv)
			if err != nil {
				return err
			}
			flags := cmd.Flags()
			if flags.Changed("listen") {
				f.Listen = listen
			}
			if flags.Changed("data") {
				f.DataDir = data
			}
			if flags.Changed("hibernate-after") {
				f.Node.HibernateAfter = hibernate
			}
			if flags.Changed("turn-timeout") {
				f.Node.TurnTimeout = turnTimeout
			}
			if flags.Changed("cancel-grace") {
				f.Node.CancelGrace = cancel
			}
			// Ctrl-C on a dev server should not wait long for turns: its
			// short drain applies unless a file or the environment set one.
			if flags.Changed("drain-grace") || path == "" && env.getenv("ATRIUM_NODE_DRAIN_GRACE") == "" {
				f.Node.DrainGrace = drain
			}
			if unsafe {
				f.Sandbox.UnsafeNoSandbox = true
			}
			if f.Auth.Mode == "" {
				f.Auth.Mode = config.AuthDev
			}
			if err := f.Validate(true); err != nil {
				return fmt.Errorf("configuration is not valid:\n%w", err)
			}
			cfg, err := serverConfig(f, env.stderr, env.getenv)
			if err != nil {
				return err
			}
			// The browser's sign-in suggests the user the CLI acts as.
			cfg.DevUser = devUser(env.getenv)
			// A dev server's workspace quota is opt-in: its loop mounts
			// outlive a dev server killed with SIGKILL (then its data dir
			// cannot be removed until they are unmounted).
			if f.Sandbox.WorkspaceDiskBytes == 0 {
				cfg.Sandbox.WorkspaceDiskBytes, cfg.Sandbox.WorkspaceDiskAuto = 0, false
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: level}))
			return runServer(cmd.Context(), env, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&path, "config", "c", "", "configuration file (YAML, see docs/configuration.md); flags given here override it")
	f.StringVar(&listen, "listen", server.DefaultListen, "address of the HTTP server (REST, SSE, WebSocket, web UI)")
	f.StringVar(&data, "data", server.DefaultDataDir, "directory for session histories, workspaces and NATS state")
	f.DurationVar(&hibernate, "hibernate-after", server.DefaultHibernateAfter, "idle time after which a session hibernates (closes its files and stops its actor)")
	f.DurationVar(&turnTimeout, "turn-timeout", server.DefaultTurnTimeout, "longest a turn may run before it is stopped with status timeout")
	f.DurationVar(&cancel, "cancel-grace", config.DefaultCancelGrace, "time a cancelled turn gets between SIGTERM and SIGKILL")
	f.DurationVar(&drain, "drain-grace", DevDrainGrace, "time running turns get to finish on Ctrl-C before they are cancelled (node.drain_grace)")
	f.BoolVar(&unsafe, "unsafe-no-sandbox", false, "run harnesses without bubblewrap isolation (only if you trust every prompt)")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}
