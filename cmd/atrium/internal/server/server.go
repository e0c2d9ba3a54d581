// Package server wires Atrium's parts into one process: NATS (an external
// cluster, or a nats-server embedded in the process), a node (package actor)
// with SQLite histories, sandboxes (local bubblewrap ones, or remote VMs
// through a provisioning hook) whose workspaces are saved to an object store
// (a local directory or S3), and a gateway serving HTTP. A process runs the
// gateway role, the node role or both. `atrium dev`, `atrium serve`, `atrium
// bench` and the end-to-end tests use it, so they all run the same code as
// production: every gateway↔node message goes through NATS.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/modelgw"
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
	// DefaultReconnectWait is the pause between attempts to reconnect to
	// an external NATS cluster (jittered); attempts never stop.
	DefaultReconnectWait = time.Second
	// DefaultEmbeddedLeaseTTL is the node's lease TTL when NATS is
	// embedded: no other node can take a session over, so the lease only
	// has to survive a loaded machine (see config.DefaultEmbeddedLeaseTTL).
	DefaultEmbeddedLeaseTTL = 30 * time.Second
	// DefaultPingInterval is how often the connection to an external NATS
	// cluster is pinged: two unanswered pings mark it disconnected, which
	// /readyz reports.
	DefaultPingInterval = 5 * time.Second
	// DefaultJetStreamWait is how long Start waits for an external NATS
	// cluster's JetStream to answer (a cluster starting with the process
	// elects its leaders first).
	DefaultJetStreamWait = time.Minute
)

// Roles of Config.Roles.
const (
	RoleGateway = "gateway"
	RoleNode    = "node"
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
	// TenantQuotaBytes limits what each tenant's sessions store (0: no
	// limit; storagegc.go). GCInterval (0: DefaultGCInterval),
	// WorkspaceHistory and GCGrace (0: mount's defaults) tune the
	// garbage collection every node runs.
	TenantQuotaBytes int64
	GCInterval       time.Duration
	WorkspaceHistory time.Duration
	GCGrace          time.Duration
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
	// HostUID is the unprivileged host uid local sandboxes run as when the
	// node runs as root (local.Config.HostUID); zero: atrium's own uid.
	// With HostUIDAuto, a host that cannot use it runs without, saying so
	// at start-up (sandboxdefaults.go).
	HostUID     int
	HostUIDAuto bool
	// TmpBytes is the size of each local sandbox's /tmp (local.Config.TmpBytes).
	TmpBytes int64
	// WorkspaceDiskBytes is each local sandbox's workspace quota
	// (local.Config.WorkspaceBytes); zero: none. With WorkspaceDiskAuto,
	// a host that cannot mount one runs without, saying so at start-up,
	// and so does a sandbox for which no loop device is free.
	WorkspaceDiskBytes int64
	WorkspaceDiskAuto  bool
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
	// MaxFileBytes and WorkspaceQuotaBytes limit uploads to workspaces
	// (actor.FilesConfig); zero means the node's default and no quota.
	MaxFileBytes        int64
	WorkspaceQuotaBytes int64
}

// NATS says how a server reaches NATS.
type NATS struct {
	// URLs are the servers of an external NATS cluster; empty: a
	// nats-server embedded in the process (JetStream in DataDir/nats),
	// which only a process with both roles can use.
	URLs []string
	// CredsFile, NKeyFile, or User and Password authenticate to the
	// cluster; at most one.
	CredsFile      string
	NKeyFile       string
	User, Password string
	// CAFile verifies the servers' certificates (default: the system
	// roots); CertFile and KeyFile are a client certificate.
	CAFile, CertFile, KeyFile string
	// Replicas is the JetStream replication of the streams and buckets
	// this process creates; zero means 1.
	Replicas int
	// Name is the connection name NATS monitoring shows; default
	// "atrium-" + NodeID.
	Name string
	// ReconnectWait is the pause between reconnection attempts;
	// DefaultReconnectWait if zero.
	ReconnectWait time.Duration
}

// Config configures one process: a gateway, a node or both.
type Config struct {
	// Roles are what the process runs: RoleGateway, RoleNode or both (the
	// default when empty). A gateway-only process starts no node and no
	// sandboxes; a node-only process serves only /healthz, /readyz and
	// /metrics over HTTP.
	Roles []string
	// NATS says how to reach NATS; the zero value embeds a nats-server.
	NATS NATS
	// NodeID names this process in the cluster: its heartbeat in the
	// nodes bucket, its leases, its gateway's presence messages. Default:
	// the host name.
	NodeID string
	// LeaseTTL, DrainGrace and CheckpointInterval tune the node
	// (actor.Config); zero means the node's defaults.
	LeaseTTL           time.Duration
	DrainGrace         time.Duration
	CheckpointInterval time.Duration
	// Version is the build's version, shown by `atrium cluster status`.
	Version string
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
	// TokenTTL is the default life of an API token (auth.TokensConfig.DefaultTTL);
	// TokenLoginMaxAge, in AuthOIDC, refuses tokens of owners who stopped
	// logging in (auth.TokensConfig.LoginMaxAge).
	TokenTTL, TokenLoginMaxAge time.Duration
	// SecretKeys encrypts session secrets at rest (actor.Config.SecretKeys).
	// Nil: in dev mode a keyring is generated in DataDir (SecretKeysFile);
	// otherwise secrets cannot be set.
	SecretKeys *session.SecretKeyring
	// PublicURL is the URL browsers reach the gateway at; default the
	// listener's http URL.
	PublicURL string
	// AllowedOrigins lists extra browser origins (see gateway.Config).
	AllowedOrigins []string
	// HistoryCacheBytes bounds the gateway's history cache (see
	// gateway.Config); 0 is the default, negative turns it off.
	HistoryCacheBytes int
	// DevUser is the user the dev sign-in form suggests (auth.Dev.User).
	DevUser string
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client (auth.TrustedProxies): the throttle, the audit log, the
	// access log and the dev identity's loopback check see that client.
	TrustedProxies auth.TrustedProxies
	// Channels configures chat channels and webhooks (Slack, Telegram,
	// signed webhooks); nil means none. Its public URL defaults to
	// PublicURL.
	Channels *gateway.Channels
	// Tasks configures repository tasks (gateway.Tasks); nil means none.
	// Its PublicURL and DLQ are filled in by Start (tasks.go).
	Tasks *gateway.Tasks
	// Quotas caps invokes and sets the tenants' quotas (gateway.Quotas).
	Quotas gateway.Quotas
	// Automation configures schedules and dead letters; its buckets are
	// replicated like the others unless it says otherwise.
	Automation gateway.Automation
	// Agents adds ACP agents to the built-in ones (compute/agents);
	// AgentsDir is where they are installed (default <DataDir>/agents);
	// AgentMode is the permission mode agents run with (ask, auto-edit or
	// auto; default ask).
	Agents    []agents.Spec
	AgentsDir string
	AgentMode string
	// Models configures the node's model gateway (models.go): with
	// providers, it serves every sandbox of the node at compute.ModelAddr.
	// Its callbacks, logger and registerer are the server's own.
	Models modelgw.Config
	// Tracing exports OpenTelemetry spans of requests, commands, turns and
	// sandbox operations; the zero value is off.
	Tracing Tracing
	// Logger receives operational logs; nil discards them.
	Logger *slog.Logger
	// AccessLog logs one line per HTTP request to Logger (component
	// "access").
	AccessLog bool
}

// Server is a running process: a gateway, a node or both.
type Server struct {
	cfg  Config
	ns   *natsserver.Server // nil with an external NATS cluster
	nc   *nats.Conn
	prov provider
	// diskQuota is the local sandboxes' workspace quota as resolved at
	// start-up (0: none): the most a session's settings.disk_bytes may be.
	diskQuota int64
	store     blob.Store
	host      *actor.Host
	oidc      *auth.OIDC
	gw        *gateway.Server
	http      *http.Server
	ln        net.Listener
	// inproc connects nc to ns (ready.go); reg holds every metric and is
	// served at /metrics; closing is set when Close begins (/readyz).
	inproc  inProcess
	reg     *prometheus.Registry
	closing atomic.Bool
	guard   storeGuard // the embedded server's JetStream through a full disk (storeguard.go)
	// tp is the tracer provider of Config.Tracing; nil when it is off.
	tp *sdktrace.TracerProvider
	// beat writes this process's heartbeat into the nodes bucket
	// (nodes.go); started is when Start began.
	beat    *heartbeat
	started time.Time
	// models is the node's model gateway (models.go); nil without one.
	models *modelNode
	// gc collects the object store's garbage (storagegc.go); nil on a
	// gateway.
	gc *storageGC
	// storeWatch reports when an object store that was down at start-up
	// is back (storewatch.go); nil if it was up.
	storeWatch *storeWatch

	serveDone chan error
	closeOnce sync.Once
	closeErr  error
}

// provider is a compute provider the server closes.
type provider interface {
	compute.Provider
	Close(ctx context.Context) error
}

// Start starts the roles of cfg: it connects to NATS (or starts the embedded
// server), then the node, then the gateway, and listens on cfg.Listen. On
// error everything started is stopped again.
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
	if cfg.HibernateAfter < 0 || cfg.TurnTimeout < 0 || cfg.Sandbox.SleepAfter < 0 || cfg.Sandbox.MaxLifetime < 0 || cfg.Sandbox.SaveInterval < 0 ||
		cfg.LeaseTTL < 0 || cfg.DrainGrace < 0 || cfg.CheckpointInterval < 0 {
		return nil, errors.New("durations must be positive")
	}
	if cfg.Storage.Type == "" {
		cfg.Storage.Type = StorageDir
	}
	if cfg.Sandbox.Provider == "" {
		cfg.Sandbox.Provider = ProviderLocal
	}
	if cfg.Roles, err = checkRoles(cfg.Roles); err != nil {
		return nil, err
	}
	if len(cfg.NATS.URLs) == 0 && len(cfg.Roles) != 2 {
		return nil, fmt.Errorf("roles %v need an external NATS cluster (NATS.URLs): only a process with both roles can embed NATS", cfg.Roles)
	}
	if cfg.NodeID == "" {
		cfg.NodeID = defaultNodeID()
	}
	if cfg.LeaseTTL == 0 && len(cfg.NATS.URLs) == 0 {
		cfg.LeaseTTL = DefaultEmbeddedLeaseTTL
	}
	if cfg.NATS.Name == "" {
		cfg.NATS.Name = "atrium-" + cfg.NodeID
	}
	if cfg.NATS.Replicas == 0 {
		cfg.NATS.Replicas = 1
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	cfg.DataDir = dir
	if cfg.Storage.Type == StorageDir && cfg.Storage.Dir == "" {
		cfg.Storage.Dir = filepath.Join(dir, "objects")
	}
	dirs := []string{dir}
	if hasRole(cfg.Roles, RoleNode) {
		dirs = append(dirs, filepath.Join(dir, "history"), filepath.Join(dir, "sandboxes"))
	}
	if len(cfg.NATS.URLs) == 0 {
		dirs = append(dirs, filepath.Join(dir, "nats"))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
	}

	s := &Server{cfg: cfg, serveDone: make(chan error, 1), started: time.Now().UTC()}
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
	if err := s.connectNATS(ctx); err != nil {
		return nil, err
	}
	if s.IsNode() {
		if err := s.startNode(ctx); err != nil {
			return nil, err
		}
	}

	s.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (is another atrium running? pick another address with --listen)", cfg.Listen, err)
	}
	var h http.Handler
	if s.IsGateway() {
		if h, err = s.startGateway(ctx); err != nil {
			return nil, err
		}
	} else {
		h = s.nodeHandler()
	}
	if s.beat, err = startHeartbeat(ctx, s); err != nil {
		return nil, err
	}

	s.http = &http.Server{
		Handler:           cfg.TrustedProxies.Handler(s.handler(h)),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	go func() { s.serveDone <- s.http.Serve(s.ln) }()
	return s, nil
}

// checkRoles returns roles without duplicates, both roles if it is empty, or
// an error naming an unknown role.
func checkRoles(roles []string) ([]string, error) {
	if len(roles) == 0 {
		return []string{RoleGateway, RoleNode}, nil
	}
	var out []string
	for _, r := range roles {
		if r != RoleGateway && r != RoleNode {
			return nil, fmt.Errorf("unknown role %q: want %s or %s", r, RoleGateway, RoleNode)
		}
		if !hasRole(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

func hasRole(roles []string, role string) bool {
	for _, r := range roles {
		if r == role {
			return true
		}
	}
	return false
}

// defaultNodeID is the host's name (its first label), or "atrium".
func defaultNodeID() string {
	h, err := os.Hostname()
	if h, _, _ = strings.Cut(h, "."); err != nil || h == "" {
		return "atrium"
	}
	return h
}

// connectNATS connects s.nc: to the external cluster of cfg.NATS.URLs, or
// to a nats-server it embeds.
func (s *Server) connectNATS(ctx context.Context) error {
	log := s.cfg.Logger.With("component", "nats")
	if len(s.cfg.NATS.URLs) > 0 {
		nc, err := ConnectNATS(s.cfg.NATS, log)
		if err != nil {
			return err
		}
		s.nc = nc
		log.Info("connected to NATS", "server", nc.ConnectedUrlRedacted(), "server_name", nc.ConnectedServerName())
		return waitJetStream(ctx, nc, log)
	}
	if err := s.startNATS(); err != nil {
		return err
	}
	opts := append(natsHandlers(log), nats.Name(s.cfg.NATS.Name), nats.MaxReconnects(-1),
		nats.InProcessServer(&s.inproc), nats.ReconnectWait(250*time.Millisecond))
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return fmt.Errorf("connect to embedded nats: %w", err)
	}
	s.nc = nc
	return nil
}

// waitJetStream waits until JetStream answers on nc: a cluster that is
// still forming (its servers started together, electing a meta leader)
// refuses to create buckets for a while. It gives up after
// DefaultJetStreamWait, or when ctx ends.
func waitJetStream(ctx context.Context, nc *nats.Conn, log *slog.Logger) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultJetStreamWait)
	defer cancel()
	for try := 0; ; try++ {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil {
			if try > 0 {
				log.Info("JetStream is available")
			}
			return nil
		}
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return fmt.Errorf("NATS at %s has no JetStream for this account: enable it (jetstream {} in the servers' config; see deploy/nats/): %w",
				nc.ConnectedUrlRedacted(), err)
		}
		if try == 0 {
			log.Warn("waiting for NATS JetStream to become available (is the cluster still forming?)", "err", err)
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("JetStream at %s did not answer within %v: %w (check the NATS servers' logs: JetStream enabled, a meta leader elected)",
				nc.ConnectedUrlRedacted(), DefaultJetStreamWait, err)
		case <-t.C:
		}
	}
}

// ConnectNATS connects to the external NATS cluster of cfg (cfg.URLs must
// not be empty) with its credentials and TLS. The connection reconnects
// forever, every cfg.ReconnectWait (jittered), and logs to log when it
// loses and regains its server.
func ConnectNATS(cfg NATS, log *slog.Logger) (*nats.Conn, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("connect to NATS: no server URLs")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wait := cfg.ReconnectWait
	if wait <= 0 {
		wait = DefaultReconnectWait
	}
	opts := append(natsHandlers(log), nats.Name(cfg.Name), nats.MaxReconnects(-1),
		nats.ReconnectWait(wait), nats.ReconnectJitter(wait/4, wait/2),
		nats.PingInterval(DefaultPingInterval), nats.MaxPingsOutstanding(2),
		// Publish nothing that was buffered while disconnected: a node cut
		// off from NATS loses its leases, and an event it committed then
		// must not reach the stream after the next owner took over.
		nats.ReconnectBufSize(-1))
	switch {
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.NKeyFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats nkey %s: %w", cfg.NKeyFile, err)
		}
		opts = append(opts, o)
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if cfg.CertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	nc, err := nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w (is the cluster up and reachable from here? check nats.urls and the credentials)",
			strings.Join(cfg.URLs, ", "), err)
	}
	return nc, nil
}

// natsHandlers log a connection's losses and recoveries.
func natsHandlers(log *slog.Logger) []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
	}
}

// startNode opens the object store and the sandbox provider and starts the
// node's host.
func (s *Server) startNode(ctx context.Context) (err error) {
	cfg := s.cfg
	if s.store, s.storeWatch, err = openStoreWaiting(ctx, cfg.Storage, cfg.Logger.With("component", "storage")); err != nil {
		return err
	}
	workspaces, quota := limitStore(cfg.Storage, s.store, s.nc, cfg.Logger.With("component", "storage"))
	wiring, err := s.openCompute(cfg)
	if err != nil {
		return err
	}
	if err := s.startModels(); err != nil {
		return err
	}
	agentCat, err := newNodeAgents(cfg)
	if err != nil {
		return fmt.Errorf("agents: %w", err)
	}
	if err := s.serveAgentList(cfg); err != nil { // agentlist.go
		return err
	}
	secretKeys, err := secretKeys(&cfg, cfg.Logger)
	if err != nil {
		return err
	}
	// The limits a session's settings may choose within: the configured
	// ones, or the local provider's defaults that apply without them.
	memory, pids := cfg.Sandbox.MemoryBytes, cfg.Sandbox.Pids
	if cfg.Sandbox.Provider == ProviderLocal {
		memory = cmp.Or(memory, local.DefaultMemoryBytes)
		pids = cmp.Or(pids, local.DefaultPids)
	}
	s.host, err = actor.New(actor.Config{
		SecretKeys:         secretKeys,
		Agents:             agentCat,
		NATS:               s.nc,
		Histories:          actor.HistoriesOf(&sqlite.Dir{Path: filepath.Join(cfg.DataDir, "history"), Logger: cfg.Logger}),
		Provider:           s.prov,
		SandboxKind:        sandboxKind(cfg.Sandbox),
		SandboxSpec:        compute.Spec{MemoryBytes: memory, Pids: pids, DiskBytes: s.diskQuota, CPUs: cfg.Sandbox.CPUs, Egress: cfg.Sandbox.Egress, ModelSocket: s.modelSocket()},
		EgressPermit:       cfg.Sandbox.EgressPermit,
		Models:             s.actorModels(),
		Store:              workspaces,
		WorkspaceOf:        wiring.workspaceOf,
		SandboxGeneration:  wiring.generation,
		SandboxSleepAfter:  cfg.Sandbox.SleepAfter,
		SandboxMaxLifetime: cfg.Sandbox.MaxLifetime,
		SaveInterval:       cfg.Sandbox.SaveInterval,
		Files:              actor.FilesConfig{MaxFileBytes: cfg.Sandbox.MaxFileBytes, Quota: cfg.Sandbox.WorkspaceQuotaBytes},
		NodeID:             cfg.NodeID,
		HibernateAfter:     cfg.HibernateAfter,
		TurnTimeout:        cfg.TurnTimeout,
		CancelGrace:        cfg.CancelGrace,
		LeaseTTL:           cfg.LeaseTTL,
		Replicas:           cfg.NATS.Replicas,
		StoreFull:          s.guard.err,
		Checkpoints:        s.store, // beside the workspaces
		CheckpointInterval: cfg.CheckpointInterval,
		DrainGrace:         cfg.DrainGrace,
		Registerer:         s.reg,
		TracerProvider:     s.tracerProvider(),
		Logger:             cfg.Logger.With("component", "node"),
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := s.host.Start(ctx); err != nil {
		return fmt.Errorf("start node: %w", err)
	}
	s.gc = startStorageGC(cfg.Storage, s.store, quota, cfg.Logger.With("component", "storage"))
	return nil
}

// startGateway starts the gateway (and its authentication) and returns its
// handler.
func (s *Server) startGateway(ctx context.Context) (http.Handler, error) {
	cfg := s.cfg
	if cfg.PublicURL == "" {
		cfg.PublicURL = s.URL()
	}
	cfg.PublicURL = strings.TrimSuffix(cfg.PublicURL, "/")
	s.cfg.PublicURL = cfg.PublicURL
	if cfg.Channels != nil && cfg.Channels.Service.PublicURL == "" {
		cfg.Channels.Service.PublicURL = cfg.PublicURL
	}

	auditLog, err := audit.New(audit.Config{NATS: s.nc, Replicas: cfg.NATS.Replicas})
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	loginMaxAge := time.Duration(0)
	if cfg.AuthMode == AuthOIDC {
		loginMaxAge = cfg.TokenLoginMaxAge
	}
	tokens, err := auth.NewTokens(auth.TokensConfig{NATS: s.nc, Bucket: session.DefaultPrefix + "_tokens", Replicas: cfg.NATS.Replicas,
		DefaultTTL: cfg.TokenTTL, LoginMaxAge: loginMaxAge, Logger: cfg.Logger.With("component", "gateway")})
	if err != nil {
		return nil, fmt.Errorf("api tokens: %w", err)
	}
	var authn auth.Authenticator
	switch cfg.AuthMode {
	case "", AuthDev:
		authn = auth.Chain(&auth.Dev{User: cfg.DevUser})
	case AuthTokens:
		// The first tokens are made with the data directory's bootstrap
		// key: `atrium token create --bootstrap` (docs/auth.md).
		key, err := auth.EnsureBootstrapKey(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		authn = auth.Chain(&auth.Bootstrap{Key: key})
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
	if err := s.wireTasks(ctx, cfg.Tasks, cfg.PublicURL); err != nil {
		return nil, err
	}
	s.gw, err = gateway.New(gateway.Config{
		NATS:                s.nc,
		Auth:                authn,
		Throttle:            throttle,
		Audit:               auditLog,
		Tokens:              tokens,
		ID:                  cfg.NodeID,
		OriginPatterns:      cfg.AllowedOrigins,
		HistoryCacheBytes:   cfg.HistoryCacheBytes,
		Registry:            s.reg,
		Channels:            cfg.Channels,
		Tasks:               cfg.Tasks,
		Automation:          cfg.automation(),
		Replicas:            cfg.NATS.Replicas,
		Quotas:              cfg.Quotas,
		ClusterStatus:       s.clusterStatusAny,
		TenantClusterStatus: s.tenantClusterStatus,
		TracerProvider:      s.tracerProvider(),
		Logger:              cfg.Logger.With("component", "gateway"),
		AccessLog:           s.accessLog(),
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	return s.gw.Handler(), nil
}

// nodeHandler is the HTTP handler of a node-only process: /healthz and
// /metrics (handler adds /readyz); everything else is 404.
func (s *Server) nodeHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"this process is an Atrium node: it serves only /healthz, /readyz and /metrics; clients talk to a gateway"}}` + "\n"))
	})
	return mux
}

// IsGateway reports whether this process runs the gateway role.
func (s *Server) IsGateway() bool { return hasRole(s.cfg.Roles, RoleGateway) }

// IsNode reports whether this process runs the node role.
func (s *Server) IsNode() bool { return hasRole(s.cfg.Roles, RoleNode) }

// Roles returns the roles this process runs.
func (s *Server) Roles() []string { return slices.Clone(s.cfg.Roles) }

// NodeID returns the name of this process in the cluster.
func (s *Server) NodeID() string { return s.cfg.NodeID }

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

// Close stops the process gracefully: its heartbeat says it is draining;
// the gateway closes every WebSocket with 1012 "reconnect" (clients resume
// on another gateway) and ends SSE streams, then the HTTP server stops; the
// node drains (running turns are given its drain grace, then cancelled and
// recorded; sessions are handed off, files closed); then the heartbeat is
// withdrawn and NATS closed. It is safe to call twice.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		var errs []error
		if s.beat != nil {
			s.beat.draining(ctx)
		}
		if s.gw != nil {
			errs = append(errs, s.gw.Drain(ctx))
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
		if s.beat != nil {
			s.beat.stop(ctx)
		}
		errs = append(errs, s.closeModels(ctx))
		if s.prov != nil {
			errs = append(errs, s.prov.Close(ctx))
		}
		errs = append(errs, s.shutdownTracing(ctx))
		s.gc.stop()
		s.storeWatch.stop()
		if c, ok := s.store.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
		if s.nc != nil {
			s.nc.Close()
		}
		if s.ns != nil {
			s.guard.stop()
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
		resolveSandboxDefaults(&cfg.Sandbox, cfg.DataDir, cfg.UnsafeNoSandbox, log)
		p, err := local.New(local.Config{
			Dir:            filepath.Join(cfg.DataDir, "sandboxes"),
			Unsafe:         cfg.UnsafeNoSandbox,
			MemoryBytes:    cfg.Sandbox.MemoryBytes,
			Pids:           cfg.Sandbox.Pids,
			CPUs:           cfg.Sandbox.CPUs,
			HostUID:        cfg.Sandbox.HostUID,
			TmpBytes:       cfg.Sandbox.TmpBytes,
			WorkspaceBytes: cfg.Sandbox.WorkspaceDiskBytes,
			// Defaults never fail a sandbox for want of a loop device.
			WorkspaceBestEffort: cfg.Sandbox.WorkspaceDiskAuto,
			Logger:              log,
		})
		if err != nil {
			return computeWiring{}, fmt.Errorf("local sandboxes: %w", err)
		}
		if !cfg.UnsafeNoSandbox && cfg.Sandbox.WorkspaceDiskBytes > 0 {
			s.diskQuota = cfg.Sandbox.WorkspaceDiskBytes
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
			return computeWiring{}, errors.New("remote sandboxes: no provisioning hook (sandbox.remote create/destroy commands, url or vm_hosts)")
		}
		if _, ok := s.store.(blob.Presigner); !ok {
			return computeWiring{}, errors.New("remote sandboxes need an S3 object store: their VMs move workspaces through presigned URLs (set storage.type s3)")
		}
		hook := &countingHook{Hook: cfg.Sandbox.Hook, created: map[session.ID]uint64{}}
		agentsDir := cfg.AgentsDir
		if agentsDir == "" {
			agentsDir = filepath.Join(cfg.DataDir, agents.DirName)
		}
		// An agent's program comes from the VM image's copy (atrium
		// vmhost image build --agents).
		p, err := remote.New(remote.Config{Hook: hook, Logger: log, AgentsDir: agentsDir})
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

// Unwrap exposes the hook's sleep and wake (remote.Sleeper) to the
// provider.
func (h *countingHook) Unwrap() remote.Hook { return h.Hook }

func (h *countingHook) generation(id session.ID) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.created[id]
}

// accessLog is the gateway's access logger, nil when it is off.
func (s *Server) accessLog() *slog.Logger {
	if !s.cfg.AccessLog {
		return nil
	}
	return s.cfg.Logger.With("component", "access")
}
