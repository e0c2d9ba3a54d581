// Package actor is the node: it hosts one protoactor-go actor per active
// session (in-process only), serves the NATS protocol of package session
// (place requests in a queue group, one Cmd subscription per active session),
// keeps each session's event log through a History, runs the session's
// harness turn by turn in a compute sandbox, and hibernates idle sessions.
// A session's sandbox outlives the actor's activations: the host keeps it
// (sandboxes.go), saves its workspace to an object store (compute/mount) at
// the end of every turn, periodically and before sleep, restores it when a
// sandbox is provisioned or woken, puts idle sandboxes to sleep (activating
// a hibernated session to log it), replaces sandboxes past their lifetime
// and recovers from sandboxes that die.
//
// With several nodes on one NATS cluster, a session is served by the node
// holding its ownership lease in the owners bucket (lease.go), whose
// revision fences its sandbox, workspace saves and checkpoints; its events
// are captured by a JetStream stream before they are acknowledged
// (capture.go); its history is checkpointed to an object store
// (checkpoint.go); and a node taking a session over restores the newest
// checkpoint and replays the stream after it (takeover.go).
//
// A manager actor owns the session actors: it spawns them, supervises them
// (a panicking session restarts from its history file) and buffers place
// requests for a session whose actor is stopping until its Terminated
// arrives. A session actor is the only writer of its history. It never blocks
// in Receive: commits run on a committer goroutine it owns (group commit),
// history reads on the host's read pool, and turns on a runner goroutine that
// sends output back as messages.
package actor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// Defaults of Config.
const (
	DefaultHibernateAfter = 30 * time.Second
	DefaultTurnTimeout    = 30 * time.Minute
	DefaultCancelGrace    = 5 * time.Second
	DefaultMaxTurnOutput  = 8 << 20
	DefaultReaders        = 4
	// DefaultCatalogInterval is how often at most an active session
	// rewrites its catalog entry while its last_seq changes.
	DefaultCatalogInterval = time.Second
	// DefaultSandboxSleepAfter is how long a sandbox stays awake without a
	// turn before its workspace is saved and it sleeps.
	DefaultSandboxSleepAfter = 10 * time.Minute
	// DefaultSandboxMaxLifetime is how long a sandbox is used before the
	// next turn replaces it with a fresh one (workspace kept).
	DefaultSandboxMaxLifetime = 24 * time.Hour
	// DefaultSaveInterval is how often the workspace is saved while a turn
	// runs (it is also saved at the end of every turn).
	DefaultSaveInterval = 5 * time.Minute
)

// startTimeout bounds Start when its context has no deadline. Its steps
// are retried within it (RetryStartup): long enough for a NATS cluster that
// starts with the node to form.
const startTimeout = 2 * time.Minute

// ShellTemplate is the argv of the built-in "shell" harness template: it
// consumes the contract's first stdin line and runs the prompt (passed in
// ATRIUM_PROMPT) with bash.
var ShellTemplate = []string{"bash", "-lc", `IFS= read -r _atrium_input; eval "$ATRIUM_PROMPT"`}

// Config configures a Host. NATS, Histories and Provider are required.
type Config struct {
	// NATS is the connection the host serves on. The caller owns it. Give
	// it nats.ReconnectBufSize(-1): a message buffered while disconnected
	// would be sent after the reconnect, when the session may have another
	// owner.
	NATS *nats.Conn
	// Subjects names the subjects and buckets; the zero value uses the
	// default prefix.
	Subjects session.Subjects
	// Histories opens and creates session history files.
	Histories Histories
	// SecretKeys encrypts sessions' secrets at rest: their metadata holds
	// only ciphertext. Nil: secrets cannot be set (the error says to
	// configure a key); secrets stored in clear before still work.
	SecretKeys *session.SecretKeyring
	// Provider provisions sandboxes for turns.
	Provider Provider
	// SandboxKind says what Provider runs sandboxes on
	// (session.SandboxKindLocal, …), shown in Session objects; "" if
	// unknown.
	SandboxKind string
	// SandboxSpec holds the limits of every sandbox (MemoryBytes, Pids,
	// Network); the node sets Session and Fence.
	SandboxSpec compute.Spec
	// EgressPermit lists the egress allowlist entries owners may ask for
	// their sessions (compute/egress syntax): a session's entry must be
	// covered by one of them ("*.example.com" covers "api.example.com").
	// Empty: sessions cannot open any egress of their own. A session's
	// sandbox gets SandboxSpec.Egress plus its own entries.
	EgressPermit []string
	// Store is the object store sandboxes' workspaces are saved to
	// (DESIGN §6): restored when a sandbox is provisioned or woken, saved
	// at the end of each turn, every SaveInterval during a turn, before
	// sleep and before the node stops. nil keeps workspaces only in their
	// sandboxes.
	Store blob.Store
	// WorkspaceOf returns the workspace of a sandbox handle that Provider
	// returned, for a mount.Volume in Store. Required with Store.
	WorkspaceOf func(compute.Sandbox) (mount.Workspace, error)
	// SandboxGeneration, if set, counts the machines the provider has
	// created for a session. A provider that replaces a dead machine
	// inside Sandbox.Exec (compute/remote) would otherwise run a turn on a
	// workspace that was never restored; the node notices the count change
	// and fails the turn instead, restoring at the next.
	SandboxGeneration func(session.ID) uint64
	// SandboxSleepAfter is how long a sandbox stays awake without a turn
	// (DefaultSandboxSleepAfter if zero); waiting on a model or an approval
	// is part of a turn.
	SandboxSleepAfter time.Duration
	// SandboxMaxLifetime is the age at which the next turn replaces a
	// sandbox with a fresh one; DefaultSandboxMaxLifetime if zero.
	SandboxMaxLifetime time.Duration
	// SaveInterval is how often a running turn's workspace is saved;
	// DefaultSaveInterval if zero.
	SaveInterval time.Duration
	// NodeID names this node in logs, leases and catalog entries; when set,
	// the node also takes place requests on its own subject
	// (session.Subjects.PlaceOn), so sessions wake where their history is.
	NodeID string
	// HibernateAfter is how long an idle session stays active;
	// DefaultHibernateAfter if zero.
	HibernateAfter time.Duration
	// TurnTimeout bounds one turn; DefaultTurnTimeout if zero.
	TurnTimeout time.Duration
	// CancelGrace is the time between SIGTERM and SIGKILL when a turn is
	// cancelled, times out or the host shuts down; DefaultCancelGrace if zero.
	CancelGrace time.Duration
	// MaxTurnOutput is how many bytes of harness output one turn may log;
	// the rest is discarded. DefaultMaxTurnOutput if zero.
	MaxTurnOutput int64
	// Templates are named harness argvs; "shell" is built in (ShellTemplate)
	// unless given here.
	Templates map[string][]string
	// Readers is the number of goroutines serving history reads;
	// DefaultReaders if zero.
	Readers int
	// CatalogInterval is how often at most an active session rewrites its
	// catalog entry (last_seq, sandbox state) while events are committed;
	// the end of a turn, a membership change and hibernation rewrite it at
	// once. DefaultCatalogInterval if zero.
	CatalogInterval time.Duration
	// Registerer receives the node's Prometheus metrics (actor/metrics.go);
	// nil registers them nowhere.
	Registerer prometheus.Registerer
	// TracerProvider, if set, receives spans of commands, turns, sandbox
	// operations and workspace saves and restores (actor/trace.go),
	// children of the gateways' spans; nil: no tracing.
	TracerProvider trace.TracerProvider
	// Logger receives the host's and protoactor's logs; slog.Default() if nil.
	Logger *slog.Logger

	// Scale-out (actor/lease.go, actor/checkpoint.go, actor/takeover.go).

	// LeaseTTL is the TTL of ownership leases (the owners bucket's TTL):
	// a session of a node that died is taken over after at most this
	// long. Leases are renewed every LeaseTTL/3; a node that could not
	// renew for LeaseTTL*2/3 stops the session. DefaultLeaseTTL if zero.
	LeaseTTL time.Duration
	// Replicas is the JetStream replica count of the buckets and the
	// events stream the node creates (or updates); DefaultReplicas if
	// zero. Use 3 on a 3-server NATS cluster.
	Replicas int
	// EventsMaxAge is how long the events stream keeps messages;
	// DefaultEventsMaxAge if zero. It must be far longer than the time
	// between checkpoints (see DefaultEventsMaxAge).
	EventsMaxAge time.Duration
	// StoreFull, when set, reports why the JetStream store cannot take
	// writes now (embedded.Guard.Err: the disk of an embedded server is
	// full). Captures then fail at once with that reason, which callers
	// are told, instead of waiting for acknowledgements that never come.
	StoreFull func() error
	// Checkpoints is the object store history checkpoints are written to
	// (sessions/<id>/history/…): at hibernation, every CheckpointInterval
	// while active and when the node drains. A node taking a session over
	// restores the newest one and replays the events stream after it. nil:
	// no checkpoints; another node can still rebuild a session from the
	// stream while the stream holds all of it.
	Checkpoints blob.Store
	// CheckpointInterval is how often an active session is checkpointed;
	// DefaultCheckpointInterval if zero.
	CheckpointInterval time.Duration
	// DrainGrace is how long Close lets running turns finish before it
	// cancels them; DefaultDrainGrace if zero.
	DrainGrace time.Duration

	// Files limits file operations on workspaces (files.go).
	Files FilesConfig

	// Agents (actor/agent.go).

	// Agents is the catalog of the ACP agents sessions may run; nil: the
	// node runs no agents, and creating an agent session fails.
	Agents Agents
	// Models is the node's model gateway; nil: agents get no model
	// endpoints.
	Models Models
	// ApprovalTimeout is how long an agent's permission request waits for
	// a driver's answer before it is rejected; DefaultApprovalTimeout if
	// zero.
	ApprovalTimeout time.Duration
}

// Host runs the session actors of one node. Create it with New, serve with
// Start, stop with Close.
type Host struct {
	cfg       Config
	log       *slog.Logger
	templates map[string][]string
	egress    *egressPolicy
	manifests manifestCache // saved workspaces read by file operations (files.go)

	system  *proto.ActorSystem
	manager *proto.PID
	// managerDone is closed when the manager has stopped every session after
	// a shutdown request; managerStopped when the manager itself stopped.
	managerDone    chan struct{}
	managerStopped chan struct{}

	kv      jetstream.KeyValue
	owners  OwnerStore // ownership leases (lease.go, cluster.go)
	js      jetstream.JetStream
	events  EventStore // captures events and metadata (capture.go, cluster.go)
	catalog *catalogWriter
	boxes   *sandboxes
	agents  agentSet // the agent processes' goroutines (agent.go)
	// serving is set while the manager takes messages (Start to Close).
	serving atomic.Bool
	reads   chan readJob
	// hibernating bounds the hibernations writing to disk at once
	// (hibernateSlot in session.go).
	hibernating chan struct{}
	place       *nats.Subscription
	// placeOn is the subscription to this node's own place subject
	// (Subjects.PlaceOn(NodeID)), nil without a NodeID: placement affinity.
	placeOn *nats.Subscription
	metrics *metrics
	tracer  trace.Tracer // nil: tracing off
	// stopResume ends resume, which activates the sessions that were
	// active when the node last stopped.
	stopResume context.CancelFunc

	// ctx is cancelled when Close gives up waiting; goroutines use it to
	// bound their blocking calls.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // every goroutine the host and its sessions start

	// node is the node's lease (lease.go); closing stopNode ends its
	// renewer.
	node     *nodeLease
	stopNode chan struct{}
	// storeFullStops maps a session stopped because the JetStream store
	// was full to a storeFullStop, said in an error event once it is
	// served again (lease.go, takeover.go).
	storeFullStops sync.Map

	leaseMu sync.Mutex
	leases  map[session.ID]*lease // guarded by leaseMu: the sessions held
	// released maps a session whose record this node released to what it
	// remembers of it; guarded by leaseMu.
	released map[session.ID]releasedLease

	mu       sync.Mutex
	started  bool  // guarded by mu
	closed   bool  // guarded by mu
	closeErr error // guarded by mu

	// beforeCmd, when set (by tests, before Start), runs in a session actor
	// before each command it handles; a panic there exercises supervision.
	beforeCmd func(id session.ID, c *session.Command)
	// now is the clock of sandbox lifetimes; tests replace it before Start.
	now func() time.Time
	// spawned, when set (by tests, before the first session), is told of
	// every session actor made.
	spawned func(s *sessionActor)
	// afterLeaseLost, when set (by tests, before Start), runs in a session
	// actor once it has stopped because it lost its lease.
	afterLeaseLost func(id session.ID)
	// rescueHook, when set (by tests), replaces rescue once this node has
	// claimed the rescue of a node whose lease ended.
	rescueHook func(node string)
}

// New validates cfg, fills in defaults and returns a Host that is not yet
// serving.
func New(cfg Config) (*Host, error) {
	if cfg.NATS == nil {
		return nil, errors.New("new host: NATS connection is required")
	}
	if cfg.Histories == nil {
		return nil, errors.New("new host: Histories is required")
	}
	if cfg.Provider == nil {
		return nil, errors.New("new host: Provider is required")
	}
	if cfg.HibernateAfter <= 0 {
		cfg.HibernateAfter = DefaultHibernateAfter
	}
	if cfg.TurnTimeout <= 0 {
		cfg.TurnTimeout = DefaultTurnTimeout
	}
	if cfg.CancelGrace <= 0 {
		cfg.CancelGrace = DefaultCancelGrace
	}
	if cfg.MaxTurnOutput <= 0 {
		cfg.MaxTurnOutput = DefaultMaxTurnOutput
	}
	if cfg.Readers <= 0 {
		cfg.Readers = DefaultReaders
	}
	if cfg.CatalogInterval <= 0 {
		cfg.CatalogInterval = DefaultCatalogInterval
	}
	if cfg.SandboxSleepAfter <= 0 {
		cfg.SandboxSleepAfter = DefaultSandboxSleepAfter
	}
	if cfg.SandboxMaxLifetime <= 0 {
		cfg.SandboxMaxLifetime = DefaultSandboxMaxLifetime
	}
	if cfg.SaveInterval <= 0 {
		cfg.SaveInterval = DefaultSaveInterval
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = DefaultReplicas
	}
	if cfg.EventsMaxAge <= 0 {
		cfg.EventsMaxAge = DefaultEventsMaxAge
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = DefaultCheckpointInterval
	}
	if cfg.DrainGrace <= 0 {
		cfg.DrainGrace = DefaultDrainGrace
	}
	if cfg.ApprovalTimeout <= 0 {
		cfg.ApprovalTimeout = DefaultApprovalTimeout
	}
	if cfg.Store != nil && cfg.WorkspaceOf == nil {
		return nil, errors.New("new host: WorkspaceOf is required with Store")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.NodeID == "" {
		// The node lease needs a name; one for this process only.
		cfg.NodeID = "node-" + session.NewEpoch()
	}
	templates := map[string][]string{session.DefaultTemplate: ShellTemplate}
	for name, argv := range cfg.Templates {
		if len(argv) == 0 {
			return nil, fmt.Errorf("new host: harness template %q has an empty command", name)
		}
		templates[name] = argv
	}
	pol, err := newEgressPolicy(cfg.SandboxSpec.Egress, cfg.EgressPermit, cfg.SandboxSpec.Network)
	if err != nil {
		return nil, fmt.Errorf("new host: %w", err)
	}
	log := cfg.Logger
	if cfg.NodeID != "" {
		log = log.With("node", cfg.NodeID)
	}
	h := &Host{
		cfg:            cfg,
		log:            log,
		templates:      templates,
		egress:         pol,
		managerDone:    make(chan struct{}),
		managerStopped: make(chan struct{}),
		leases:         map[session.ID]*lease{},
		released:       map[session.ID]releasedLease{},
		hibernating:    make(chan struct{}, maxHibernating),
		now:            time.Now,
	}
	h.boxes = &sandboxes{h: h, boxes: map[session.ID]*box{}}
	h.tracer = tracerOf(cfg.TracerProvider)
	m, err := newMetrics(h, cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("new host: register metrics: %w", err)
	}
	h.metrics = m
	h.ctx, h.cancel = context.WithCancelCause(context.Background())
	return h, nil
}

// Start creates (or opens) the catalog bucket, starts the actor system and
// subscribes to the place subject. When it returns, the node serves; in the
// background it then activates every session the catalog says was active
// (see resume), so interrupted turns are finished and queued prompts run
// with nobody connected.
func (h *Host) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started || h.closed {
		return errors.New("start host: already started or closed")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	js, err := jetstream.New(h.cfg.NATS, jetstream.WithPublishAsyncTimeout(captureTimeout))
	if err != nil {
		return fmt.Errorf("start host: jetstream: %w", err)
	}
	h.js = js
	// Each JetStream step is retried until it succeeds (startup.go).
	kv, err := RetryStartup(ctx, h.log, "open the catalog bucket", func(ctx context.Context) (jetstream.KeyValue, error) {
		return openCatalog(ctx, js, &h.cfg)
	})
	if err != nil {
		return fmt.Errorf("start host: %w", err)
	}
	h.kv = kv
	owners, err := RetryStartup(ctx, h.log, "open the owners bucket", func(ctx context.Context) (jetstream.KeyValue, error) {
		return openOwners(ctx, js, &h.cfg)
	})
	if err != nil {
		return fmt.Errorf("start host: %w", err)
	}
	h.owners = ajs.NewOwners(h.cfg.NATS, js, owners, h.cfg.Subjects.OwnersBucket())
	events, err := RetryStartup(ctx, h.log, "open the events stream", func(ctx context.Context) (jetstream.Stream, error) {
		return openEvents(ctx, js, &h.cfg)
	})
	if err != nil {
		return fmt.Errorf("start host: %w", err)
	}
	h.events = ajs.NewEvents(h.cfg.NATS, js, events, h.cfg.Subjects.EventsStream(), h.log)
	h.node = &nodeLease{h: h, key: session.NodeLeaseKey(h.cfg.NodeID)}
	if _, err := RetryStartup(ctx, h.log, "take the node lease", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, h.node.acquire(ctx)
	}); err != nil {
		return fmt.Errorf("start host: %w", err)
	}
	h.stopNode = make(chan struct{})
	h.wg.Go(func() { h.node.run(h.stopNode) })
	h.catalog = newCatalogWriter(kv, h.log)
	h.wg.Go(h.catalog.run)

	h.reads = make(chan readJob, readQueue)
	for range h.cfg.Readers {
		h.wg.Go(h.readLoop)
	}

	plog := h.log.With("lib", "protoactor")
	h.system = proto.NewActorSystem(
		proto.WithLoggerFactory(func(*proto.ActorSystem) *slog.Logger { return plog }),
		// The dead-letter throttle runs a goroutine for one interval; keep
		// it short so a stopped host leaves nothing behind for long.
		proto.WithDeadLetterThrottleInterval(50*time.Millisecond),
		proto.WithDeadLetterRequestLogging(false),
	)
	compactRegistry(h.system) // hostmem.go
	props := proto.PropsFromProducer(func() proto.Actor { return newManager(h) },
		proto.WithSupervisor(proto.NewOneForOneStrategy(maxRestarts, restartWindow, restartDecider)))
	h.manager, err = h.system.Root.SpawnNamed(props, "sessions")
	if err != nil {
		h.stopWorkersLocked()
		return fmt.Errorf("start host: spawn manager: %w", err)
	}

	subjects := h.cfg.Subjects.Place()
	h.place, err = h.cfg.NATS.QueueSubscribe(h.cfg.Subjects.Place(), h.cfg.Subjects.PlaceQueue(), h.onPlace)
	// Placement affinity: gateways ask this node by name first to activate
	// a session whose history file is on its disk (CatalogEntry.Node).
	if err == nil && h.cfg.NodeID != "" {
		subjects += " and " + h.cfg.Subjects.PlaceOn(h.cfg.NodeID)
		h.placeOn, err = h.cfg.NATS.Subscribe(h.cfg.Subjects.PlaceOn(h.cfg.NodeID), h.onPlace)
	}
	if err == nil {
		err = h.cfg.NATS.FlushWithContext(ctx)
	}
	if err != nil {
		for _, sub := range []*nats.Subscription{h.place, h.placeOn} {
			if sub != nil {
				sub.Unsubscribe()
			}
		}
		h.system.Root.Stop(h.manager)
		<-h.managerStopped
		h.stopWorkersLocked()
		return fmt.Errorf("start host: subscribe %s: %w", subjects, err)
	}
	h.started = true
	h.serving.Store(true)
	h.log.Info("node serving", "subject", h.cfg.Subjects.Place())
	var rctx context.Context
	rctx, h.stopResume = context.WithCancel(context.Background())
	h.wg.Go(func() { h.resume(rctx) })
	h.wg.Go(func() { h.watchNodes(rctx) })
	return nil
}

// Close drains the node (the SIGTERM path): it stops taking place requests,
// lets running turns finish for up to DrainGrace and then cancels them
// (SIGTERM, then SIGKILL after CancelGrace; turn_finished "cancelled" after
// an error event saying why), commits everything pending, checkpoints and
// closes every history, releases the leases and shuts the actor system
// down. Queued prompts do not run here: a session that has some is placed
// again once its lease is released, so another node runs them, and stays
// "active" in the catalog, so the next Start resumes it if no node did. If
// ctx ends first, sessions are stopped at once. It is safe to call twice.
func (h *Host) Close(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return h.closeErr
	}
	h.closed = true
	h.serving.Store(false)
	if !h.started {
		h.cancel(errors.New("host closed"))
		return nil
	}
	h.stopResume()
	var errs []error
	switch err := h.drainPlace(); {
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected):
		// Nothing to wait for: the subscription ended with the connection,
		// or cannot drain while cut off.
	case err != nil:
		errs = append(errs, fmt.Errorf("drain place subscription: %w", err))
	default:
		waitSubClosed(ctx, h.place)
		if h.placeOn != nil {
			waitSubClosed(ctx, h.placeOn)
		}
	}
	h.system.Root.Send(h.manager, &shutdown{})
	select {
	case <-h.managerDone:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("close host: stopping sessions at once: %w", context.Cause(ctx)))
		h.cancel(context.Cause(ctx))
	}
	h.boxes.close()
	h.agents.close()
	h.system.Root.Stop(h.manager)
	<-h.managerStopped
	h.stopWorkersLocked()
	h.system.Shutdown()
	h.closeErr = errors.Join(errs...)
	return h.closeErr
}

// drainPlace drains the place subscriptions (the queue group's and, with a
// NodeID, the node's own); cut off from NATS it only unsubscribes
// (ErrDisconnected), since a drain would wait for the server.
func (h *Host) drainPlace() error {
	subs := []*nats.Subscription{h.place}
	if h.placeOn != nil {
		subs = append(subs, h.placeOn)
	}
	if !h.cfg.NATS.IsConnected() {
		for _, sub := range subs {
			sub.Unsubscribe()
		}
		return nats.ErrDisconnected
	}
	var errs []error
	for _, sub := range subs {
		errs = append(errs, sub.Drain())
	}
	return errors.Join(errs...)
}

// stopWorkersLocked stops the read pool, the catalog writer (flushing it)
// and the node lease's renewer, waits for every goroutine of the host and
// releases the node lease: no session is left that it holds.
func (h *Host) stopWorkersLocked() {
	close(h.reads)
	h.catalog.stop()
	close(h.stopNode)
	h.wg.Wait()
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.LeaseTTL)
	h.node.release(ctx)
	cancel()
	h.cancel(errors.New("host closed"))
}

// waitSubClosed waits until a draining subscription has closed or ctx ends.
func waitSubClosed(ctx context.Context, sub *nats.Subscription) {
	ch := sub.StatusChanged(nats.SubscriptionClosed)
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// onPlace runs on the place subscription's goroutine.
func (h *Host) onPlace(msg *nats.Msg) {
	p, err := h.parsePlace(msg)
	if err != nil {
		respond(msg, errorReply(err))
		return
	}
	h.system.Root.Send(h.manager, p)
}

// Supervision of session actors: restart from the history file, but stop a
// session that keeps failing.
const (
	maxRestarts   = 5
	restartWindow = 10 * time.Second
)

func restartDecider(any) proto.Directive { return proto.RestartDirective }
