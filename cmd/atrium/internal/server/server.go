// Package server wires Atrium's parts into one in-process deployment: an
// embedded nats-server, a node (package actor) with SQLite histories and local
// sandboxes, and a gateway serving HTTP. `atrium dev`, `atrium bench` and the
// end-to-end tests use it, so they all run the same code as production: every
// gateway↔node message goes through NATS.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// Defaults of Config.
const (
	DefaultListen         = "127.0.0.1:7080"
	DefaultDataDir        = ".atrium"
	DefaultHibernateAfter = 30 * time.Second
	DefaultTurnTimeout    = 30 * time.Minute
)

// Authentication modes of Config.AuthMode.
const (
	AuthDev    = "dev"
	AuthOIDC   = "oidc"
	AuthTokens = "tokens"
)

// Config configures a single-process deployment.
type Config struct {
	// Listen is the HTTP address; "127.0.0.1:0" picks a free port.
	Listen string
	// DataDir holds history/, sandboxes/ and nats/.
	DataDir string
	// HibernateAfter is the idle time before a session hibernates.
	HibernateAfter time.Duration
	// TurnTimeout bounds a turn.
	TurnTimeout time.Duration
	// CancelGrace is the time between SIGTERM and SIGKILL on cancel; zero
	// means the node's default.
	CancelGrace time.Duration
	// UnsafeNoSandbox runs harnesses without bubblewrap.
	UnsafeNoSandbox bool
	// AuthMode says how callers are identified: AuthDev (the default: the
	// loopback-only dev identity), AuthOIDC (OIDC, plus API tokens) or
	// AuthTokens (API tokens only).
	AuthMode string
	// OIDC configures AuthOIDC. Its RedirectURL defaults to PublicURL +
	// "/auth/callback"; its Audit and Logger are set by Start.
	OIDC auth.OIDCConfig
	// PublicURL is the URL browsers reach the gateway at; default the
	// listener's http URL.
	PublicURL string
	// AllowedOrigins lists extra browser origins (see gateway.Config).
	AllowedOrigins []string
	// Logger receives operational logs; nil discards them.
	Logger *slog.Logger
}

// Server is a running single-process deployment.
type Server struct {
	cfg  Config
	ns   *natsserver.Server
	nc   *nats.Conn
	prov *local.Provider
	host *actor.Host
	oidc *auth.OIDC
	gw   *gateway.Server
	http *http.Server
	ln   net.Listener

	serveDone chan error
	closeOnce sync.Once
	closeErr  error
}

// Start starts NATS, the node and the gateway, and listens on cfg.Listen.
// On error everything started is stopped again.
func Start(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.DataDir == "" {
		cfg.DataDir = DefaultDataDir
	}
	if cfg.HibernateAfter == 0 {
		cfg.HibernateAfter = DefaultHibernateAfter
	}
	if cfg.TurnTimeout == 0 {
		cfg.TurnTimeout = DefaultTurnTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HibernateAfter < 0 || cfg.TurnTimeout < 0 {
		return nil, errors.New("durations must be positive")
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	cfg.DataDir = dir
	for _, d := range []string{dir, filepath.Join(dir, "history"), filepath.Join(dir, "sandboxes"), filepath.Join(dir, "nats")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
	}

	s := &Server{cfg: cfg, serveDone: make(chan error, 1)}
	defer func() {
		if err != nil {
			s.Close(context.WithoutCancel(ctx))
		}
	}()

	s.ns, err = natsserver.NewServer(&natsserver.Options{
		ServerName: "atrium-dev",
		DontListen: true,
		JetStream:  true,
		StoreDir:   filepath.Join(dir, "nats"),
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return nil, fmt.Errorf("configure embedded nats: %w", err)
	}
	s.ns.Start()
	if !s.ns.ReadyForConnections(10 * time.Second) {
		return nil, errors.New("embedded nats did not become ready within 10s")
	}
	s.nc, err = nats.Connect("", nats.InProcessServer(s.ns), nats.Name("atrium-dev"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}

	s.prov, err = local.New(local.Config{
		Dir:    filepath.Join(dir, "sandboxes"),
		Unsafe: cfg.UnsafeNoSandbox,
		Logger: cfg.Logger.With("component", "sandbox"),
	})
	if err != nil {
		return nil, fmt.Errorf("local sandboxes: %w", err)
	}

	s.host, err = actor.New(actor.Config{
		NATS:           s.nc,
		Histories:      actor.HistoriesOf(&sqlite.Dir{Path: filepath.Join(dir, "history"), Logger: cfg.Logger}),
		Provider:       s.prov,
		NodeID:         "dev",
		HibernateAfter: cfg.HibernateAfter,
		TurnTimeout:    cfg.TurnTimeout,
		CancelGrace:    cfg.CancelGrace,
		Logger:         cfg.Logger.With("component", "node"),
	})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := s.host.Start(ctx); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}

	s.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (is another atrium running? pick another address with --listen)", cfg.Listen, err)
	}
	if cfg.PublicURL == "" {
		cfg.PublicURL = s.URL()
	}
	cfg.PublicURL = strings.TrimSuffix(cfg.PublicURL, "/")
	s.cfg.PublicURL = cfg.PublicURL

	auditLog, err := audit.New(audit.Config{NATS: s.nc})
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	var authn auth.Authenticator
	switch cfg.AuthMode {
	case "", AuthDev:
		authn = auth.Chain(&auth.Dev{})
	case AuthTokens:
		authn = auth.Chain()
	case AuthOIDC:
		oc := cfg.OIDC
		if oc.RedirectURL == "" {
			oc.RedirectURL = cfg.PublicURL + "/auth/callback"
		}
		oc.Audit = auditLog
		oc.Logger = cfg.Logger.With("component", "oidc")
		// The provider's keys are refreshed for as long as the server
		// runs, so discovery gets a context that outlives start-up.
		s.oidc, err = auth.NewOIDC(context.WithoutCancel(ctx), oc)
		if err != nil {
			return nil, err
		}
		authn = auth.Chain(s.oidc)
	default:
		return nil, fmt.Errorf("unknown auth mode %q: want dev, oidc or tokens", cfg.AuthMode)
	}

	var throttle *auth.Throttle
	if s.AuthMode() != AuthDev {
		// The dev identity is loopback-only: there is nobody to slow down.
		throttle = &auth.Throttle{}
	}
	s.gw, err = gateway.New(gateway.Config{
		NATS:           s.nc,
		Auth:           authn,
		Throttle:       throttle,
		Audit:          auditLog,
		ID:             "dev",
		OriginPatterns: cfg.AllowedOrigins,
		Logger:         cfg.Logger.With("component", "gateway"),
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	s.http = &http.Server{
		Handler:           s.gw.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	go func() { s.serveDone <- s.http.Serve(s.ln) }()
	return s, nil
}

// URL returns the server's base URL, e.g. "http://127.0.0.1:7080".
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// DataDir returns the absolute data directory.
func (s *Server) DataDir() string { return s.cfg.DataDir }

// PublicURL returns the URL browsers reach the server at.
func (s *Server) PublicURL() string { return s.cfg.PublicURL }

// AuthMode returns how callers are identified (AuthDev, AuthOIDC, AuthTokens).
func (s *Server) AuthMode() string {
	if s.cfg.AuthMode == "" {
		return AuthDev
	}
	return s.cfg.AuthMode
}

// Unsafe reports whether harnesses run without a sandbox.
func (s *Server) Unsafe() bool { return s.cfg.UnsafeNoSandbox }

// NATS returns the server's NATS connection (for benchmarks comparing raw
// NATS fan-out).
func (s *Server) NATS() *nats.Conn { return s.nc }

// Close stops the gateway (WebSockets get "going away: reconnect"), then the
// node (running turns are cancelled and recorded, files closed), then NATS.
// It is safe to call twice.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.gw != nil {
			errs = append(errs, s.gw.Close(ctx))
		}
		if s.http == nil && s.ln != nil {
			s.ln.Close()
		}
		if s.http != nil {
			errs = append(errs, s.http.Shutdown(ctx))
			if err := <-s.serveDone; !errors.Is(err, http.ErrServerClosed) {
				errs = append(errs, err)
			}
		}
		if s.oidc != nil {
			errs = append(errs, s.oidc.Close())
		}
		if s.host != nil {
			errs = append(errs, s.host.Close(ctx))
		}
		if s.prov != nil {
			errs = append(errs, s.prov.Close(ctx))
		}
		if s.nc != nil {
			s.nc.Close()
		}
		if s.ns != nil {
			s.ns.Shutdown()
			s.ns.WaitForShutdown()
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
