package channel

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	// DefaultLeaseTTL is how long a gateway's lease on driving a session
	// lasts without renewal: after a gateway dies, another takes its
	// sessions over within about this long.
	DefaultLeaseTTL = 30 * time.Second
	// DefaultIdleAfter is how long a driver waits for more events before
	// it lets its session go.
	DefaultIdleAfter = 30 * time.Second
	// DefaultDedupeTTL is how long a platform event id is remembered
	// (Slack retries for about an hour; Telegram for a day).
	DefaultDedupeTTL = 25 * time.Hour
	// DefaultEditEvery spaces out edits of one message (Slack allows
	// about one message per second per channel).
	DefaultEditEvery = 2 * time.Second
	// DefaultInlineOutput is the most output shown in a result message;
	// longer output is attached as a file.
	DefaultInlineOutput = 2500
	// DefaultMaxFileBytes is the most output attached as a file.
	DefaultMaxFileBytes = 1 << 20
	// DefaultTimeout bounds one read or write of a bucket.
	DefaultTimeout = 5 * time.Second
	// DefaultRetryMin and DefaultRetryMax bound the backoff of failed
	// deliveries.
	DefaultRetryMin = 500 * time.Millisecond
	DefaultRetryMax = 30 * time.Second
	// DefaultThreadRole is the role of known people of a session's tenant
	// who speak in its thread without one.
	DefaultThreadRole = session.RoleDriver
)

// NoRole, as Config.ThreadRole, gives nobody a role for speaking in a
// thread: the session's owner shares it as in the web UI.
const NoRole session.Role = "none"

// Webhooks delivers events to outbound webhook targets (gateway/hooks).
type Webhooks interface {
	// Deliver sends one event of session id to target; attempt counts from
	// 1. An error wrapping ErrPermanent is not retried.
	Deliver(ctx context.Context, target string, id session.ID, event json.RawMessage, attempt int) error
}

// Config configures a Service. NATS and Sessions are required.
type Config struct {
	// NATS is the connection the gateway uses; the caller owns it.
	NATS *nats.Conn
	// Subjects names the NATS subjects and buckets of sessions; the
	// service's own buckets are "<prefix>_channels" (bindings),
	// "<prefix>_channel_dedupe" and "<prefix>_channel_leases".
	Subjects session.Subjects
	// Sessions runs commands on sessions, as the gateway does.
	Sessions Sessions
	// Webhooks delivers outbound webhooks; nil if there are none.
	Webhooks Webhooks
	// Tasks starts repository tasks for "task" commands; nil: they answer
	// that tasks are not set up.
	Tasks Tasks
	// Identity maps platform users to Atrium users.
	Identity Identity
	// PublicURL is the web UI's address; messages link to
	// <PublicURL>/s/<session id>. Empty: no links.
	PublicURL string
	// ThreadRole is the role given to a known person of the session's
	// tenant who speaks in (or presses a button of) a session's thread and
	// has no role on it yet: DefaultThreadRole, session.RoleViewer, or
	// NoRole. An explicit role (set by the owner) is never changed.
	ThreadRole session.Role
	// Gateway names this gateway in leases; default a random id.
	Gateway string
	// LeaseTTL, IdleAfter and DedupeTTL: see the Default constants.
	LeaseTTL  time.Duration
	IdleAfter time.Duration
	DedupeTTL time.Duration
	// EditEvery is the least time between two edits of a message.
	EditEvery time.Duration
	// InlineOutput and MaxFileBytes: see the Default constants.
	InlineOutput int
	MaxFileBytes int
	// Retry is the backoff of chat deliveries, retried for as long as the
	// process lives (Attempts is ignored); HookRetry is that of webhook
	// deliveries, which Webhooks.Deliver ends by returning ErrPermanent
	// (or after HookRetry.Attempts tries, if set).
	Retry     Backoff
	HookRetry Backoff
	// Timeout bounds one read or write of a bucket; default DefaultTimeout.
	Timeout time.Duration
	// Replicas is the JetStream replica count of the service's buckets;
	// default 1.
	Replicas int
	// Now returns the current time; default time.Now.
	Now func() time.Time
	// Logger receives the service's logs; default slog.Default().
	Logger *slog.Logger
}

// Service connects chat platforms and webhooks to sessions. Adapters call
// Receive, Press and Command with what people do; the service answers
// through the adapters' Channel methods, from the events of the sessions.
//
// Each session with a thread or webhooks is driven by one gateway at a time:
// the one that holds its lease (a key in "<prefix>_channel_leases", created
// with Create, renewed with Update at its revision, and expiring after
// LeaseTTL). A plain NATS queue group would hand consecutive events of one
// session to different gateways, whose posts and edits would then race; the
// lease keeps each thread's messages in order and lets a driver edit the
// messages it posted. A gateway starts driving a session when its own users
// act on it, and when the session catalog (which every gateway watches)
// shows events the binding's cursor has not reached: so a session prompted
// from the web UI, or left behind by a gateway that died, is picked up by
// whichever gateway creates the lease first.
//
// Create it with New, Register the adapters, Start it, and Close it.
type Service struct {
	cfg Config
	log *slog.Logger
	st  *store
	dir *directory

	// ctx ends the watchers and makes drivers stop reading events; hard
	// ends deliveries too (Close, when its deadline passes).
	ctx      context.Context
	cancel   context.CancelFunc
	hard     context.Context
	stopHard context.CancelFunc
	bg       sync.WaitGroup // watchers, sweeper, direct queue
	drivers  sync.WaitGroup
	direct   *queue // replies to people, outside any session

	mu       sync.Mutex
	channels map[string]Channel           // guarded by mu
	started  bool                         // guarded by mu
	closing  bool                         // guarded by mu
	running  map[session.ID]*driver       // guarded by mu
	busy     map[session.ID]time.Time     // guarded by mu: leases held elsewhere, not tried before
	cursors  map[session.ID]session.Seq   // guarded by mu: bindings' cursors
	catalog  map[session.ID]catalogRecord // guarded by mu

	closeOnce sync.Once
	closed    chan struct{}
}

// catalogRecord is what the service keeps of a catalog entry.
type catalogRecord struct {
	lastSeq       session.Seq
	owner, tenant string
}

// New returns a Service; it does no I/O and starts nothing until Start.
func New(cfg Config) (*Service, error) {
	if cfg.NATS == nil {
		return nil, errors.New("channel: config needs a NATS connection")
	}
	if cfg.Sessions == nil {
		return nil, errors.New("channel: config needs Sessions")
	}
	if err := cfg.Identity.Validate(); err != nil {
		return nil, err
	}
	switch cfg.ThreadRole {
	case "":
		cfg.ThreadRole = DefaultThreadRole
	case session.RoleViewer, session.RoleDriver, NoRole:
	default:
		return nil, fmt.Errorf("channel: thread role %q: want viewer, driver or none", cfg.ThreadRole)
	}
	if cfg.PublicURL != "" {
		cfg.PublicURL = strings.TrimRight(cfg.PublicURL, "/")
	}
	if cfg.Gateway == "" {
		cfg.Gateway = "gw_" + session.NewEpoch()
	}
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, DefaultLeaseTTL)
	cfg.IdleAfter = cmp.Or(cfg.IdleAfter, DefaultIdleAfter)
	cfg.DedupeTTL = cmp.Or(cfg.DedupeTTL, DefaultDedupeTTL)
	cfg.EditEvery = cmp.Or(cfg.EditEvery, DefaultEditEvery)
	cfg.InlineOutput = cmp.Or(cfg.InlineOutput, DefaultInlineOutput)
	cfg.MaxFileBytes = cmp.Or(cfg.MaxFileBytes, DefaultMaxFileBytes)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Retry.Min = cmp.Or(cfg.Retry.Min, DefaultRetryMin)
	cfg.Retry.Max = cmp.Or(cfg.Retry.Max, DefaultRetryMax)
	cfg.Retry.Attempts = 0
	cfg.HookRetry.Min = cmp.Or(cfg.HookRetry.Min, DefaultRetryMin)
	cfg.HookRetry.Max = cmp.Or(cfg.HookRetry.Max, DefaultRetryMax)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("channel: open jetstream: %w", err)
	}
	prefix := cmp.Or(cfg.Subjects.Prefix, session.DefaultPrefix)
	s := &Service{
		cfg:      cfg,
		log:      cfg.Logger,
		st:       storeFor(js, prefix, &cfg),
		dir:      &directory{id: cfg.Identity, now: cfg.Now},
		channels: make(map[string]Channel),
		running:  make(map[session.ID]*driver),
		busy:     make(map[session.ID]time.Time),
		cursors:  make(map[session.ID]session.Seq),
		catalog:  make(map[session.ID]catalogRecord),
		closed:   make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.hard, s.stopHard = context.WithCancel(context.Background())
	s.direct = newQueue("direct", cfg.Retry, s.log)
	return s, nil
}

// Register adds a platform adapter. Call it before Start.
func (s *Service) Register(ch Channel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.channels[ch.Platform()] = ch
}

// Start starts watching bindings and the session catalog.
func (s *Service) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closing {
		return
	}
	s.started = true
	s.bg.Go(func() { s.direct.run(s.hard) })
	s.bg.Go(s.watchBindings)
	s.bg.Go(s.watchCatalog)
	s.bg.Go(s.sweep)
}

// Close stops taking new work, waits until pending messages are delivered
// or ctx is done, then stops every goroutine. Deliveries still pending are
// dropped, and their events are delivered again by the next driver of
// their session (the cursor stays before them). It is safe to call twice.
func (s *Service) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		s.cancel()
		go func() { // owned: Close waits for s.closed.
			defer close(s.closed)
			s.drivers.Wait()
			select {
			case <-s.direct.drained():
			case <-s.hard.Done():
			}
			s.stopHard()
			s.bg.Wait()
		}()
	})
	select {
	case <-s.closed:
		return nil
	case <-ctx.Done():
		s.stopHard()
		<-s.closed
		return fmt.Errorf("channel: close: %w", ctx.Err())
	}
}

// channel returns the adapter of platform, or nil.
func (s *Service) channel(platform string) Channel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.channels[platform]
}

// Link returns the web UI's address of session id, "" if PublicURL is
// not set.
func (s *Service) Link(id session.ID) string { return s.link(id) }

func (s *Service) link(id session.ID) string {
	if s.cfg.PublicURL == "" {
		return ""
	}
	return s.cfg.PublicURL + "/s/" + string(id)
}

// catalogEntry returns what the catalog says about id.
func (s *Service) catalogEntry(id session.ID) (catalogRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.catalog[id]
	return e, ok
}

// kick makes this gateway drive id now, if no gateway does: its users just
// did something that will make events.
func (s *Service) kick(id session.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.running[id]; d != nil {
		select {
		case d.reload <- struct{}{}:
		default:
		}
		return
	}
	delete(s.busy, id)
	s.startLocked(id)
}

// consider drives id if it has events its cursor has not reached.
func (s *Service) consider(id session.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cursor, bound := s.cursors[id]
	e, known := s.catalog[id]
	if !bound || !known || e.lastSeq <= cursor || s.running[id] != nil {
		return
	}
	if until, ok := s.busy[id]; ok {
		if s.cfg.Now().Before(until) {
			return
		}
		delete(s.busy, id)
	}
	s.startLocked(id)
}

func (s *Service) startLocked(id session.ID) {
	if s.closing || !s.started {
		return
	}
	d := &driver{s: s, id: id, reload: make(chan struct{}, 1)}
	s.running[id] = d
	s.drivers.Go(d.run)
}

// forget removes a driver that ended.
func (s *Service) forget(d *driver) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[d.id] == d {
		delete(s.running, d.id)
	}
}

// backOff remembers that another gateway holds id's lease.
func (s *Service) backOff(id session.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy[id] = s.cfg.Now().Add(s.cfg.LeaseTTL / 3)
}

// Delays before a watcher restarts after it failed.
const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 10 * time.Second
)

// watchBindings keeps s.cursors, restarting its watcher when it fails.
func (s *Service) watchBindings() {
	s.watch("bindings", func() (jetstream.KeyWatcher, error) {
		kv, err := s.st.open(s.ctx, &s.st.bindings)
		if err != nil {
			return nil, err
		}
		return kv.Watch(s.ctx, "s.*")
	}, func(e jetstream.KeyValueEntry) {
		id := session.ID(strings.TrimPrefix(e.Key(), "s."))
		if e.Operation() != jetstream.KeyValuePut {
			s.mu.Lock()
			delete(s.cursors, id)
			s.mu.Unlock()
			return
		}
		var b Binding
		if err := json.Unmarshal(e.Value(), &b); err != nil {
			return
		}
		s.mu.Lock()
		s.cursors[id] = b.Cursor
		s.mu.Unlock()
		s.consider(id)
	})
}

// watchCatalog keeps s.catalog from the session catalog, which the nodes
// write; it waits for the bucket to exist.
func (s *Service) watchCatalog() {
	s.watch("session catalog", func() (jetstream.KeyWatcher, error) {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
		defer cancel()
		kv, err := s.st.js.KeyValue(ctx, s.cfg.Subjects.CatalogBucket())
		if err != nil {
			return nil, fmt.Errorf("open catalog: %w", err)
		}
		return kv.WatchAll(s.ctx)
	}, func(e jetstream.KeyValueEntry) {
		id := session.ID(e.Key())
		if e.Operation() != jetstream.KeyValuePut {
			s.mu.Lock()
			delete(s.catalog, id)
			s.mu.Unlock()
			return
		}
		var c session.CatalogEntry
		if err := json.Unmarshal(e.Value(), &c); err != nil {
			return
		}
		s.mu.Lock()
		s.catalog[id] = catalogRecord{lastSeq: c.LastSeq, owner: c.Owner, tenant: c.Tenant}
		s.mu.Unlock()
		s.consider(id)
	})
}

// watch runs a KV watcher until the service closes, restarting it with
// backoff when it fails.
func (s *Service) watch(what string, open func() (jetstream.KeyWatcher, error), apply func(jetstream.KeyValueEntry)) {
	policy := retry.Policy{Min: watchRetryMin, Max: watchRetryMax}
	failures := 0 // in a row: reset by follow when the watcher delivers
	for n := 0; ; n++ {
		w, err := open()
		if err == nil {
			err = s.follow(w, apply, &failures)
		}
		failures++
		delay := policy.Delay(failures)
		if s.ctx.Err() != nil {
			return
		}
		level := slog.LevelDebug
		if n == 0 {
			level = slog.LevelWarn
		}
		s.log.Log(s.ctx, level, "channel: watcher stopped: restarting", "watch", what, "retry_in", delay, "err", err)
		if !sleep(s.ctx, delay) {
			return
		}
	}
}

func (s *Service) follow(w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry), failures *int) error {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-s.ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watcher ended")
			}
			*failures = 0
			if e != nil {
				apply(e)
			}
		}
	}
}

// sweep looks for bound sessions that nobody drives although they have
// undelivered events (their driver's gateway died), every LeaseTTL/2.
func (s *Service) sweep() {
	t := time.NewTicker(s.cfg.LeaseTTL / 2)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		var ids []session.ID
		for id, cursor := range s.cursors {
			if e, ok := s.catalog[id]; ok && e.lastSeq > cursor && s.running[id] == nil {
				ids = append(ids, id)
			}
		}
		s.mu.Unlock()
		for _, id := range ids {
			s.consider(id)
		}
	}
}
