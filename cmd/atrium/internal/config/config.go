// Package config is Atrium's configuration file: one YAML document, with
// every setting overridable by an environment variable (ATRIUM_ followed by
// the setting's path in upper case, dots as underscores: auth.oidc.issuer is
// ATRIUM_AUTH_OIDC_ISSUER). Unknown keys are errors, defaults are filled in by
// Load, and Validate says which setting is wrong and how to fix it.
//
// Only cmd/atrium reads configuration; the packages it wires take plain
// Config structs.
package config

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/gateway/auth"
)

// Defaults of File.
const (
	DefaultListen         = "127.0.0.1:7080"
	DefaultDataDir        = ".atrium"
	DefaultHibernateAfter = 30 * time.Second
	DefaultTurnTimeout    = 30 * time.Minute
	DefaultCancelGrace    = 5 * time.Second
	DefaultSleepAfter     = 10 * time.Minute
	DefaultMaxLifetime    = 24 * time.Hour
	DefaultSaveInterval   = 5 * time.Minute
	DefaultCookieTTL      = 12 * time.Hour
	DefaultLogFormat      = "json"
	DefaultLogLevel       = "info"
	// DefaultLeaseTTL is how long a node's ownership of a session lasts
	// without renewal: the takeover time after a node dies.
	DefaultLeaseTTL = 3 * time.Second
	// DefaultEmbeddedLeaseTTL replaces it when NATS is embedded (no
	// nats.urls): the node and NATS live and die together, no other node
	// can take a session over, and a short lease would only risk stopping
	// sessions on a machine too loaded to renew in time.
	DefaultEmbeddedLeaseTTL = 30 * time.Second
	// DefaultDrainGrace is how long a stopping node lets running turns
	// finish before it cancels them.
	DefaultDrainGrace = 30 * time.Second
	// DefaultCheckpointInterval is how often an active session's history is
	// checkpointed to the object store.
	DefaultCheckpointInterval = time.Minute
	// DefaultNATSReplicas is the JetStream replication of Atrium's streams
	// and buckets.
	DefaultNATSReplicas = 1
)

// Roles of File.Roles: what one process runs.
const (
	RoleGateway = "gateway" // HTTP, WebSocket and SSE clients, chat channels; no session state
	RoleNode    = "node"    // session actors, their histories and sandboxes
)

// MaxNATSReplicas is the most JetStream replicas NATS allows.
const MaxNATSReplicas = 5

// Auth modes.
const (
	AuthOIDC   = "oidc"   // an OIDC provider, plus API tokens
	AuthTokens = "tokens" // API tokens only (bots and automation; tokens are created with `atrium token create` by an admin)
	AuthDev    = "dev"    // the dev identity: loopback only, `atrium dev` only
)

// File is the configuration file. Field tags give the YAML keys.
type File struct {
	// Listen is the HTTP address of the gateway.
	Listen string `yaml:"listen"`
	// PublicURL is the URL people and bots reach the gateway at (behind a
	// proxy, the proxy's URL). It is the base of the OIDC redirect URL and an
	// allowed Origin. Default: http://<listen>.
	PublicURL string `yaml:"public_url"`
	// DataDir holds session histories, sandboxes and the embedded NATS store.
	DataDir string `yaml:"data_dir"`
	// AllowedOrigins lists extra browser origins allowed to open WebSockets
	// and send state-changing requests (patterns as in path.Match).
	AllowedOrigins []string `yaml:"allowed_origins"`
	// TrustedProxies are the addresses or CIDR prefixes of the reverse
	// proxies in front of the gateway (an ingress, a load balancer): their
	// X-Forwarded-For names the client, for the failed-login throttle, the
	// audit log and the access log. Anyone else's X-Forwarded-For is ignored.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// HistoryCacheBytes bounds the gateway's cache of the latest events of
	// watched sessions, which serves resumes without asking the node for
	// every page (gateway.Config.HistoryCacheBytes): 0 is the default
	// (gateway.DefaultHistoryCacheBytes, 64 MiB), -1 turns it off.
	HistoryCacheBytes int `yaml:"history_cache_bytes"`
	// Roles are what this process runs: RoleGateway, RoleNode, or both (the
	// default). Processes with one role share an external NATS cluster.
	Roles []string `yaml:"roles"`
	// NATS says how to reach NATS: an external cluster, or (no urls) a
	// server embedded in this process.
	NATS NATS `yaml:"nats"`
	Log  Log  `yaml:"log"`
	Auth Auth `yaml:"auth"`
	// Secrets configures how session secrets are encrypted at rest.
	Secrets Secrets `yaml:"secrets"`
	Node    Node    `yaml:"node"`
	Sandbox Sandbox `yaml:"sandbox"`
	Storage Storage `yaml:"storage"`
	// Channels configures chat channels and webhooks (channels.go).
	Channels Channels `yaml:"channels"`
	// Tracing exports OpenTelemetry traces; off unless otlp_endpoint is set.
	Tracing Tracing `yaml:"tracing"`
	// Tasks configures repository tasks that open pull requests (tasks.go).
	Tasks Tasks `yaml:"tasks"`
	// Quotas caps invokes and sets the tenants' quotas (quotas.go).
	Quotas Quotas `yaml:"quotas"`
	// Automation configures schedules and dead letters (automation.go).
	Automation Automation `yaml:"automation"`
	// Agents adds ACP agents to the built-in ones (claude, codex, gemini,
	// opencode), or replaces one of the same name (compute/agents.Spec).
	Agents []agents.Spec `yaml:"agents"`
	// AgentMode is the permission mode agents run with on this node: ask
	// (the default), auto-edit or auto (docs/agents.md).
	AgentMode string `yaml:"agent_mode"`
	// Models configures the node's model gateway (models.go).
	Models Models `yaml:"models"`
}

// Tracing protocols.
const (
	TracingHTTP = "http" // OTLP over HTTP/protobuf (collectors listen on 4318)
	TracingGRPC = "grpc" // OTLP over gRPC (collectors listen on 4317)
)

// Tracing configures OpenTelemetry tracing: spans of requests, NATS
// requests, commands, turns, sandbox operations and workspace saves and
// restores, with ids and sizes but never prompt text or payloads.
type Tracing struct {
	// OTLPEndpoint is the host:port of an OTLP collector; empty: tracing off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// Protocol is http (the default) or grpc.
	Protocol string `yaml:"protocol"`
	// SampleRatio is the fraction of new traces recorded, in (0, 1]; 0
	// means 1. Requests arriving with a sampled traceparent are recorded.
	SampleRatio float64 `yaml:"sample_ratio"`
	// Insecure sends spans without TLS (loopback or a trusted network).
	Insecure bool `yaml:"insecure"`
}

// check returns the problems of the tracing section.
func (t Tracing) check() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if t.OTLPEndpoint != "" {
		if strings.Contains(t.OTLPEndpoint, "://") {
			bad("tracing.otlp_endpoint", "%q: give host:port without a scheme (use tracing.insecure for plain HTTP)", t.OTLPEndpoint)
		} else if _, _, err := net.SplitHostPort(t.OTLPEndpoint); err != nil {
			bad("tracing.otlp_endpoint", "%q is not host:port (an OTLP collector, e.g. otel-collector:4318)", t.OTLPEndpoint)
		}
	}
	switch t.Protocol {
	case TracingHTTP, TracingGRPC:
	default:
		bad("tracing.protocol", "%q: want http or grpc", t.Protocol)
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		bad("tracing.sample_ratio", "%v: want a fraction between 0 and 1 (0.1 records one new trace in ten; 0 means all)", t.SampleRatio)
	}
	return errs
}

// Log configures logging.
type Log struct {
	Format string `yaml:"format"` // json or text
	Level  string `yaml:"level"`  // debug, info, warn, error
	// Access turns the gateway's access log (one line per HTTP request, at
	// info) "on" (the default) or "off".
	Access string `yaml:"access"`
}

// Auth configures who may call Atrium.
type Auth struct {
	// Mode is oidc, tokens or dev. Required for `atrium serve`.
	Mode string `yaml:"mode"`
	OIDC OIDC   `yaml:"oidc"`
	// CookieKey seals the browser login cookie: 32 or more random bytes,
	// base64-encoded. Secret.
	CookieKey string `yaml:"cookie_key" secret:"true"`
	// CookieTTL is how long a browser login lasts.
	CookieTTL time.Duration `yaml:"cookie_ttl"`
	// TokenTTL is how long an API token made without an expiry lasts
	// (default 90 days; "-1s": never expires).
	TokenTTL time.Duration `yaml:"token_ttl"`
	// TokenLoginMaxAge (oidc mode) refuses an API token whose owner has not
	// logged in for longer (default 30 days; "-1s": off): a user removed at
	// the identity provider loses their tokens.
	TokenLoginMaxAge time.Duration `yaml:"token_login_max_age"`
}

// Secrets configures the encryption of session secrets at rest.
type Secrets struct {
	// KeyFile is the keyring: lines "<id>:<base64 of 32 random bytes>", the
	// first the current key (docs/operations.md). ATRIUM_SECRETS_KEYS may
	// hold the same text instead.
	KeyFile string `yaml:"key_file"`
}

// OIDC configures the organisation's OpenID Connect provider.
type OIDC struct {
	Issuer       string   `yaml:"issuer"`
	ClientID     string   `yaml:"client_id"`
	ClientSecret string   `yaml:"client_secret" secret:"true"`
	Scopes       []string `yaml:"scopes"`
	// Audience, if set, is also accepted as the audience of JWT access
	// tokens sent as bearers.
	Audience string `yaml:"audience"`
	// UserClaim names the claim that is a user's name (default email, then sub).
	UserClaim string `yaml:"user_claim"`
	// TenantClaim names the claim holding a user's tenant (an organisation
	// or group claim); DefaultTenant is used for single-tenant installs.
	TenantClaim   string `yaml:"tenant_claim"`
	DefaultTenant string `yaml:"default_tenant"`
	// GroupsClaim names the claim listing a user's groups; members of
	// AdminGroup are tenant admins.
	GroupsClaim string `yaml:"groups_claim"`
	AdminGroup  string `yaml:"admin_group"`
	// OperatorGroup's members are operators: they read the whole cluster's
	// state (atrium cluster status), every tenant's included.
	OperatorGroup string `yaml:"operator_group"`
	// CLIClientID (and a non-confidential CLIClientSecret, for providers
	// that require one from installed apps) is the client `atrium login`
	// uses; default ClientID.
	CLIClientID     string `yaml:"cli_client_id"`
	CLIClientSecret string `yaml:"cli_client_secret"`
}

// NATS configures the connection to NATS.
type NATS struct {
	// URLs are the servers of an external NATS cluster (nats://host:4222,
	// tls://host:4222); empty: a server embedded in this process, storing
	// JetStream in <data_dir>/nats (single process only).
	URLs []string `yaml:"urls"`
	// Creds is a .creds file (user JWT and nkey seed) to authenticate with;
	// NKey is an nkey seed file; User and Password are plain credentials.
	// At most one of the three.
	Creds    string `yaml:"creds"`
	NKey     string `yaml:"nkey"`
	User     string `yaml:"user"`
	Password string `yaml:"password" secret:"true"`
	TLS      TLS    `yaml:"tls"`
	// Replicas is the JetStream replication of the streams and buckets
	// Atrium creates: 3 in a 3-server cluster survives the loss of one.
	Replicas int `yaml:"replicas"`
	// Name is the connection's name as NATS monitoring shows it; default
	// node.id.
	Name string `yaml:"name"`
}

// TLS configures TLS to NATS: CA verifies the servers (default the system
// roots), Cert and Key are a client certificate for servers that ask.
type TLS struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Node configures this process's identity and its session actors.
type Node struct {
	// ID names this process among the cluster's (leases, presence,
	// `atrium cluster status`); default the host name. Give every process
	// on one machine its own.
	ID             string        `yaml:"id"`
	HibernateAfter time.Duration `yaml:"hibernate_after"`
	TurnTimeout    time.Duration `yaml:"turn_timeout"`
	CancelGrace    time.Duration `yaml:"cancel_grace"`
	// LeaseTTL is how long a session's ownership lasts unrenewed: a dead
	// node's sessions are taken over after it.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// DrainGrace is how long a node stopping on SIGTERM lets running turns
	// finish before it cancels them.
	DrainGrace time.Duration `yaml:"drain_grace"`
	// CheckpointInterval is how often an active session's history is
	// checkpointed to the object store (also on hibernation and drain).
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
}

// Sandbox configures compute.
type Sandbox struct {
	// Provider is local (bubblewrap on this host) or remote (VMs through a
	// provisioning hook running `atrium sandbox-agent`).
	Provider string `yaml:"provider"`
	// UnsafeNoSandbox runs local harnesses without bubblewrap.
	UnsafeNoSandbox bool `yaml:"unsafe_no_sandbox"`
	// MemoryBytes and Pids limit each sandbox (0: provider default).
	MemoryBytes int64 `yaml:"memory_bytes"`
	Pids        int   `yaml:"pids"`
	// CPUs limits each sandbox's CPU time (0.5 is half a core; 0: no limit).
	CPUs float64 `yaml:"cpus"`
	// HostUID is the unprivileged host uid (and gid) local sandboxes run as
	// when atrium runs as root, so that files made in a sandbox are not
	// root's on the host (docs/compute.md). 0: DefaultHostUID where the
	// host supports it (else off, said at start-up); -1: off.
	HostUID int `yaml:"host_uid"`
	// TmpBytes is the size of each local sandbox's /tmp (0: 1 GiB); writes
	// past it fail with ENOSPC.
	TmpBytes int64 `yaml:"tmp_bytes"`
	// WorkspaceDiskBytes, if set, makes each local sandbox's workspace a
	// file system of that size (a loop-mounted ext4 image; needs root):
	// writes past it fail with ENOSPC. 0: DefaultWorkspaceDiskBytes with
	// `atrium serve` where the host supports it (else off, said at
	// start-up), none with `atrium dev`; -1: none.
	WorkspaceDiskBytes int64 `yaml:"workspace_disk_bytes"`
	// Egress lists the hostnames sandboxes may reach through the node's
	// egress proxy ("github.com", "*.example.com", "host:port"); empty: no
	// network at all.
	Egress []string `yaml:"egress"`
	// EgressPermit lists what session owners may add to their own
	// sandbox's allowlist (POST /v1/sessions "egress", PUT …/egress): an
	// entry must be covered by one of these ("*.example.com" covers
	// "api.example.com"). Empty: sessions get only Egress.
	EgressPermit []string `yaml:"egress_permit"`
	// SleepAfter puts an idle sandbox to sleep (workspace saved first);
	// MaxLifetime replaces a sandbox with a fresh one (workspace kept).
	SleepAfter  time.Duration `yaml:"sleep_after"`
	MaxLifetime time.Duration `yaml:"max_lifetime"`
	// SaveInterval is how often a running turn's workspace is saved (it is
	// also saved at the end of every turn).
	SaveInterval time.Duration `yaml:"save_interval"`
	Remote       Remote        `yaml:"remote"`
	// MaxFileBytes is the largest file (or archive) one upload to a
	// workspace may be (0: 1 GiB); WorkspaceQuotaBytes the largest
	// workspace uploads may make (0: none). See docs/automation.md.
	MaxFileBytes        int64 `yaml:"max_file_bytes"`
	WorkspaceQuotaBytes int64 `yaml:"workspace_quota_bytes"`
}

// Remote configures the provisioning hook of remote sandboxes: commands,
// an HTTP endpoint, or VM hosts (`atrium vmhost`).
type Remote struct {
	Create []string `yaml:"create"`
	Delete []string `yaml:"destroy"`
	URL    string   `yaml:"url"`
	// VMHosts are the `atrium vmhost` hosts sandboxes are placed on (by
	// free capacity); their sleeping sandboxes keep their processes.
	VMHosts []VMHost `yaml:"vm_hosts"`
}

// VMHost is one `atrium vmhost`: its API URL and the file holding the
// token it accepts (its own --token-file).
type VMHost struct {
	URL       string `yaml:"url"`
	TokenFile string `yaml:"token_file"`
}

// Defaults of local sandboxes' host uid and workspace quota
// (sandbox.host_uid, sandbox.workspace_disk_bytes; see Sandbox).
const (
	DefaultHostUID            = 231072
	DefaultWorkspaceDiskBytes = 10 << 30
)

// Object-store garbage collection defaults (storage.gc_interval,
// storage.workspace_history, storage.gc_grace).
const (
	DefaultGCInterval       = time.Hour
	DefaultWorkspaceHistory = 24 * time.Hour
	DefaultGCGrace          = time.Hour
)

// Storage configures object storage for workspaces (and, later, history
// checkpoints).
type Storage struct {
	// Type is dir (a local directory; the default) or s3.
	Type string `yaml:"type"`
	Dir  string `yaml:"dir"` // default <data_dir>/objects
	S3   S3     `yaml:"s3"`
	// TenantQuotaBytes limits what each tenant's sessions store (0: no
	// limit); GCInterval is how often a node collects unreferenced
	// workspace objects, WorkspaceHistory how long the workspace as of
	// each turn is kept, GCGrace how old an unreferenced object must be.
	TenantQuotaBytes int64         `yaml:"tenant_quota_bytes"`
	GCInterval       time.Duration `yaml:"gc_interval"`
	WorkspaceHistory time.Duration `yaml:"workspace_history"`
	GCGrace          time.Duration `yaml:"gc_grace"`
}

// S3 configures an S3-compatible object store.
type S3 struct {
	Endpoint  string `yaml:"endpoint"` // host:port
	Bucket    string `yaml:"bucket"`
	Prefix    string `yaml:"prefix"`
	Region    string `yaml:"region"`
	AccessKey string `yaml:"access_key"`
	SecretKey string `yaml:"secret_key" secret:"true"`
	Insecure  bool   `yaml:"insecure"` // plain HTTP (only for loopback or a trusted network)
}

// Load reads a configuration file (path "" means none: defaults only),
// applies environment overrides from getenv, and fills defaults. It does not
// validate: call Validate.
func Load(path string, getenv func(string) string) (*File, error) {
	f := &File{}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		if err := Parse(b, f); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := applyEnv(reflect.ValueOf(f).Elem(), "ATRIUM", getenv); err != nil {
		return nil, err
	}
	f.fillDefaults()
	return f, nil
}

// Parse decodes YAML into f, refusing unknown keys and trailing documents.
func Parse(b []byte, f *File) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(f); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("parse: %w", explainUnknownKeys(err)) // suggest.go
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("parse: more than one YAML document")
	}
	return nil
}

func (f *File) fillDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defDur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&f.Listen, DefaultListen)
	def(&f.DataDir, DefaultDataDir)
	if len(f.Roles) == 0 {
		f.Roles = []string{RoleGateway, RoleNode}
	}
	if f.Node.ID == "" {
		if h, err := os.Hostname(); err == nil {
			f.Node.ID = nodeID(h)
		}
	}
	def(&f.Node.ID, "atrium")
	def(&f.NATS.Name, "atrium-"+f.Node.ID)
	if f.NATS.Replicas == 0 {
		f.NATS.Replicas = DefaultNATSReplicas
	}
	if len(f.NATS.URLs) == 0 {
		defDur(&f.Node.LeaseTTL, DefaultEmbeddedLeaseTTL)
	} else {
		defDur(&f.Node.LeaseTTL, DefaultLeaseTTL)
	}
	defDur(&f.Node.DrainGrace, DefaultDrainGrace)
	defDur(&f.Node.CheckpointInterval, DefaultCheckpointInterval)
	def(&f.Log.Format, DefaultLogFormat)
	def(&f.Log.Level, DefaultLogLevel)
	def(&f.Log.Access, "on")
	def(&f.Sandbox.Provider, "local")
	def(&f.Storage.Type, "dir")
	defDur(&f.Storage.GCInterval, DefaultGCInterval)
	defDur(&f.Storage.WorkspaceHistory, DefaultWorkspaceHistory)
	defDur(&f.Storage.GCGrace, DefaultGCGrace)
	def(&f.Tracing.Protocol, TracingHTTP)
	defDur(&f.Auth.CookieTTL, DefaultCookieTTL)
	defDur(&f.Auth.TokenTTL, 90*24*time.Hour)
	defDur(&f.Auth.TokenLoginMaxAge, 30*24*time.Hour)
	defDur(&f.Node.HibernateAfter, DefaultHibernateAfter)
	defDur(&f.Node.TurnTimeout, DefaultTurnTimeout)
	defDur(&f.Node.CancelGrace, DefaultCancelGrace)
	defDur(&f.Sandbox.SleepAfter, DefaultSleepAfter)
	defDur(&f.Sandbox.MaxLifetime, DefaultMaxLifetime)
	defDur(&f.Sandbox.SaveInterval, DefaultSaveInterval)
	if f.Auth.Mode == AuthOIDC {
		def(&f.Auth.OIDC.UserClaim, "email")
		def(&f.Auth.OIDC.GroupsClaim, "groups")
		def(&f.Auth.OIDC.CLIClientID, f.Auth.OIDC.ClientID)
		if len(f.Auth.OIDC.Scopes) == 0 {
			f.Auth.OIDC.Scopes = []string{"openid", "profile", "email", "offline_access"}
		}
	}
}

// btoi is 1 for true.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Validate checks f for `atrium serve` (dev false) or `atrium dev` (dev
// true) and returns every problem found, each naming its setting.
func (f *File) Validate(dev bool) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if _, _, err := net.SplitHostPort(f.Listen); err != nil {
		bad("listen", "%q is not host:port", f.Listen)
	}
	if f.PublicURL != "" {
		if u, err := url.Parse(f.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("public_url", "%q is not an http(s) URL", f.PublicURL)
		}
	}
	if _, err := auth.ParseTrustedProxies(f.TrustedProxies); err != nil {
		bad("trusted_proxies", "%v", err)
	}
	if f.HistoryCacheBytes < -1 {
		bad("history_cache_bytes", "%d: want a size in bytes, 0 for the default (64 MiB) or -1 for no cache", f.HistoryCacheBytes)
	}
	switch f.Log.Format {
	case "json", "text":
	default:
		bad("log.format", "%q: want json or text", f.Log.Format)
	}
	switch f.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q: want debug, info, warn or error", f.Log.Level)
	}
	if f.Log.Access != "on" && f.Log.Access != "off" {
		bad("log.access", "%q: want on or off", f.Log.Access)
	}
	switch f.Auth.Mode {
	case AuthOIDC:
		o := f.Auth.OIDC
		if o.Issuer == "" {
			bad("auth.oidc.issuer", "required with auth.mode oidc (the URL of your OpenID Connect provider)")
		} else if u, err := url.Parse(o.Issuer); err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && isLoopbackHost(u.Hostname()))) {
			bad("auth.oidc.issuer", "%q must be an https URL (http only for a loopback provider)", o.Issuer)
		}
		if o.ClientID == "" {
			bad("auth.oidc.client_id", "required with auth.mode oidc")
		}
		if o.TenantClaim == "" && o.DefaultTenant == "" {
			bad("auth.oidc.tenant_claim", "set the claim that names a user's tenant (e.g. org), or auth.oidc.default_tenant for a single-tenant install")
		}
		if o.TenantClaim != "" && o.DefaultTenant != "" {
			bad("auth.oidc.default_tenant", "set either tenant_claim or default_tenant, not both (a user without the claim must not fall into the default tenant)")
		}
		errs = append(errs, checkCookieKey(f.Auth.CookieKey)...)
	case AuthTokens:
	case AuthDev:
		// A node alone authenticates nobody: only gateways do.
		if !dev && f.HasRole(RoleGateway) {
			bad("auth.mode", "dev is only for `atrium dev`: choose oidc, or tokens for API-token-only access")
		}
	case "":
		if !dev && f.HasRole(RoleGateway) {
			bad("auth.mode", "required: oidc (with auth.oidc.issuer) or tokens (API tokens only); `atrium serve` never runs without authentication")
		}
	default:
		bad("auth.mode", "%q: want oidc, tokens or dev", f.Auth.Mode)
	}
	if f.Auth.CookieTTL < time.Minute {
		bad("auth.cookie_ttl", "%v is too short (at least 1m)", f.Auth.CookieTTL)
	}
	for key, d := range map[string]time.Duration{
		"node.hibernate_after": f.Node.HibernateAfter, "node.turn_timeout": f.Node.TurnTimeout,
		"node.cancel_grace": f.Node.CancelGrace, "sandbox.sleep_after": f.Sandbox.SleepAfter,
		"sandbox.max_lifetime": f.Sandbox.MaxLifetime, "sandbox.save_interval": f.Sandbox.SaveInterval,
	} {
		if d < 0 {
			bad(key, "must be positive")
		}
	}
	if f.Sandbox.CPUs < 0 {
		bad("sandbox.cpus", "must be positive (0.5 is half a core; 0 means no limit)")
	}
	if f.Sandbox.WorkspaceDiskBytes != 0 && f.Sandbox.WorkspaceDiskBytes != -1 && f.Sandbox.WorkspaceDiskBytes < 16<<20 {
		bad("sandbox.workspace_disk_bytes", "must be at least 16 MiB (16777216), 0 for the default or -1 for no quota")
	}
	if f.Storage.TenantQuotaBytes < 0 {
		bad("storage.tenant_quota_bytes", "must be positive (0: no limit)")
	}
	if f.Storage.GCInterval != 0 && f.Storage.GCInterval < time.Minute {
		bad("storage.gc_interval", "%v is too short (at least 1m)", f.Storage.GCInterval)
	}
	if f.Storage.GCGrace != 0 && f.Storage.GCGrace < time.Minute {
		bad("storage.gc_grace", "%v is too short (at least 1m: it must outlast a file upload's write of content before its manifest)", f.Storage.GCGrace)
	}
	if f.Storage.WorkspaceHistory < 0 {
		bad("storage.workspace_history", "must be positive")
	}
	if f.Sandbox.TmpBytes < 0 {
		bad("sandbox.tmp_bytes", "must be positive (0: the default, 1 GiB)")
	}
	if f.Sandbox.HostUID < -1 || f.Sandbox.HostUID > 1<<31-2 {
		bad("sandbox.host_uid", "must be an unprivileged uid such as 231072 (0: the default where the host supports it, -1: off)")
	}
	if _, err := egress.ParseAllowlist(f.Sandbox.Egress); err != nil {
		bad("sandbox.egress", "%v", err)
	}
	if _, err := egress.ParseAllowlist(f.Sandbox.EgressPermit); err != nil {
		bad("sandbox.egress_permit", "%v", err)
	}
	switch f.Sandbox.Provider {
	case "local":
	case "remote":
		r := f.Sandbox.Remote
		if n := btoi(len(r.Create) > 0) + btoi(r.URL != "") + btoi(len(r.VMHosts) > 0); n != 1 {
			bad("sandbox.remote", "set one of create/destroy commands, url (the provisioning hook) or vm_hosts")
		}
		for i, h := range r.VMHosts {
			if u, err := url.Parse(h.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad(fmt.Sprintf("sandbox.remote.vm_hosts[%d].url", i), "%q: want the VM host's API, e.g. http://10.0.0.5:7000", h.URL)
			}
			if h.TokenFile == "" {
				bad(fmt.Sprintf("sandbox.remote.vm_hosts[%d].token_file", i), "required: the file holding the token the VM host accepts")
			}
		}
		if len(r.Create) > 0 && len(r.Delete) == 0 {
			bad("sandbox.remote.destroy", "required with sandbox.remote.create")
		}
		if f.Storage.Type != "s3" {
			bad("storage.type", "remote sandboxes need s3: they move workspaces only through presigned URLs")
		}
	default:
		bad("sandbox.provider", "%q: want local or remote", f.Sandbox.Provider)
	}
	switch f.Storage.Type {
	case "dir":
	case "s3":
		s := f.Storage.S3
		if s.Endpoint == "" {
			bad("storage.s3.endpoint", "required with storage.type s3 (host:port)")
		} else if strings.Contains(s.Endpoint, "://") {
			bad("storage.s3.endpoint", "%q: give host:port without a scheme (use storage.s3.insecure for http)", s.Endpoint)
		}
		if s.Bucket == "" {
			bad("storage.s3.bucket", "required with storage.type s3")
		}
		if s.AccessKey == "" || s.SecretKey == "" {
			bad("storage.s3.access_key", "access_key and secret_key are required with storage.type s3")
		}
	default:
		bad("storage.type", "%q: want dir or s3", f.Storage.Type)
	}
	errs = append(errs, f.Channels.check()...)
	errs = append(errs, f.Tracing.check()...)
	errs = append(errs, f.Tasks.check()...)
	errs = append(errs, f.Quotas.check()...)
	errs = append(errs, f.Automation.check()...)
	errs = append(errs, f.Models.check()...)
	errs = append(errs, f.checkCluster()...)
	for i, a := range f.Agents {
		if err := a.Validate(); err != nil {
			bad(fmt.Sprintf("agents[%d]", i), "%v", err)
		}
	}
	if _, err := agents.ParseMode(f.AgentMode); err != nil {
		bad("agent_mode", "%q: want ask, auto-edit or auto", f.AgentMode)
	}
	return errors.Join(errs...)
}

// HasRole reports whether this process runs role (RoleGateway, RoleNode).
func (f *File) HasRole(role string) bool {
	for _, r := range f.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// checkCluster returns the problems of roles, nats and the node's cluster
// settings.
func (f *File) checkCluster() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	seen := map[string]bool{}
	for _, r := range f.Roles {
		switch {
		case r != RoleGateway && r != RoleNode:
			bad("roles", "%q: want gateway, node, or both ([gateway, node])", r)
		case seen[r]:
			bad("roles", "%q is listed twice", r)
		}
		seen[r] = true
	}
	n := f.NATS
	external := len(n.URLs) > 0
	if !external && len(f.Roles) > 0 && !(f.HasRole(RoleGateway) && f.HasRole(RoleNode)) {
		bad("nats.urls", "required with roles %v: a gateway and a node in separate processes meet on an external NATS cluster "+
			"(e.g. nats://127.0.0.1:4222); only a process with both roles can embed NATS", f.Roles)
	}
	for _, u := range n.URLs {
		if err := checkNATSURL(u); err != nil {
			bad("nats.urls", "%v", err)
		}
	}
	auths := 0
	for _, set := range []bool{n.Creds != "", n.NKey != "", n.User != "" || n.Password != ""} {
		if set {
			auths++
		}
	}
	if auths > 1 {
		bad("nats.creds", "set one of nats.creds, nats.nkey or nats.user/password, not several")
	}
	if (n.User == "") != (n.Password == "") {
		bad("nats.user", "nats.user and nats.password go together")
	}
	if (n.TLS.Cert == "") != (n.TLS.Key == "") {
		bad("nats.tls.cert", "a client certificate needs both nats.tls.cert and nats.tls.key")
	}
	if !external {
		for key, set := range map[string]bool{"nats.creds": n.Creds != "", "nats.nkey": n.NKey != "", "nats.user": n.User != "",
			"nats.tls": n.TLS != (TLS{})} {
			if set {
				bad(key, "applies only to an external NATS cluster: set nats.urls too (the embedded server needs no credentials)")
			}
		}
	}
	switch {
	case n.Replicas < 1 || n.Replicas > MaxNATSReplicas:
		bad("nats.replicas", "%d: want 1 to %d (3 in a 3-server cluster survives the loss of a server)", n.Replicas, MaxNATSReplicas)
	case n.Replicas > 1 && !external:
		bad("nats.replicas", "%d needs an external NATS cluster of at least %d servers (nats.urls); the embedded server keeps one copy", n.Replicas, n.Replicas)
	}
	if !validNodeID(f.Node.ID) {
		bad("node.id", "%q: use letters, digits, '-' and '_' only (it is a NATS key), at most 64", f.Node.ID)
	}
	if f.Node.LeaseTTL < time.Second {
		bad("node.lease_ttl", "%v is too short (at least 1s; a node renews every third of it)", f.Node.LeaseTTL)
	}
	if f.Node.DrainGrace < 0 {
		bad("node.drain_grace", "must be positive")
	}
	if f.Node.CheckpointInterval < time.Second {
		bad("node.checkpoint_interval", "%v is too short (at least 1s)", f.Node.CheckpointInterval)
	}
	return errs
}

// checkNATSURL checks one server URL of nats.urls.
func checkNATSURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%q is not a URL like nats://host:4222", s)
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Errorf("%q: the scheme must be nats, tls, ws or wss", s)
	}
	if u.User != nil {
		return fmt.Errorf("%q carries credentials: put them in nats.user/nats.password (or ATRIUM_NATS_PASSWORD), nats.creds or nats.nkey", u.Redacted())
	}
	return nil
}

// validNodeID reports whether id can name a node: it is a NATS KV key and a
// connection name.
func validNodeID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// nodeID turns a host name into a node id: its first label, with any other
// character replaced by '-'.
func nodeID(host string) string {
	host, _, _ = strings.Cut(host, ".")
	b := []byte(host)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// CookieKeyBytes decodes auth.cookie_key.
func (f *File) CookieKeyBytes() ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimSpace(f.Auth.CookieKey))
}

func checkCookieKey(k string) []error {
	const how = "generate one with: openssl rand -base64 32"
	if k == "" {
		return []error{fmt.Errorf("auth.cookie_key: required with auth.mode oidc (it seals browser logins); %s", how)}
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(k))
	if err != nil {
		return []error{fmt.Errorf("auth.cookie_key: not valid base64; %s", how)}
	}
	if len(b) < 32 {
		return []error{fmt.Errorf("auth.cookie_key: %d bytes is too short (at least 32); %s", len(b), how)}
	}
	return nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// applyEnv sets every field of v whose variable (prefix + "_" + its YAML key
// path in upper case) is set in the environment.
func applyEnv(v reflect.Value, prefix string, getenv func(string) string) error {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		key, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if key == "" || key == "-" {
			continue
		}
		name := prefix + "_" + strings.ToUpper(key)
		fv := v.Field(i)
		if sf.Type.Kind() == reflect.Struct {
			if err := applyEnv(fv, name, getenv); err != nil {
				return err
			}
			continue
		}
		s := getenv(name)
		if s == "" {
			continue
		}
		if err := setFromString(fv, s); err != nil {
			return fmt.Errorf("environment variable %s: %w", name, err)
		}
	}
	return nil
}

func setFromString(v reflect.Value, s string) error {
	switch {
	case v.Type() == reflect.TypeOf(time.Duration(0)):
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%q is not a duration like 30s or 10m", s)
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.String:
		v.SetString(s)
	case v.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%q is not true or false", s)
		}
		v.SetBool(b)
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		v.SetInt(n)
	case v.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", s)
		}
		v.SetFloat(f)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		var parts []string
		for p := range strings.SplitSeq(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				parts = append(parts, p)
			}
		}
		v.Set(reflect.ValueOf(parts))
	default:
		return fmt.Errorf("cannot be set from the environment")
	}
	return nil
}

// Redacted returns f as YAML with every secret replaced by "<redacted>"
// (or "" when unset), for `atrium config check`.
func (f *File) Redacted() ([]byte, error) {
	c := *f
	redact(reflect.ValueOf(&c).Elem())
	return yaml.Marshal(&c)
}

func redact(v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		fv := v.Field(i)
		if t.Field(i).Type.Kind() == reflect.Struct {
			redact(fv)
			continue
		}
		if t.Field(i).Tag.Get("secret") == "true" && fv.Kind() == reflect.String && fv.String() != "" {
			fv.SetString("<redacted>")
		}
	}
}
