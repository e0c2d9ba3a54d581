// Package server wires Atrium's parts into one in-process deployment: an
// embedded nats-server, a node (package actor) with SQLite histories,
// sandboxes (local bubblewrap ones, or remote VMs through a provisioning
// hook) whose workspaces are saved to an object store (a local directory or
// S3), and a gateway serving HTTP. `atrium dev`, `atrium serve`, `atrium
// bench` and the end-to-end tests use it, so they all run the same code as
// production: every gateway↔node message goes through NATS.
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
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// Defaults of Config.
const (
	DefaultListen         = "127.0.0.1:7080"
	DefaultDataDir        = ".atrium"
	DefaultHibernateAfter = 30 * time.Second
	DefaultTurnTimeout    = 30 * time.Minute
)

// Object stores of Storage.Type.
const (
	StorageDir = "dir"
	StorageS3  = "s3"
)

// Providers of Sandbox.Provider.
const (
	ProviderLocal  = "local"
	ProviderRemote = "remote"
)

// Authentication modes of Config.AuthMode.
const (
	AuthDev    = "dev"
	AuthOIDC   = "oidc"
	AuthTokens = "tokens"
)

// Storage configures the object store that sandboxes' workspaces are saved
// to.
type Storage struct {
	// Type is StorageDir (the default: a local directory) or StorageS3.
	Type string
	// Dir is the directory of StorageDir; default <DataDir>/objects.
	Dir string
	// S3 configures StorageS3. Its bucket must exist unless CreateBucket
	// is set.
	S3 blob.S3Config
}

// Sandbox configures compute: which provider runs sandboxes, their limits,
// and when they sleep and are replaced.
type Sandbox struct {
	// Provider is ProviderLocal (the default: bubblewrap on this host) or
	// ProviderRemote (VMs running `atrium sandbox-agent`, made by Hook;
	// needs StorageS3, since VMs move workspaces through presigned URLs).
	Provider string
	// Hook creates and destroys the VMs of ProviderRemote.
	Hook remote.Hook
	// MemoryBytes and Pids limit each sandbox; zero means the provider's
	// default.
	MemoryBytes int64
	Pids        int
	// CPUs limits each sandbox's CPU time in cores; zero means no limit.
	CPUs float64
	// EgressPermit lists the egress entries a session's owner may add to
	// its own sandbox (actor.Config.EgressPermit); empty: none.
	EgressPermit []string
	// Egress is the allowlist of hostnames sandboxes may reach through the
	// node's egress proxy; empty means no network.
	Egress []string
	// SleepAfter, MaxLifetime and SaveInterval default to the node's
	// (actor.DefaultSandboxSleepAfter and so on).
	SleepAfter   time.Duration
	MaxLifetime  time.Duration
	SaveInterval time.Duration
}

// Config configures a single-process deployment.
type Config struct {
	// Listen is the HTTP address; "127.0.0.1:0" picks a free port.
	Listen string
	// DataDir holds history/, sandboxes/, objects/ and nats/.
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
	// Sandbox configures compute; the zero value runs local sandboxes.
	Sandbox Sandbox
	// Storage configures the object store of workspaces; the zero value
	// is a directory in DataDir.
	Storage Storage
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
	// Channels configures chat channels and webhooks (Slack, Telegram,
	// signed webhooks); nil means none. Its public URL defaults to
	// PublicURL.
	Channels *gateway.Channels
	// Tracing exports OpenTelemetry spans of requests, commands, turns and
	// sandbox operations; the zero value is off.
	Tracing Tracing
	// Logger receives operational logs; nil discards them.
	Logger *slog.Logger
}

// Server is a running single-process deployment.
type Server struct {
	cfg   Config
	ns    *natsserver.Server
	nc    *nats.Conn
	prov  provider
	store blob.Store
	host  *actor.Host
	oidc  *auth.OIDC
	gw    *gateway.Server
	http  *http.Server
	ln    net.Listener
	// inproc connects nc to ns (ready.go); reg holds every metric and is
	// served at /metrics; closing is set when Close begins (/readyz).
	inproc  inProcess
	reg     *prometheus.Registry
	closing atomic.Bool
	// tp is the tracer provider of Config.Tracing; nil when it is off.
	tp *sdktrace.TracerProvider

	serveDone chan error
	closeOnce sync.Once
	closeErr  error
}

// provider is a compute provider the server closes.
type provider interface {
	compute.Provider
	Close(ctx context.Context) error
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
	if cfg.HibernateAfter < 0 || cfg.TurnTimeout < 0 || cfg.Sandbox.SleepAfter < 0 || cfg.Sandbox.MaxLifetime < 0 || cfg.Sandbox.SaveInterval < 0 {
		return nil, errors.New("durations must be positive")
	}
	if cfg.Storage.Type == "" {
		cfg.Storage.Type = StorageDir
	}
	if cfg.Sandbox.Provider == "" {
		cfg.Sandbox.Provider = ProviderLocal
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	cfg.DataDir = dir
	if cfg.Storage.Type == StorageDir && cfg.Storage.Dir == "" {
		cfg.Storage.Dir = filepath.Join(dir, "objects")
	}
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

	if s.tp, err = newTracerProvider(ctx, cfg.Tracing, cfg.Logger.With("component", "tracing")); err != nil {
		return nil, err
	}
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.startNATS(); err != nil {
		return nil, err
	}
	s.nc, err = nats.Connect("", nats.InProcessServer(&s.inproc), nats.Name("atrium-dev"), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}

	if s.store, err = openStore(ctx, cfg.Storage); err != nil {
		return nil, err
	}
	wiring, err := s.openCompute(cfg)
	if err != nil {
		return nil, err
	}

	s.host, err = actor.New(actor.Config{
		NATS:               s.nc,
		Histories:          actor.HistoriesOf(&sqlite.Dir{Path: filepath.Join(dir, "history"), Logger: cfg.Logger}),
		Provider:           s.prov,
		SandboxSpec:        compute.Spec{MemoryBytes: cfg.Sandbox.MemoryBytes, Pids: cfg.Sandbox.Pids, CPUs: cfg.Sandbox.CPUs, Egress: cfg.Sandbox.Egress},
		EgressPermit:       cfg.Sandbox.EgressPermit,
		Store:              s.store,
		WorkspaceOf:        wiring.workspaceOf,
		SandboxGeneration:  wiring.generation,
		SandboxSleepAfter:  cfg.Sandbox.SleepAfter,
		SandboxMaxLifetime: cfg.Sandbox.MaxLifetime,
		SaveInterval:       cfg.Sandbox.SaveInterval,
		NodeID:             "dev",
		HibernateAfter:     cfg.HibernateAfter,
		TurnTimeout:        cfg.TurnTimeout,
		CancelGrace:        cfg.CancelGrace,
		Registerer:         s.reg,
		TracerProvider:     s.tracerProvider(),
		Logger:             cfg.Logger.With("component", "node"),
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
	if cfg.Channels != nil && cfg.Channels.Service.PublicURL == "" {
		cfg.Channels.Service.PublicURL = cfg.PublicURL
	}

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
		Registry:       s.reg,
		Channels:       cfg.Channels,
		TracerProvider: s.tracerProvider(),
		Logger:         cfg.Logger.With("component", "gateway"),
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	s.http = &http.Server{
		Handler:           s.handler(s.gw.Handler()),
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
		s.closing.Store(true)
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
		errs = append(errs, s.shutdownTracing(ctx))
		if c, ok := s.store.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
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

// openStore opens the object store of workspaces.
func openStore(ctx context.Context, cfg Storage) (blob.Store, error) {
	switch cfg.Type {
	case StorageDir:
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("object store: %w", err)
		}
		return &blob.Dir{Path: cfg.Dir}, nil
	case StorageS3:
		st, err := blob.OpenS3(ctx, cfg.S3)
		if err != nil {
			return nil, fmt.Errorf("object store: %w", err)
		}
		return st, nil
	}
	return nil, fmt.Errorf("unknown object store type %q: want %s or %s", cfg.Type, StorageDir, StorageS3)
}

// computeWiring is what the node needs to know about the provider beyond
// compute.Provider.
type computeWiring struct {
	workspaceOf func(compute.Sandbox) (mount.Workspace, error)
	generation  func(session.ID) uint64 // nil: the provider never replaces a machine under a handle
}

// openCompute starts the sandbox provider of cfg.Sandbox (s.prov) and
// returns how the node reaches its sandboxes' workspaces.
func (s *Server) openCompute(cfg Config) (computeWiring, error) {
	log := cfg.Logger.With("component", "sandbox")
	switch cfg.Sandbox.Provider {
	case ProviderLocal:
		p, err := local.New(local.Config{
			Dir:         filepath.Join(cfg.DataDir, "sandboxes"),
			Unsafe:      cfg.UnsafeNoSandbox,
			MemoryBytes: cfg.Sandbox.MemoryBytes,
			Pids:        cfg.Sandbox.Pids,
			CPUs:        cfg.Sandbox.CPUs,
			Logger:      log,
		})
		if err != nil {
			return computeWiring{}, fmt.Errorf("local sandboxes: %w", err)
		}
		s.prov = p
		store := s.store
		return computeWiring{workspaceOf: func(sb compute.Sandbox) (mount.Workspace, error) {
			ls, ok := sb.(*local.Sandbox)
			if !ok {
				return nil, fmt.Errorf("a local sandbox was expected, not %T", sb)
			}
			d := ls.Workspace()
			d.Blob = store // The node reaches the store itself.
			return d, nil
		}}, nil
	case ProviderRemote:
		if cfg.Sandbox.Hook == nil {
			return computeWiring{}, errors.New("remote sandboxes: no provisioning hook (sandbox.remote create/destroy commands or url)")
		}
		if _, ok := s.store.(blob.Presigner); !ok {
			return computeWiring{}, errors.New("remote sandboxes need an S3 object store: their VMs move workspaces through presigned URLs (set storage.type s3)")
		}
		hook := &countingHook{Hook: cfg.Sandbox.Hook, created: map[session.ID]uint64{}}
		p, err := remote.New(remote.Config{Hook: hook, Logger: log})
		if err != nil {
			return computeWiring{}, fmt.Errorf("remote sandboxes: %w", err)
		}
		s.prov = p
		return computeWiring{
			workspaceOf: func(sb compute.Sandbox) (mount.Workspace, error) {
				rs, ok := sb.(*remote.Sandbox)
				if !ok {
					return nil, fmt.Errorf("a remote sandbox was expected, not %T", sb)
				}
				return rs.Workspace(), nil
			},
			generation: hook.generation,
		}, nil
	}
	return computeWiring{}, fmt.Errorf("unknown sandbox provider %q: want %s or %s", cfg.Sandbox.Provider, ProviderLocal, ProviderRemote)
}

// countingHook counts the VMs a hook creates per session, so the node
// notices when the remote provider replaced a dead VM under a sandbox
// handle (actor.Config.SandboxGeneration).
type countingHook struct {
	remote.Hook

	mu      sync.Mutex
	created map[session.ID]uint64 // guarded by mu
}

// CreateVM implements remote.Hook.
func (h *countingHook) CreateVM(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	vm, err := h.Hook.CreateVM(ctx, req)
	if err == nil {
		h.mu.Lock()
		h.created[req.Session]++
		h.mu.Unlock()
	}
	return vm, err
}

func (h *countingHook) generation(id session.ID) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.created[id]
}
