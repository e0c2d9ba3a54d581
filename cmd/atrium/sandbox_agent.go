package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/sandboxagent"
)

// agentTokenEnv holds the sandbox agent's token when --token-file is not
// given.
const agentTokenEnv = "ATRIUM_AGENT_TOKEN"

// defaultAgentDir is where the agent keeps its sandbox by default.
const defaultAgentDir = "/var/lib/atrium-agent"

// agentFlags are the flags of `atrium sandbox-agent`.
type agentFlags struct {
	listen, tokenFile, dir string
	tlsCert, tlsKey        string
	upstreamProxy          string
	unsafe, verbose        bool
}

func newSandboxAgentCmd(env *cliEnv) *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:     "sandbox-agent --listen ADDR",
		GroupID: "server",
		Short:   "Run the sandbox agent inside a VM, for an Atrium node's remote sandboxes",
		Long: `Run the daemon that turns a VM (a Firecracker microVM, a Kubernetes pod, a cloud VM...)
into an Atrium sandbox. An Atrium node with the remote compute provider starts the VM
through its provisioning hook, then drives this agent over HTTP and WebSocket: it runs
the session's harness commands, streams their input and output, and moves /workspace
to and from object storage through presigned URLs (the VM never holds storage
credentials).

Every call must carry the sandbox's token ('Authorization: Bearer <token>'), unique to
this VM: give it in a file (--token-file) or in the environment (` + agentTokenEnv + `).
The agent refuses to start without one. Calls from a node whose ownership fence is
older than the newest seen are refused, so a node that lost a session cannot touch
its sandbox.

Commands run under bubblewrap inside the VM, as with 'atrium dev'. When the VM itself
is the isolation boundary (one VM per session, nothing else on it), pass
--unsafe-no-sandbox to run them directly.

The agent speaks plain HTTP unless given --tls-cert and --tls-key: keep it on a private
network between the node and the VM, or use TLS.

See docs/compute.md for the API and worked provisioning hooks.`,
		Example: `  # in the VM, with the token the provisioning hook generated:
  ATRIUM_AGENT_TOKEN=$(cat /run/atrium/token) atrium sandbox-agent --listen 0.0.0.0:7070

  # the VM is the boundary, the token in a file, TLS on:
  atrium sandbox-agent --listen :7070 --token-file /etc/atrium/agent-token \
      --unsafe-no-sandbox --tls-cert agent.crt --tls-key agent.key

  # check it from the node:
  curl http://10.0.0.12:7070/healthz`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSandboxAgent(cmd.Context(), env, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "", "address to serve on, host:port (required)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the sandbox's token (default: $"+agentTokenEnv+")")
	fl.StringVar(&f.dir, "dir", defaultAgentDir, "directory of the sandbox's state; its workspace is DIR/<session>/workspace, seen as /workspace by commands under bubblewrap")
	fl.BoolVar(&f.unsafe, "unsafe-no-sandbox", false, "run commands directly in the VM, without bubblewrap (when the VM is the isolation boundary)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "serve HTTPS with this certificate (PEM; with --tls-key)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "private key of --tls-cert (PEM)")
	fl.StringVar(&f.upstreamProxy, "upstream-proxy", "", "HTTP proxy (http://host:port) that workspace transfers and the sandboxes' egress go through: a VM's only way out (atrium vmhost sets it)")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "debug logging")
	return cmd
}

func runSandboxAgent(ctx context.Context, env *cliEnv, f agentFlags) error {
	if f.listen == "" {
		return errors.New("sandbox-agent: --listen is required, e.g. --listen 0.0.0.0:7070")
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return errors.New("sandbox-agent: --tls-cert and --tls-key go together")
	}
	token, err := agentToken(env, f.tokenFile)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: level}))

	var upstream *url.URL
	lcfg := local.Config{Dir: f.dir, Unsafe: f.unsafe, Logger: log}
	if f.upstreamProxy != "" {
		u, err := url.Parse(f.upstreamProxy)
		if err != nil || u.Scheme != "http" || u.Host == "" || u.Port() == "" {
			return fmt.Errorf("sandbox-agent: --upstream-proxy %q: want http://host:port", f.upstreamProxy)
		}
		upstream = u
		lcfg.EgressDial = sandboxagent.UpstreamDial(u)
	}
	lp, err := local.New(lcfg)
	if err != nil {
		return fmt.Errorf("sandbox-agent: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		if err := lp.Close(cctx); err != nil {
			log.Warn("close sandboxes", "err", err)
		}
	}()
	srv, err := sandboxagent.New(sandboxagent.Config{
		Token: token, Provider: lp, Dir: f.dir, Version: buildVersion(), UpstreamProxy: upstream, Logger: log,
	})
	if err != nil {
		return fmt.Errorf("sandbox-agent: %w", err)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("sandbox-agent: listen on %s: %w", f.listen, err)
	}
	scheme := "http"
	if f.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			ln.Close()
			return fmt.Errorf("sandbox-agent: load TLS certificate: %w", err)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		scheme = "https"
	}
	log.Info("sandbox agent listening", "url", scheme+"://"+ln.Addr().String(), "dir", f.dir,
		"isolation", map[bool]string{true: "none (--unsafe-no-sandbox)", false: "bubblewrap"}[f.unsafe])
	if err := srv.Serve(ctx, ln); err != nil {
		return fmt.Errorf("sandbox-agent: %w", err)
	}
	log.Info("sandbox agent stopped")
	return nil
}

// agentToken reads the sandbox's token from file, or from the environment.
func agentToken(env *cliEnv, file string) (string, error) {
	token, from := strings.TrimSpace(env.getenv(agentTokenEnv)), "$"+agentTokenEnv
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("sandbox-agent: read token: %w", err)
		}
		token, from = strings.TrimSpace(string(b)), file
	}
	switch {
	case token == "" && file == "":
		return "", fmt.Errorf("sandbox-agent: no token: pass --token-file FILE or set %s to the sandbox's token "+
			"(the provisioning hook generates one per VM and returns it to the node)", agentTokenEnv)
	case token == "":
		return "", fmt.Errorf("sandbox-agent: token file %s is empty", file)
	case len(token) < 16:
		return "", fmt.Errorf("sandbox-agent: the token in %s is shorter than 16 characters: generate one with `openssl rand -hex 24`", from)
	}
	return token, nil
}

// buildVersion is the module version the binary was built from.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return sandboxagent.DefaultVersion
}
