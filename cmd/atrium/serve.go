package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

func newServeCmd(env *cliEnv) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run Atrium from a configuration file, with authentication",
		Long: `Run Atrium as configured by a YAML file (and ATRIUM_* environment overrides; see
docs/configuration.md).

By default one process runs everything: the gateway, a node, an embedded NATS
server and the configured sandboxes and object store. To scale out, run several
processes sharing an external NATS cluster (nats.urls) and an S3 object store, each
with its roles: 'roles: [gateway]' serves clients (REST, SSE, WebSocket, web UI)
and holds no session state; 'roles: [node]' hosts session actors and sandboxes and
serves only /healthz, /readyz and /metrics. See docs/scale-out.md.

Unlike 'atrium dev', serve never runs without authentication: the file must choose
auth.mode oidc (an OpenID Connect provider; see docs/auth.md) or tokens (API tokens
only; make the first one on this machine with 'atrium token create --bootstrap',
which reads the key the server keeps in its data directory). Check a file first
with 'atrium config check FILE'.

SIGTERM or Ctrl-C stops it gracefully: a gateway closes WebSockets with 1012
"reconnect" so clients resume on another gateway; a node lets running turns finish
for node.drain_grace, then cancels them and hands its sessions off.`,
		Example: `  atrium serve --config /etc/atrium/atrium.yaml
  ATRIUM_AUTH_COOKIE_KEY=$(cat /run/secrets/cookie_key) atrium serve --config atrium.yaml
  ATRIUM_AUTH_MODE=tokens ATRIUM_LISTEN=0.0.0.0:7080 atrium serve
  ATRIUM_ROLES=node ATRIUM_NODE_ID=node-a ATRIUM_NATS_URLS=nats://nats:4222 atrium serve -c atrium.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := config.Load(path, env.getenv)
			if err != nil {
				return err
			}
			if err := f.Validate(false); err != nil {
				return fmt.Errorf("configuration is not valid:\n%w", err)
			}
			cfg, err := serverConfig(f, env.stderr, env.getenv)
			if err != nil {
				return err
			}
			return runServer(cmd.Context(), env, cfg)
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "configuration file (YAML); ATRIUM_* variables override it")
	return cmd
}

// serverConfig turns a validated configuration into the server's.
func serverConfig(f *config.File, logTo io.Writer, getenv func(string) string) (server.Config, error) {
	cfg := server.Config{
		Roles: f.Roles,
		NATS: server.NATS{
			URLs: f.NATS.URLs, CredsFile: f.NATS.Creds, NKeyFile: f.NATS.NKey, User: f.NATS.User, Password: f.NATS.Password,
			CAFile: f.NATS.TLS.CA, CertFile: f.NATS.TLS.Cert, KeyFile: f.NATS.TLS.Key,
			Replicas: f.NATS.Replicas, Name: f.NATS.Name,
		},
		NodeID:             f.Node.ID,
		LeaseTTL:           f.Node.LeaseTTL,
		DrainGrace:         f.Node.DrainGrace,
		CheckpointInterval: f.Node.CheckpointInterval,
		Version:            buildVersion(),
		Listen:             f.Listen,
		DataDir:            f.DataDir,
		HibernateAfter:     f.Node.HibernateAfter,
		TurnTimeout:        f.Node.TurnTimeout,
		CancelGrace:        f.Node.CancelGrace,
		UnsafeNoSandbox:    f.Sandbox.UnsafeNoSandbox,
		AuthMode:           f.Auth.Mode,
		PublicURL:          f.PublicURL,
		AllowedOrigins:     f.AllowedOrigins,
		HistoryCacheBytes:  f.HistoryCacheBytes,
		Agents:             f.Agents,
		AgentMode:          f.AgentMode,
		Logger:             newLogger(logTo, f.Log.Format, f.Log.Level),
		AccessLog:          f.Log.Access == "on",
		Sandbox: server.Sandbox{
			Provider:     f.Sandbox.Provider,
			MemoryBytes:  f.Sandbox.MemoryBytes,
			Pids:         f.Sandbox.Pids,
			CPUs:         f.Sandbox.CPUs,
			HostUID:      f.Sandbox.HostUID,
			TmpBytes:     f.Sandbox.TmpBytes,
			Egress:       f.Sandbox.Egress,
			EgressPermit: f.Sandbox.EgressPermit,
			SleepAfter:   f.Sandbox.SleepAfter,
			MaxLifetime:  f.Sandbox.MaxLifetime,
			SaveInterval: f.Sandbox.SaveInterval,
			MaxFileBytes: f.Sandbox.MaxFileBytes, WorkspaceQuotaBytes: f.Sandbox.WorkspaceQuotaBytes,
			WorkspaceDiskBytes: f.Sandbox.WorkspaceDiskBytes,
		},
		Storage: server.Storage{Type: f.Storage.Type, Dir: f.Storage.Dir, TenantQuotaBytes: f.Storage.TenantQuotaBytes,
			GCInterval: f.Storage.GCInterval, WorkspaceHistory: f.Storage.WorkspaceHistory, GCGrace: f.Storage.GCGrace},
		Tracing: server.Tracing{
			Endpoint: f.Tracing.OTLPEndpoint, Protocol: f.Tracing.Protocol,
			SampleRatio: f.Tracing.SampleRatio, Insecure: f.Tracing.Insecure,
		},
	}
	sandboxDefaults(&cfg.Sandbox, f.Sandbox.HostUID, f.Sandbox.WorkspaceDiskBytes)
	if f.Storage.Type == server.StorageS3 {
		s3 := f.Storage.S3
		cfg.Storage.S3 = blob.S3Config{
			Endpoint: s3.Endpoint, Bucket: s3.Bucket, Prefix: s3.Prefix, Region: s3.Region,
			AccessKey: s3.AccessKey, SecretKey: s3.SecretKey, Secure: !s3.Insecure,
		}
	}
	// Validate has parsed them already.
	proxies, err := auth.ParseTrustedProxies(f.TrustedProxies)
	if err != nil {
		return cfg, fmt.Errorf("trusted_proxies: %w", err)
	}
	cfg.TrustedProxies = proxies
	if f.Sandbox.Provider == server.ProviderRemote {
		hookLog := cfg.Logger.With("component", "sandbox-hook")
		if r := f.Sandbox.Remote; len(r.VMHosts) > 0 {
			hosts := &remote.VMHosts{Logger: hookLog}
			for i, h := range r.VMHosts {
				b, err := os.ReadFile(h.TokenFile)
				if err != nil {
					return cfg, fmt.Errorf("sandbox.remote.vm_hosts[%d].token_file: %w", i, err)
				}
				tok := strings.TrimSpace(string(b))
				if tok == "" {
					return cfg, fmt.Errorf("sandbox.remote.vm_hosts[%d].token_file: %s is empty", i, h.TokenFile)
				}
				hosts.Hosts = append(hosts.Hosts, remote.VMHost{URL: h.URL, Token: tok})
			}
			cfg.Sandbox.Hook = hosts
		} else if r.URL != "" {
			cfg.Sandbox.Hook = &remote.HTTPHook{URL: r.URL, Logger: hookLog}
		} else {
			cfg.Sandbox.Hook = &remote.CommandHook{Create: r.Create, Destroy: r.Delete, Logger: hookLog}
		}
	}
	cfg.TokenTTL, cfg.TokenLoginMaxAge = f.Auth.TokenTTL, f.Auth.TokenLoginMaxAge
	switch keys := getenv("ATRIUM_SECRETS_KEYS"); {
	case keys != "" && f.Secrets.KeyFile != "":
		return cfg, fmt.Errorf("secrets: set secrets.key_file or ATRIUM_SECRETS_KEYS, not both")
	case keys != "":
		if cfg.SecretKeys, err = session.ParseSecretKeyring(keys); err != nil {
			return cfg, fmt.Errorf("ATRIUM_SECRETS_KEYS: %w", err)
		}
	case f.Secrets.KeyFile != "":
		if cfg.SecretKeys, err = server.ReadSecretKeys(f.Secrets.KeyFile); err != nil {
			return cfg, fmt.Errorf("secrets.key_file: %w", err)
		}
	}
	if f.Auth.Mode == config.AuthOIDC {
		key, err := f.CookieKeyBytes()
		if err != nil {
			return cfg, fmt.Errorf("auth.cookie_key: %w", err)
		}
		o := f.Auth.OIDC
		cfg.OIDC = auth.OIDCConfig{
			Issuer: o.Issuer, ClientID: o.ClientID, ClientSecret: o.ClientSecret, Scopes: o.Scopes,
			Audience: o.Audience, UserClaim: o.UserClaim, TenantClaim: o.TenantClaim, DefaultTenant: o.DefaultTenant,
			GroupsClaim: o.GroupsClaim, AdminGroup: o.AdminGroup, OperatorGroup: o.OperatorGroup, CookieKey: key, CookieTTL: f.Auth.CookieTTL,
			CLIClientID: o.CLIClientID, CLIClientSecret: o.CLIClientSecret,
		}
	}
	ch, err := f.Channels.Gateway(f.PublicURL, getenv)
	if err != nil {
		return cfg, err
	}
	cfg.Channels = ch
	if cfg.Tasks, err = f.Tasks.Gateway(getenv); err != nil { // repository tasks (H5)
		return cfg, err
	}
	cfg.Quotas = f.Quotas.Gateway() // invoke caps and tenant quotas (H3)
	cfg.Automation = f.Automation.Gateway()
	if f.Models.Enabled() && f.HasRole(config.RoleNode) { // the model gateway (docs/models.md)
		if cfg.Models.Providers, cfg.Models.Budgets, err = f.Models.Gateway(getenv); err != nil {
			return cfg, err
		}
		cfg.Models.MaxBody = f.Models.MaxBodyBytes
	}
	return cfg, nil
}

func newLogger(w io.Writer, format, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// shutdownMargin is how long a stopping process may take beyond the node's
// drain grace (checkpoints, workspace saves, handing sessions off).
const shutdownMargin = 30 * time.Second

// runServer starts the server, prints how to reach it, and stops it cleanly
// when ctx ends.
func runServer(ctx context.Context, env *cliEnv, cfg server.Config) error {
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		return err
	}
	url := srv.URL()
	switch {
	case !srv.IsGateway():
		fmt.Fprintf(env.stdout, "\nAtrium node %s is running (roles: %s)\n  data:   %s\n  health: %s/healthz, %s/readyz, %s/metrics\n\nPress Ctrl-C to stop (it drains: turns get %v to finish).\n",
			srv.NodeID(), strings.Join(srv.Roles(), ", "), srv.DataDir(), url, url, url, drainGrace(cfg))
	case srv.AuthMode() == server.AuthDev:
		fmt.Fprint(env.stdout, devBanner(url, srv.DataDir(), devUser(env.getenv), selfCommand()))
	case srv.AuthMode() == server.AuthOIDC:
		fmt.Fprintf(env.stdout, "\nAtrium is running at %s (public URL %s)\n  data:  %s\n  login: %s/auth/login (OIDC %s)\n  CLI:   atrium login --server %s\n\nPress Ctrl-C to stop.\n",
			url, srv.PublicURL(), srv.DataDir(), srv.PublicURL(), cfg.OIDC.Issuer, srv.PublicURL())
	default:
		fmt.Fprintf(env.stdout, "\nAtrium is running at %s (API tokens only)\n  data:  %s\n\n"+
			"  First token (on this machine, as a user who can read the data dir):\n"+
			"    %s token create --bootstrap --data %s --server %s --user admin --name admin-cli\n"+
			"  (see docs/auth.md, \"API tokens only\")\n\nPress Ctrl-C to stop.\n",
			url, srv.DataDir(), selfCommand(), shellQuote(srv.DataDir()), localURL(url))
	}
	if srv.IsGateway() && srv.IsNode() {
		// One process: nothing to say about roles.
	} else if srv.IsGateway() {
		fmt.Fprintf(env.stdout, "  roles: gateway only (node id %s); sessions run on the cluster's nodes\n", srv.NodeID())
	}
	if srv.IsNode() {
		if srv.Unsafe() {
			fmt.Fprintln(env.stdout, "\n  WARNING: unsafe_no_sandbox: harnesses run WITHOUT isolation on this machine.")
		} else if _, err := exec.LookPath("bwrap"); err != nil && cfg.Sandbox.Provider != server.ProviderRemote {
			fmt.Fprintln(env.stdout, "\n  WARNING: bubblewrap (bwrap) is not installed, so turns will fail until you install it:\n"+
				"    apt-get install bubblewrap    (or set sandbox.unsafe_no_sandbox / --unsafe-no-sandbox to run harnesses without isolation)")
		}
	}
	<-ctx.Done()
	if srv.IsNode() {
		fmt.Fprintf(env.stderr, "shutting down: draining (turns get up to %v to finish), handing sessions off, closing files…\n", drainGrace(cfg))
	} else {
		fmt.Fprintln(env.stderr, "shutting down: closing WebSockets with \"reconnect\" so clients resume elsewhere…")
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drainGrace(cfg)+shutdownMargin)
	defer cancel()
	if err := srv.Close(shutdownCtx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	fmt.Fprintln(env.stderr, "stopped cleanly")
	return nil
}

// drainGrace is the node's drain grace of cfg.
func drainGrace(cfg server.Config) time.Duration {
	if cfg.DrainGrace > 0 {
		return cfg.DrainGrace
	}
	return config.DefaultDrainGrace
}

// devBanner is what `atrium dev` prints when it is ready: where it is, and
// commands that work as they are pasted, as the dev user the CLI acts as by
// default (devUser), so that the browser and the CLI see the same sessions.
func devBanner(url, dataDir, user, cli string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nAtrium dev server is running at %s\n  data:  %s\n\n", url, dataDir)
	b.WriteString("  DEV AUTHENTICATION IS ON: any local client can act as any user with\n" +
		"  'Authorization: Bearer dev:<user>' (loopback only). Do not expose this server.\n\n")
	fmt.Fprintf(&b, "  Browser, signed in as %s (the user the CLI acts as on this machine):\n    %s/auth/dev?%s\n\n",
		user, url, neturl.Values{"user": {user}}.Encode())
	b.WriteString("Try it (in another terminal, in this directory):\n")
	if url != DefaultServer {
		fmt.Fprintf(&b, "  export %s=%s\n", envServer, url)
	}
	fmt.Fprintf(&b, "  ID=$(%s new --title hello) && %s send \"$ID\" 'echo hello from the sandbox' --wait\n", cli, cli)
	fmt.Fprintf(&b, "  curl -s -H %s %s/v1/sessions\n", shellQuote("Authorization: Bearer dev:"+user), url)
	b.WriteString("\nPress Ctrl-C to stop.\n")
	return b.String()
}

// selfCommand is how a person in the server's working directory runs this
// binary: the path it was started by when that has a slash (./bin/atrium),
// else "atrium" (found on PATH).
func selfCommand() string {
	if p := os.Args[0]; strings.Contains(p, "/") {
		return shellQuote(p)
	}
	return "atrium"
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// localURL is url with an unspecified host (0.0.0.0, [::]) replaced by
// 127.0.0.1, for commands run on the server's machine.
func localURL(url string) string {
	u, err := neturl.Parse(url)
	if err != nil {
		return url
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		u.Host = net.JoinHostPort("127.0.0.1", u.Port())
	}
	return u.String()
}
