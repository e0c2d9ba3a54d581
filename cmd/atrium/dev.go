package main

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

func newDevCmd(env *cliEnv) *cobra.Command {
	cfg := server.Config{}
	var verbose bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run gateway, node, embedded NATS and local sandboxes in one process",
		Long: `Run a complete single-machine Atrium: the gateway (REST, SSE, WebSocket), a node
hosting the session actors, an embedded NATS server (JetStream stored under the
data dir) between them, and local bubblewrap sandboxes.

Authentication is the dev identity: any client on this machine may act as any
user by sending 'Authorization: Bearer dev:<user>'. It is accepted from loopback
addresses only. Do not expose a dev server to a network.

Ctrl-C stops it cleanly: running turns are cancelled and recorded, every
acknowledged event is on disk, files are closed.`,
		Example: `  atrium dev
  atrium dev --listen 127.0.0.1:9000 --data /var/tmp/atrium --hibernate-after 1m
  atrium dev --unsafe-no-sandbox   # no bubblewrap: harnesses run unisolated`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			cfg.Logger = slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: level}))
			return runDev(cmd.Context(), env, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", server.DefaultListen, "address of the HTTP server (REST, SSE, WebSocket, web UI)")
	f.StringVar(&cfg.DataDir, "data", server.DefaultDataDir, "directory for session histories, workspaces and NATS state")
	f.DurationVar(&cfg.HibernateAfter, "hibernate-after", server.DefaultHibernateAfter, "idle time after which a session hibernates (closes its files and stops its actor)")
	f.DurationVar(&cfg.TurnTimeout, "turn-timeout", server.DefaultTurnTimeout, "longest a turn may run before it is stopped with status timeout")
	f.DurationVar(&cfg.CancelGrace, "cancel-grace", 5*time.Second, "time a cancelled turn gets between SIGTERM and SIGKILL")
	f.BoolVar(&cfg.UnsafeNoSandbox, "unsafe-no-sandbox", false, "run harnesses without bubblewrap isolation (only if you trust every prompt)")
	f.BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	return cmd
}

func runDev(ctx context.Context, env *cliEnv, cfg server.Config) error {
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		return err
	}
	url := srv.URL()
	fmt.Fprintf(env.stdout, `
Atrium dev server is running at %s
  data:  %s

  DEV AUTHENTICATION IS ON: any local client can act as any user with
  'Authorization: Bearer dev:<user>' (loopback only). Do not expose this server.
  Browser: %s/auth/dev?user=$USER

Try it (in another terminal):
  curl -s -X POST -H 'Authorization: Bearer dev:alice' %s/v1/sessions -d '{"title":"hello"}'
  ./bin/atrium new --title hello && ./bin/atrium send <ID> 'echo hello from the sandbox' --wait

Press Ctrl-C to stop.
`, url, srv.DataDir(), url, url)
	if srv.Unsafe() {
		fmt.Fprintln(env.stdout, "\n  WARNING: --unsafe-no-sandbox: harnesses run WITHOUT isolation on this machine.")
	} else if _, err := exec.LookPath("bwrap"); err != nil {
		fmt.Fprintln(env.stdout, "\n  WARNING: bubblewrap (bwrap) is not installed, so turns will fail until you install it:\n"+
			"    apt-get install bubblewrap    (or restart with --unsafe-no-sandbox to run harnesses without isolation)")
	}
	<-ctx.Done()
	fmt.Fprintln(env.stderr, "shutting down: cancelling running turns and closing files…")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := srv.Close(shutdownCtx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	fmt.Fprintln(env.stderr, "stopped cleanly")
	return nil
}
