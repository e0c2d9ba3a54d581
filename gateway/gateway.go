// Package gateway is Atrium's stateless front door: it authenticates callers,
// checks their role on a session, and serves the client protocol of DESIGN §7
// (REST, Server-Sent Events and WebSocket) by talking to session actors over
// NATS only. It owns connections and nothing else: one NATS subscription per
// watched session fans each event out to that session's local watchers, every
// connection has one writer and a bounded queue, and a client that reconnects
// resumes by cursor without missing or repeating an event.
//
// The gateway never imports the node (package actor); the contract between
// them is package session.
package gateway

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/web"
	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config.
const (
	// DefaultSendQueue is how many frames may wait for a connection's writer
	// before the connection is closed as a slow consumer.
	DefaultSendQueue = 1024
	// DefaultRequestTimeout bounds one NATS request to a node.
	DefaultRequestTimeout = 10 * time.Second
	// DefaultWriteTimeout bounds one write to a client.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultHeartbeat is how often an idle SSE stream gets a comment line.
	DefaultHeartbeat = 15 * time.Second
	// DefaultPresenceInterval is how often a gateway republishes its watchers
	// of each session.
	DefaultPresenceInterval = 10 * time.Second
	// DefaultPresenceTTL is how long another gateway's list of watchers
	// counts without being refreshed.
	DefaultPresenceTTL = 30 * time.Second
	// DefaultTypingTTL is how long a WebSocket's typing frame marks its
	// watcher as typing in presence; clients repeat it while typing.
	DefaultTypingTTL = 6 * time.Second
	// DefaultTokenRecheck is how often the API token of an open WebSocket
	// or SSE stream is checked again: a connection whose token was revoked
	// or has expired is closed within this time (plus the token cache's
	// auth.DefaultTokenCacheTTL).
	DefaultTokenRecheck = 10 * time.Second
)

// Close codes and reasons of WebSockets (DESIGN §7).
const (
	reasonSlowConsumer = "slow consumer"
	reasonShutdown     = "server shutting down: reconnect"
	reasonDeleted      = "session deleted"
	reasonRevoked      = "access revoked"
	reasonTokenRevoked = "API token revoked or expired"
)

// Config configures a Server. NATS and Auth are required.
type Config struct {
	// NATS is the connection to the NATS system the nodes serve. The caller
	// owns it; Close does not close it.
	NATS *nats.Conn
	// Subjects names the NATS subjects and buckets; the zero value uses
	// session.DefaultPrefix.
	Subjects session.Subjects
	// Auth identifies callers. If it is also an auth.Router, its login
	// routes are served under /auth/; if it is an auth.Refresher, every
	// request passes through its Refresh. API tokens need not be in it:
	// the gateway asks Tokens first.
	Auth auth.Authenticator
	// Tokens is the store of API tokens: it authenticates bearers that
	// start with auth.TokenPrefix (before Auth is asked) and serves
	// /v1/tokens. Nil means a store on NATS, in the bucket
	// "<prefix>_tokens".
	Tokens *auth.Tokens
	// Throttle, if set, slows down addresses that keep failing to
	// authenticate, with API tokens or with Auth. Pass it here rather
	// than wrapping Auth with auth.Throttled, so that token failures count
	// too (and nothing counts twice).
	Throttle *auth.Throttle
	// Audit is the audit log written by the gateway and served at
	// /v1/audit. Nil means a log on NATS (stream audit.DefaultStream);
	// pass one to share it with Auth's login routes or to tune it.
	Audit *audit.Log
	// ID names this gateway in presence messages; default a random id.
	ID string
	// OriginPatterns lists extra origins (host patterns as in path.Match, or
	// "scheme://host" patterns) allowed to open WebSockets and to send
	// state-changing requests. The request's own host is always allowed.
	OriginPatterns []string
	// SendQueue is how many frames may wait for one connection's writer;
	// default DefaultSendQueue.
	SendQueue int
	// FanoutPace is the least time between two wake-ups of the writers of
	// a session with 1,000 local watchers or more (proportionally less with
	// fewer): events broadcast meanwhile are written together (hub.go,
	// topic.broadcastLocked). Default DefaultFanoutPace; negative: none.
	FanoutPace time.Duration
	// HistoryCacheBytes bounds the latest events of watched sessions kept
	// to serve resumes without reading them from the node again
	// (histcache.go); default DefaultHistoryCacheBytes, negative: no cache.
	HistoryCacheBytes int
	// RequestTimeout bounds one request to a node; default
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Replicas is the JetStream replica count of every bucket the gateway
	// may create (the session catalog and owners buckets if no node made
	// them yet, chat channels, webhooks, tasks), as the nodes' is; default 1.
	Replicas int
	// WriteTimeout bounds one write to a client; default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Heartbeat is the SSE heartbeat period; default DefaultHeartbeat.
	Heartbeat time.Duration
	// PresenceInterval and PresenceTTL tune presence; defaults
	// DefaultPresenceInterval and DefaultPresenceTTL.
	PresenceInterval time.Duration
	PresenceTTL      time.Duration
	// TypingTTL is how long a typing frame counts; default DefaultTypingTTL.
	TypingTTL time.Duration
	// TokenRecheck is how often connections opened with an API token check
	// it again; default DefaultTokenRecheck.
	TokenRecheck time.Duration
	// Registry receives the gateway's metrics and is served at /metrics;
	// nil means a new registry that also has the Go and process collectors.
	Registry *prometheus.Registry
	// UI serves the browser UI at /; nil means web.Handler().
	UI http.Handler
	// Channels turns on chat channels (Slack, Telegram) and signed
	// webhooks (docs/channels.md); nil means none.
	Channels *Channels
	// Tasks turns on repository tasks (POST /v1/tasks, gateway/tasks.go);
	// nil means none.
	Tasks *Tasks
	// Automation configures schedules and dead letters
	// (gateway/automation.go); the zero value turns them on.
	Automation Automation
	// ClusterStatus, if set, answers GET /v1/cluster for operators
	// (session.Principal.Operator, and the dev identity) with the JSON of
	// what it returns (`atrium cluster status`); nil: the route is 404.
	ClusterStatus func(ctx context.Context) (any, error)
	// TenantClusterStatus, if set, answers GET /v1/cluster for a tenant
	// admin who is not an operator: the part of the cluster's state that
	// is about tenant's sessions. Nil: tenant admins are refused.
	TenantClusterStatus func(ctx context.Context, tenant string) (any, error)
	// Quotas caps invokes and sets the tenants' quotas (gateway/invoke.go);
	// the zero value has the default invoke caps and no tenant quotas.
	Quotas Quotas
	// TracerProvider, if set, receives spans of requests and of the
	// requests they send to nodes (gateway/trace.go); nil: no tracing.
	TracerProvider trace.TracerProvider
	// Logger receives the gateway's logs; default slog.Default().
	Logger *slog.Logger
	// AccessLog, if set, receives one line per HTTP request when it ends
	// (method, route, path, status, bytes, duration, remote address,
	// request id, caller); nil: no access log.
	AccessLog *slog.Logger
}

// Server is a gateway. Create it with New, serve Handler, and Close it.
type Server struct {
	nc            *nats.Conn
	subj          session.Subjects
	auth          auth.Authenticator // Tokens, then Config.Auth, throttled
	tokens        *auth.Tokens
	audit         *audit.Log
	authFailures  limiter // auth_failed entries, by address
	denials       limiter // denied entries, by caller, session and op
	id            string
	origins       []string
	sendQueue     int
	fanoutPace    time.Duration // negative: none
	reqTimeout    time.Duration
	replicas      int // Config.Replicas, at least 1
	writeTimeout  time.Duration
	heartbeat     time.Duration
	presenceEvery time.Duration
	typingTTL     time.Duration
	presenceTTL   time.Duration
	tokenRecheck  time.Duration
	log           *slog.Logger
	access        *slog.Logger // Config.AccessLog; nil: none
	metrics       *metrics
	tracer        trace.Tracer // nil: tracing off
	handler       http.Handler
	hub           *hub
	replies       *replyMux
	batches       *sync.Pool // see batchConn
	chans         *channels  // nil without Config.Channels
	inv           *invokes   // invoke caps and tenant quotas
	tasks         *tasker    // nil without Config.Tasks

	// prompts sends the REST prompts to one session together
	// (promptbatch.go).
	prompts promptBatcher

	// auto runs schedules and dead letters (automation.go); nil if
	// Config.Automation.Disabled.
	auto *automation

	// cluster is Config.ClusterStatus, tenantCluster
	// Config.TenantClusterStatus.
	cluster       func(ctx context.Context) (any, error)
	tenantCluster func(ctx context.Context, tenant string) (any, error)
	// draining is set by Drain: connections that end then are closed
	// with 1012 "reconnect" (drain.go).
	draining atomic.Bool

	// ctx is cancelled by Close; connections end when it is.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// bg runs the hub's dispatcher, the maintenance ticker, the catalog
	// watcher and the node lease watcher.
	bg sync.WaitGroup
	// conns counts connection handlers and writers; Add only under mu while
	// !closing.
	conns sync.WaitGroup

	mu      sync.Mutex
	closing bool // guarded by mu

	kvMu sync.Mutex
	kv   jetstream.KeyValue // guarded by kvMu; nil until first opened

	// cache is the catalog as watchCatalog last saw it.
	cache catalogCache
	// nodes cancels commands in flight to a node whose lease ends
	// (watchNodes).
	nodes nodeLeases

	closeOnce sync.Once
	closed    chan struct{} // closed when Close has finished
	closeErr  error         // set before closed is closed
}

// New returns a running Server. It starts the goroutines that fan events out;
// Close stops them.
func New(cfg Config) (*Server, error) {
	if cfg.NATS == nil {
		return nil, errors.New("gateway: config needs a NATS connection")
	}
	if cfg.Auth == nil {
		return nil, errors.New("gateway: config needs an authenticator")
	}
	s := &Server{
		nc:            cfg.NATS,
		subj:          cfg.Subjects,
		tokens:        cfg.Tokens,
		audit:         cfg.Audit,
		authFailures:  limiter{every: auditEvery},
		denials:       limiter{every: auditEvery},
		id:            cfg.ID,
		origins:       cfg.OriginPatterns,
		sendQueue:     cfg.SendQueue,
		fanoutPace:    cfg.FanoutPace,
		reqTimeout:    cfg.RequestTimeout,
		replicas:      max(cfg.Replicas, 1),
		writeTimeout:  cfg.WriteTimeout,
		heartbeat:     cfg.Heartbeat,
		presenceEvery: cfg.PresenceInterval,
		presenceTTL:   cfg.PresenceTTL,
		typingTTL:     cfg.TypingTTL,
		tokenRecheck:  cfg.TokenRecheck,
		log:           cfg.Logger,
		access:        cfg.AccessLog,
		tracer:        tracerOf(cfg.TracerProvider),
		closed:        make(chan struct{}),
	}
	if s.id == "" {
		s.id = "gw_" + randomToken(8)
	}
	if s.sendQueue <= 0 {
		s.sendQueue = DefaultSendQueue
	}
	if s.fanoutPace == 0 {
		s.fanoutPace = DefaultFanoutPace
	}
	if s.reqTimeout <= 0 {
		s.reqTimeout = DefaultRequestTimeout
	}
	if s.writeTimeout <= 0 {
		s.writeTimeout = DefaultWriteTimeout
	}
	if s.heartbeat <= 0 {
		s.heartbeat = DefaultHeartbeat
	}
	if s.presenceEvery <= 0 {
		s.presenceEvery = DefaultPresenceInterval
	}
	if s.presenceTTL <= 0 {
		s.presenceTTL = DefaultPresenceTTL
	}
	if s.typingTTL <= 0 {
		s.typingTTL = DefaultTypingTTL
	}
	if s.tokenRecheck <= 0 {
		s.tokenRecheck = DefaultTokenRecheck
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	prefix := cmp.Or(cfg.Subjects.Prefix, session.DefaultPrefix)
	if s.tokens == nil {
		t, err := auth.NewTokens(auth.TokensConfig{NATS: cfg.NATS, Bucket: prefix + "_tokens", Logger: s.log})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		s.tokens = t
	}
	if s.audit == nil {
		l, err := audit.New(audit.Config{NATS: cfg.NATS, Prefix: prefix})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		s.audit = l
	}
	s.auth = auth.Throttled(tokensFirst{tokens: s.tokens, next: cfg.Auth}, cfg.Throttle)
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m, err := newMetrics(s, reg)
	if err != nil {
		return nil, fmt.Errorf("gateway: register metrics: %w", err)
	}
	s.metrics = m
	if s.inv, err = s.newInvokes(cfg.Quotas); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	ui := cfg.UI
	if ui == nil {
		ui = web.Handler()
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if r, ok := cfg.Auth.(auth.Router); ok {
		r.Routes(mux)
	}
	mux.Handle("GET /v1/whoami", s.authed(s.whoami))
	mux.Handle("POST /v1/tokens", s.authed(s.createToken))
	mux.Handle("GET /v1/tokens", s.authed(s.listTokens))
	mux.Handle("DELETE /v1/tokens/{id}", s.authed(s.revokeToken))
	mux.Handle("DELETE /v1/tokens", s.authed(s.revokeUserTokens))
	mux.Handle("GET /v1/audit", s.authed(s.listAudit))
	if cfg.ClusterStatus != nil {
		s.cluster, s.tenantCluster = cfg.ClusterStatus, cfg.TenantClusterStatus
		mux.Handle("GET /v1/cluster", s.authed(s.serveCluster))
	}
	mux.Handle("POST /v1/sessions", s.authed(s.createSession))
	mux.Handle("GET /v1/sessions", s.authed(s.listSessions))
	mux.Handle("GET /v1/sessions/{id}", s.authed(s.getSession))
	mux.Handle("DELETE /v1/sessions/{id}", s.authed(s.deleteSession))
	mux.Handle("PATCH /v1/sessions/{id}", s.authed(s.patchSession)) // settings.go
	mux.Handle("POST /v1/sessions/{id}/messages", s.authed(s.postMessage))
	mux.Handle("POST /v1/sessions/{id}/cancel", s.authed(s.cancelTurn))
	mux.Handle("POST /v1/sessions/{id}/invoke", s.authed(s.invoke))
	mux.Handle("POST /v1/sessions/{id}/invoke/cancel", s.authed(s.cancelInvoke))
	mux.Handle("POST /v1/sessions/{id}/approvals/{aid}", s.authed(s.approve))
	mux.Handle("PUT /v1/sessions/{id}/members/{user}", s.authed(s.putMember))
	mux.Handle("GET /v1/sessions/{id}/secrets", s.authed(s.listSecrets))
	mux.Handle("PUT /v1/sessions/{id}/secrets/{name}", s.authed(s.putSecret))
	mux.Handle("DELETE /v1/sessions/{id}/secrets/{name}", s.authed(s.deleteSecret))
	mux.Handle("PUT /v1/sessions/{id}/egress", s.authed(s.putEgress))
	mux.Handle("GET /v1/sessions/{id}/events", s.authed(s.events))
	mux.Handle("GET /v1/sessions/{id}/ws", s.authed(s.serveWS))
	mux.Handle("GET /v1/agents", s.authed(s.listAgents))
	s.fileRoutes(mux) // files.go
	if cfg.Channels != nil {
		c, err := mountChannels(s, mux, cfg.Channels) // channels.go
		if err != nil {
			return nil, fmt.Errorf("gateway: channels: %w", err)
		}
		s.chans = c
	}
	if s.auto, err = mountAutomation(s, mux, cfg); err != nil { // automation.go
		return nil, err
	}
	if s.tasks, err = mountTasks(s, mux, cfg.Tasks); err != nil { // tasks.go
		return nil, err
	}
	mux.Handle("/v1/", s.authed(s.noRoute))
	mux.Handle("/", ui)
	var h http.Handler = s.traced(s.instrument(mux))
	if r, ok := cfg.Auth.(auth.Refresher); ok {
		h = r.Refresh(h) // outside instrument, which reads the pattern the mux sets on its request.
	}
	s.handler = s.secure(h)
	if d, ok := cfg.Auth.(auth.Describer); ok && d.Describe().Mode == auth.ModeDev {
		s.handler = loopbackHostOnly(s.handler) // DNS rebinding (http.go)
	}

	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.hub = newHub(s, cmp.Or(cfg.HistoryCacheBytes, DefaultHistoryCacheBytes))
	s.replies = &replyMux{nc: s.nc}
	s.batches = newBatchPool()
	s.bg.Go(s.hub.run)
	s.bg.Go(s.maintain)
	s.bg.Go(s.watchCatalog)
	s.bg.Go(s.watchNodes)
	s.bg.Go(s.recheckTokens)
	s.bg.Go(s.runQuotas)
	s.auto.start()
	if s.chans != nil {
		s.chans.svc.Start()
	}
	return s, nil
}

// Handler returns the gateway's HTTP handler: the REST, SSE and WebSocket API
// under /v1/, login routes under /auth/, /healthz, /readyz, /metrics and the
// web UI at /.
func (s *Server) Handler() http.Handler { return s.handler }

// Close closes every WebSocket with 1001 "server shutting down: reconnect",
// ends SSE streams, drains the gateway's NATS subscriptions and waits for its
// goroutines, or until ctx is done. It is safe to call more than once.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		go s.shutdown() // owned: Close waits for s.closed below.
	})
	select {
	case <-s.closed:
		return s.closeErr
	case <-ctx.Done():
		return fmt.Errorf("gateway: close: %w", ctx.Err())
	}
}

func (s *Server) shutdown() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	if s.chans != nil {
		s.chans.close()
	}
	closeTasks(s.tasks, s.log)
	s.cancel(errors.New("gateway: closed"))
	s.auto.close()
	s.conns.Wait()
	s.hub.close()
	s.replies.close()
	s.bg.Wait()
	s.closeErr = nil
	close(s.closed)
}

// track counts a connection goroutine so Close waits for it; false means the
// server is closing and the connection must not start.
func (s *Server) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.conns.Add(1)
	return true
}

// presenceDebounce is how long presence changes gather before they are
// published and sent.
const presenceDebounce = 100 * time.Millisecond

// maintain flushes presence changes, republishes presence, expires other
// gateways' presence and sends SSE heartbeats until the server closes.
func (s *Server) maintain() {
	presence := time.NewTicker(s.presenceEvery)
	defer presence.Stop()
	heartbeat := time.NewTicker(s.heartbeat)
	defer heartbeat.Stop()
	typing := time.NewTicker(s.typingTTL / 4)
	defer typing.Stop()
	debounce := time.NewTimer(presenceDebounce)
	defer debounce.Stop()
	debounce.Stop()
	pending := false // debounce is armed
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.hub.kick:
			if !pending {
				pending = true
				debounce.Reset(presenceDebounce)
			}
		case now := <-debounce.C:
			pending = false
			s.hub.flushPresence(now)
		case now := <-presence.C:
			s.hub.refreshPresence(now)
		case <-heartbeat.C:
			s.hub.heartbeat()
		case now := <-typing.C:
			s.hub.expireTyping(now)
		}
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	switch {
	case closing:
		writeError(w, session.Errorf(session.CodeUnavailable, "the gateway is shutting down"))
	case !s.nc.IsConnected():
		writeError(w, session.Errorf(session.CodeUnavailable, "not connected to NATS (status %s)", s.nc.Status()))
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	}
}

// recheckTokens closes connections whose API token was revoked or has
// expired since they were opened, checking every tokenRecheck until the
// server closes. A token store that cannot be reached closes nothing.
func (s *Server) recheckTokens() {
	t := time.NewTicker(s.tokenRecheck)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		for _, w := range s.hub.tokenWatchers() {
			ctx, cancel := context.WithTimeout(s.ctx, s.reqTimeout)
			_, err := s.tokens.Verify(ctx, w.token)
			cancel()
			if errors.Is(err, session.ErrUnauthenticated) {
				w.q.finish(ending{code: websocket.StatusPolicyViolation, reason: reasonTokenRevoked})
			}
		}
	}
}

// apiToken returns the API token a request authenticated p with, if any.
func apiToken(r *http.Request, p session.Principal) string {
	if p.Via != session.ViaToken {
		return ""
	}
	h := r.Header.Get("Authorization")
	if len(h) < len("bearer ") {
		return ""
	}
	return strings.TrimSpace(h[len("bearer "):])
}

// tokensFirst authenticates API tokens with the token store and every other
// credential with next.
type tokensFirst struct {
	tokens *auth.Tokens
	next   auth.Authenticator
}

func (a tokensFirst) Authenticate(r *http.Request) (session.Principal, error) {
	p, err := a.tokens.Authenticate(r)
	if errors.Is(err, auth.ErrNoCredentials) {
		p, err = a.next.Authenticate(r)
		if err == nil {
			a.tokens.NoteLogin(r.Context(), p) // the owner's latest claims cap their tokens
		}
	}
	return p, err
}

var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand never fails on Linux.
	return tokenEncoding.EncodeToString(b)
}
