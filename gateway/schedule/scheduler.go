package schedule

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	// DefaultLeaseTTL is how long the leader's lease lasts without
	// renewal: after the leader dies, another gateway fires ticks within
	// about this long (plus a third of it).
	DefaultLeaseTTL = 15 * time.Second
	// DefaultGrace is how late a tick may fire and still count as on time;
	// older ticks were missed and follow the schedule's Missed policy. It
	// is longer than a leader failover.
	DefaultGrace = time.Minute
	// DefaultRunTimeout bounds one run: creating its session, prompting,
	// and following the turn to its end.
	DefaultRunTimeout = time.Hour
	// DefaultTimeout bounds one read or write of a bucket.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxPerTenant bounds the schedules of one tenant.
	DefaultMaxPerTenant = 1000
)

// leaderKey is the key of the leader's lease in the scheduler bucket.
const leaderKey = "leader"

// Sessions is what a run needs from the gateway: its role checks, creating
// sessions and prompting them. The gateway implements it (package gateway
// cannot be imported from here); every call acts as p and is checked as a
// request of p would be.
type Sessions interface {
	// Authorize returns nil if p may drive session id, or the error a
	// request of p would get (not found, forbidden).
	Authorize(ctx context.Context, p session.Principal, id session.ID) error
	// Create creates a session titled title, owned by p.
	Create(ctx context.Context, p session.Principal, title string) (session.ID, error)
	// Run prompts session id with text as p and follows the turn the
	// prompt starts to its end. Outcome.Seq is set once the prompt is
	// durable, even if an error follows.
	Run(ctx context.Context, p session.Principal, id session.ID, text string) (Outcome, error)
}

// Outcome is how a run's turn ended.
type Outcome struct {
	// Seq is the prompt's seq: zero if the prompt was not accepted.
	Seq      session.Seq
	Turn     int64
	Status   session.TurnStatus
	ExitCode int
	// Unavailable reports that the turn failed because something it needed
	// was unavailable (its sandbox could not start, the object store could
	// not be reached): running it again may succeed.
	Unavailable bool
	// Reason is the turn's last error message, if it had any.
	Reason string
}

// Config configures a Scheduler. JetStream and Sessions are required.
type Config struct {
	// JetStream is the JetStream context of the gateway's connection.
	JetStream jetstream.JetStream
	// Prefix names the buckets "<prefix>_schedules" and
	// "<prefix>_scheduler"; default session.DefaultPrefix.
	Prefix string
	// Replicas is the number of replicas of both buckets; default 1.
	Replicas int
	// Sessions runs prompts as the gateway does.
	Sessions Sessions
	// DLQ receives runs that failed for good; nil: they are only logged
	// and recorded in the schedule's LastRun. Open registers the
	// "schedule" retry handler on it.
	DLQ *dlq.Queue
	// Retry is the backoff of transient failures of a run; a schedule's
	// own retry policy (Spec.Retry) replaces it for its runs.
	Retry dlq.Backoff
	// Audit records each run's end (ActRun) in the audit log; nil: runs
	// are only logged.
	Audit func(ctx context.Context, e audit.Entry)
	// Instance names this scheduler in the leader's lease; default a
	// random id.
	Instance string
	// LeaseTTL, Grace, RunTimeout, Timeout and MaxPerTenant: see the
	// Default constants.
	LeaseTTL     time.Duration
	Grace        time.Duration
	RunTimeout   time.Duration
	Timeout      time.Duration
	MaxPerTenant int
	// Logger receives the scheduler's logs; default slog.Default().
	Logger *slog.Logger
}

// Scheduler stores schedules and, while it is the leader, fires them.
// Create it with Open, Start it, and Close it.
type Scheduler struct {
	cfg       Config
	log       *slog.Logger
	schedules jetstream.KeyValue
	leases    jetstream.KeyValue

	ctx    context.Context // ends the loops and the runs (Close)
	cancel context.CancelFunc
	loops  sync.WaitGroup // watcher and leader loop
	runs   sync.WaitGroup // runs under way

	changed chan struct{} // a schedule changed; buffered, 1

	mu      sync.Mutex
	cache   map[string]cached // guarded by mu: the schedules as last seen
	synced  bool              // guarded by mu: the watcher delivered every initial value
	leading bool              // guarded by mu
	started bool              // guarded by mu
	closing bool              // guarded by mu

	closeOnce sync.Once
}

// cached is a schedule and the revision it was read at.
type cached struct {
	rec record
	rev uint64
}

// Open opens (or creates) the buckets and returns a Scheduler that fires
// nothing until Start.
func Open(ctx context.Context, cfg Config) (*Scheduler, error) {
	if cfg.JetStream == nil {
		return nil, errors.New("schedule: config needs JetStream")
	}
	if cfg.Sessions == nil {
		return nil, errors.New("schedule: config needs Sessions")
	}
	cfg.Prefix = cmp.Or(cfg.Prefix, session.DefaultPrefix)
	cfg.Replicas = max(cfg.Replicas, 1)
	cfg.Instance = cmp.Or(cfg.Instance, "sched_"+session.NewEpoch())
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, DefaultLeaseTTL)
	cfg.Grace = cmp.Or(cfg.Grace, DefaultGrace)
	cfg.RunTimeout = cmp.Or(cfg.RunTimeout, DefaultRunTimeout)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.MaxPerTenant = cmp.Or(cfg.MaxPerTenant, DefaultMaxPerTenant)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	schedules, err := cfg.JetStream.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Prefix + "_schedules",
		Description: "Atrium schedules: prompts sent on a cron schedule",
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("schedule: open bucket %s_schedules: %w", cfg.Prefix, err)
	}
	leases, err := cfg.JetStream.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Prefix + "_scheduler",
		Description: "Atrium scheduler leader lease",
		Replicas:    cfg.Replicas,
		TTL:         cfg.LeaseTTL,
		// A lease is worth nothing after a restart of NATS (it is then
		// just taken again), and is written every few seconds: memory
		// is enough. It also expires by the clock the rest of the
		// process uses (nats-server's file store ages messages by its
		// own process-wide clock), which lets tests run it in fake time.
		Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("schedule: open bucket %s_scheduler: %w", cfg.Prefix, err)
	}
	s := &Scheduler{
		cfg: cfg, log: cfg.Logger, schedules: schedules, leases: leases,
		changed: make(chan struct{}, 1),
		cache:   make(map[string]cached),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if cfg.DLQ != nil {
		cfg.DLQ.Handle(KindSchedule, s.retry)
	}
	return s, nil
}

// Start starts watching schedules and campaigning to lead.
func (s *Scheduler) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closing {
		return
	}
	s.started = true
	s.loops.Go(s.watch)
	s.loops.Go(s.campaign)
}

// Close stops firing, gives up the lease (so another gateway leads at once),
// and stops runs under way: each becomes a dead letter saying so. It waits
// for its goroutines or until ctx is done; it is safe to call twice.
func (s *Scheduler) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		s.cancel()
	})
	done := make(chan struct{})
	go func() { // owned: Close waits for done, or leaves it to finish on its own after ctx ends.
		s.loops.Wait()
		s.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("schedule: close: %w", ctx.Err())
	}
}

// Leading reports whether this scheduler holds the leader's lease.
func (s *Scheduler) Leading() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leading
}

// kick wakes the leader loop.
func (s *Scheduler) kick() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// watch keeps the cache of schedules up to date until Close.
func (s *Scheduler) watch() {
	for {
		err := s.watchOnce()
		if s.ctx.Err() != nil {
			return
		}
		s.log.Warn("schedules watcher stopped; restarting", "err", err)
		if sleep(s.ctx, time.Second) != nil {
			return
		}
	}
}

func (s *Scheduler) watchOnce() error {
	w, err := s.schedules.WatchAll(s.ctx)
	if err != nil {
		return fmt.Errorf("watch schedules: %w", err)
	}
	defer func() { _ = w.Stop() }()
	fresh := make(map[string]cached) // the initial values, swapped in at once
	initial := true
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case e, ok = <-w.Updates():
		}
		if !ok {
			return errors.New("watch schedules: updates closed")
		}
		if e == nil {
			s.mu.Lock()
			s.cache, s.synced = fresh, true
			s.mu.Unlock()
			initial = false
			s.kick()
			continue
		}
		var c cached
		deleted := e.Operation() != jetstream.KeyValuePut
		if !deleted {
			if err := json.Unmarshal(e.Value(), &c.rec); err != nil {
				s.log.Warn("undecodable schedule ignored", "key", e.Key(), "err", err)
				continue
			}
			c.rev = e.Revision()
		}
		if initial {
			if deleted {
				delete(fresh, e.Key())
			} else {
				fresh[e.Key()] = c
			}
			continue
		}
		s.mu.Lock()
		if old, ok := s.cache[e.Key()]; !ok || old.rev < e.Revision() {
			if deleted {
				delete(s.cache, e.Key())
			} else {
				s.cache[e.Key()] = c
			}
		}
		s.mu.Unlock()
		s.kick()
	}
}

// campaign tries to take the leader's lease and leads while it holds it,
// until Close.
func (s *Scheduler) campaign() {
	every := s.cfg.LeaseTTL / 3
	for {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
		rev, err := s.leases.Create(ctx, leaderKey, []byte(s.cfg.Instance))
		cancel()
		switch {
		case err == nil:
			s.lead(rev)
		case s.ctx.Err() != nil:
			return
		case !errors.Is(err, jetstream.ErrKeyExists):
			s.log.Warn("scheduler lease unavailable", "err", err)
		}
		if sleep(s.ctx, every) != nil {
			return
		}
	}
}

// lead fires ticks while it holds the lease at rev: it renews the lease
// every third of its TTL, and stops leading when a renewal fails or the
// scheduler closes (then it deletes the lease, so that another gateway leads
// at once).
func (s *Scheduler) lead(rev uint64) {
	s.setLeading(true)
	s.log.Info("scheduler leading", "instance", s.cfg.Instance)
	defer s.setLeading(false)
	renew := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer renew.Stop()
	renewedAt := time.Now()
	wake := time.NewTimer(0)
	defer wake.Stop()
	for {
		select {
		case <-s.ctx.Done():
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
			_ = s.leases.Delete(ctx, leaderKey, jetstream.LastRevision(rev))
			cancel()
			return
		case <-renew.C:
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
			r, err := s.leases.Update(ctx, leaderKey, []byte(s.cfg.Instance), rev)
			cancel()
			if err != nil {
				if s.ctx.Err() != nil {
					continue // closing: the Done case deletes the lease.
				}
				// A failed renewal ends leadership unless the lease is
				// surely still ours (a transient error early in its life);
				// the claim on each tick keeps firing exactly once anyway.
				if errors.Is(err, jetstream.ErrKeyExists) || time.Since(renewedAt) > s.cfg.LeaseTTL/2 {
					s.log.Warn("scheduler lease lost", "instance", s.cfg.Instance, "err", err)
					return
				}
				continue
			}
			rev, renewedAt = r, time.Now()
		case <-s.changed:
		case <-wake.C:
		}
		if time.Since(renewedAt) > s.cfg.LeaseTTL*2/3 {
			continue // the lease may have lapsed: fire nothing until renewed.
		}
		next := s.tick(time.Now())
		wake.Stop()
		if !next.IsZero() {
			wake.Reset(max(time.Until(next), 0))
		}
	}
}

func (s *Scheduler) setLeading(v bool) {
	s.mu.Lock()
	s.leading = v
	s.mu.Unlock()
}

// tick fires (or skips) the ticks that are due at now and returns when the
// next one is due (zero: none).
func (s *Scheduler) tick(now time.Time) time.Time {
	s.mu.Lock()
	if !s.synced {
		s.mu.Unlock()
		return time.Time{} // the watcher kicks once it has every schedule.
	}
	all := make([]cached, 0, len(s.cache))
	for _, c := range s.cache {
		all = append(all, c)
	}
	s.mu.Unlock()
	var next time.Time
	earliest := func(n time.Time) {
		if !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	for _, c := range all {
		if stale, reaped := s.reapLost(c, now); reaped {
			continue // the watcher brings the new version.
		} else {
			earliest(stale)
		}
		earliest(s.fireDue(c, now))
	}
	return next
}

// lostAfter is how long a run may show as running before the leader takes
// it for lost (the gateway running it died): the longest its attempts and
// the waits between them may last, plus the grace period.
func (s *Scheduler) lostAfter() time.Duration {
	b := s.cfg.Retry
	attempts := cmp.Or(max(b.Attempts, 0), dlq.DefaultAttempts)
	wait := cmp.Or(max(b.Max, 0), dlq.DefaultBackoffMax)
	return time.Duration(attempts)*(s.cfg.RunTimeout+wait) + s.cfg.Grace
}

// lostAfterFor is lostAfter for a run of r, whose retry policy may try
// more often or wait longer than the scheduler's own backoff.
func (s *Scheduler) lostAfterFor(r record) time.Duration {
	d := s.lostAfter()
	if p := r.Retry; p != nil {
		_, wait := p.Delays()
		d = max(d, time.Duration(p.Attempts)*(s.cfg.RunTimeout+wait)+s.cfg.Grace)
	}
	return d
}

// backoff is how a run of r is retried: r's retry policy, or the
// scheduler's backoff of infrastructure failures.
func (s *Scheduler) backoff(r record) dlq.Backoff {
	if p := r.Retry; p != nil {
		base, max := p.Delays()
		return dlq.Backoff{Base: base, Max: max, Attempts: p.Attempts}
	}
	return s.cfg.Retry
}

// reapLost turns c's last run into a dead letter if it has shown as running
// for longer than any run lasts: the gateway running it died, and the run
// must not be lost silently. It reports whether it did; if not, it returns
// when the run will count as lost (zero: no run under way).
func (s *Scheduler) reapLost(c cached, now time.Time) (time.Time, bool) {
	r := c.rec
	if r.LastRun == nil || r.LastRun.Status != StatusRunning {
		return time.Time{}, false
	}
	lost := r.LastRun.StartedAt.Add(s.lostAfterFor(r))
	if now.Before(lost) {
		return lost, false
	}
	run := *r.LastRun
	run.Status, run.FinishedAt = StatusDeadLetter, now.UTC()
	run.Error = "the gateway running it stopped before it finished"
	if run.Session != "" {
		run.Error += "; the prompt may have been sent: see session " + string(run.Session) + " before retrying"
	}
	r.LastRun = &run
	if err := s.claim(r, c.rev); err != nil {
		return time.Time{}, true // changed meanwhile: decided again with the new version.
	}
	if s.cfg.DLQ != nil {
		b, _ := json.Marshal(Payload{Schedule: r.ID, Tick: run.Tick, Session: run.Session})
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
		e, err := s.cfg.DLQ.Put(ctx, dlq.Entry{
			Tenant: r.Tenant, User: r.Creator, Kind: KindSchedule, Ref: r.ID,
			Reason: run.Error, Permanent: true, Attempts: run.Attempts, Payload: b,
		})
		cancel()
		if err != nil {
			s.log.Error("lost scheduled run: its dead letter could not be stored", "schedule", r.ID, "tick", run.Tick, "err", err)
			return time.Time{}, true
		}
		_ = s.update(s.ctx, r.ID, func(cur *record) error {
			if cur.LastRun == nil || !cur.LastRun.Tick.Equal(run.Tick) || cur.LastRun.Status != StatusDeadLetter {
				return errSuperseded
			}
			cur.LastRun.DeadLetter = e.ID
			return nil
		})
	}
	s.log.Warn("scheduled run lost with its gateway", "schedule", r.ID, "tick", run.Tick)
	return time.Time{}, true
}

// fireDue claims c's due ticks, if any, and fires a run if its policy says
// so; it returns c's next tick after now.
func (s *Scheduler) fireDue(c cached, now time.Time) time.Time {
	r := c.rec
	if r.Paused {
		return time.Time{}
	}
	tm, err := r.timing()
	if err != nil {
		s.log.Warn("schedule cannot be read", "schedule", r.ID, "err", err)
		return time.Time{}
	}
	first := tm.next(r.LastTick)
	if first.IsZero() {
		return time.Time{}
	}
	if first.After(now) {
		return first
	}
	// count is the number of ticks due: all but the latest were missed,
	// and the latest too if it is older than the grace period.
	latest, count := first, 1
	for n := tm.next(latest); !n.IsZero() && !n.After(now); n = tm.next(latest) {
		latest = n
		count++
	}
	onTime := now.Sub(latest) <= s.cfg.Grace
	fire := onTime || r.Missed == MissedRunOnce
	r.LastTick = latest
	var run *Run
	if fire {
		run = &Run{Tick: latest, Session: r.Session, Status: StatusRunning, StartedAt: now.UTC()}
		if r.Missed == MissedRunOnce {
			run.Missed = count - 1
		}
		r.LastRun = run
	}
	if err := s.claim(r, c.rev); err != nil {
		if !errors.Is(err, errConflict) {
			s.log.Warn("schedule tick not claimed", "schedule", r.ID, "err", err)
		}
		// Claimed by another leader, or changed: the watcher brings the
		// new version, and its kick makes the decision again.
		return time.Time{}
	}
	switch {
	case !fire:
		s.log.Info("missed ticks skipped", "schedule", r.ID, "missed", count, "latest", latest)
		return tm.next(now)
	case count > 1 && r.Missed == MissedRunOnce:
		s.log.Info("missed ticks run once", "schedule", r.ID, "missed", count)
	case count > 1:
		s.log.Info("missed ticks skipped", "schedule", r.ID, "missed", count-1)
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return time.Time{}
	}
	s.runs.Add(1)
	s.mu.Unlock()
	go func() { // owned: s.runs.
		defer s.runs.Done()
		s.fire(r, *run)
	}()
	return tm.next(now)
}

// claim stores r at revision rev: it fails with errConflict if the schedule
// changed since rev (another leader claimed the tick, or someone edited it).
func (s *Scheduler) claim(r record, rev uint64) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode schedule %s: %w", r.ID, err)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
	defer cancel()
	newRev, err := s.schedules.Update(ctx, r.ID, b, rev)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) {
		return errConflict
	}
	if err != nil {
		return fmt.Errorf("claim tick of schedule %s: %w", r.ID, err)
	}
	s.mu.Lock()
	if old, ok := s.cache[r.ID]; ok && old.rev < newRev {
		s.cache[r.ID] = cached{rec: r, rev: newRev}
	}
	s.mu.Unlock()
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// get reads schedule id and its revision.
func (s *Scheduler) get(ctx context.Context, id string) (record, uint64, error) {
	if !validID(id) {
		return record{}, 0, errNotFound(id)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	e, err := s.schedules.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return record{}, 0, errNotFound(id)
	}
	if err != nil {
		return record{}, 0, storeError(fmt.Errorf("read schedule %s: %w", id, err))
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return record{}, 0, fmt.Errorf("decode schedule %s: %w", id, err)
	}
	return r, e.Revision(), nil
}

// storeError reports a failure of the bucket as unavailable.
func storeError(err error) error {
	return &wireError{wire: session.Errorf(session.CodeUnavailable, "schedules are unavailable: try again shortly"), cause: err}
}

// wireError is a wire error with the cause the wire does not show.
type wireError struct {
	wire  *session.Error
	cause error
}

func (e *wireError) Error() string { return e.cause.Error() }
func (e *wireError) Unwrap() []error {
	return []error{e.wire, e.cause}
}

// all reads every stored schedule.
func (s *Scheduler) all(ctx context.Context) ([]record, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	keys, err := s.schedules.ListKeys(ctx)
	if err != nil {
		return nil, storeError(fmt.Errorf("list schedules: %w", err))
	}
	var out []record
	for k := range keys.Keys() {
		r, _, err := s.get(ctx, k)
		if errors.Is(err, session.ErrNotFound) {
			continue
		}
		if err != nil {
			_ = keys.Stop()
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Create stores a new schedule of p's. A schedule on an existing session
// needs p to be a driver of it, with p's own role (tenant admin rights are
// not carried into scheduled runs).
func (s *Scheduler) Create(ctx context.Context, p session.Principal, sp Spec) (Schedule, error) {
	if _, err := validateSpec(&sp); err != nil {
		return Schedule{}, err
	}
	runAs := session.Principal{User: p.User, Tenant: p.Tenant, Cap: p.Cap, Via: "schedule"}
	if !runAs.Limit(session.RoleOwner).AtLeast(session.RoleDriver) {
		return Schedule{}, session.Errorf(session.CodeForbidden, "this credential is limited to the %s role: it cannot schedule prompts", p.Cap)
	}
	if sp.Session != "" {
		if err := s.cfg.Sessions.Authorize(ctx, runAs, sp.Session); err != nil {
			if errors.Is(err, session.ErrForbidden) || (errors.Is(err, session.ErrNotFound) && p.Admin) {
				return Schedule{}, session.Errorf(session.CodeForbidden,
					"scheduling prompts into session %s needs the driver role on it (scheduled runs act with your own role, not as a tenant admin): ask its owner", sp.Session)
			}
			return Schedule{}, err
		}
	}
	mine, err := s.all(ctx)
	if err != nil {
		return Schedule{}, err
	}
	n := 0
	for _, r := range mine {
		if r.Tenant == p.Tenant {
			n++
		}
	}
	if n >= s.cfg.MaxPerTenant {
		return Schedule{}, session.Errorf(session.CodeConflict, "your tenant has %d schedules, the most allowed: delete some first", n)
	}
	now := time.Now().UTC()
	r := record{
		Schedule:  Schedule{ID: newID(), Tenant: p.Tenant, Creator: p.User, ScheduleSpec: sp, CreatedAt: now, LastTick: now},
		Principal: runAs,
	}
	b, err := json.Marshal(r)
	if err != nil {
		return Schedule{}, fmt.Errorf("encode schedule: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if _, err := s.schedules.Create(cctx, r.ID, b); err != nil {
		return Schedule{}, storeError(fmt.Errorf("store schedule %s: %w", r.ID, err))
	}
	s.log.Info("schedule created", "schedule", r.ID, "user", p.User, "cron", r.Cron, "tz", r.TZ)
	return r.view(now), nil
}

// List returns the schedules p may see: its own, or all of its tenant's for
// a tenant admin; oldest first.
func (s *Scheduler) List(ctx context.Context, p session.Principal) ([]Schedule, error) {
	all, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := []Schedule{}
	for _, r := range all {
		if r.visible(p) {
			out = append(out, r.view(now))
		}
	}
	slices.SortFunc(out, func(a, b Schedule) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Get returns schedule id if p may see it.
func (s *Scheduler) Get(ctx context.Context, p session.Principal, id string) (Schedule, error) {
	r, _, err := s.get(ctx, id)
	if err != nil {
		return Schedule{}, err
	}
	if !r.visible(p) {
		return Schedule{}, errNotFound(id)
	}
	return r.view(time.Now()), nil
}

// Delete removes schedule id if p may see it. A run under way finishes.
func (s *Scheduler) Delete(ctx context.Context, p session.Principal, id string) error {
	r, rev, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	if !r.visible(p) {
		return errNotFound(id)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.schedules.Delete(ctx, id, jetstream.LastRevision(rev)); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return session.Errorf(session.CodeConflict, "schedule %s changed meanwhile: try again", id)
		}
		return storeError(fmt.Errorf("delete schedule %s: %w", id, err))
	}
	s.log.Info("schedule deleted", "schedule", id, "user", p.User)
	return nil
}

// SetPaused pauses or resumes schedule id if p may see it. Resuming does
// not run the ticks that passed while paused: the schedule fires at its
// next tick after now.
func (s *Scheduler) SetPaused(ctx context.Context, p session.Principal, id string, paused bool) (Schedule, error) {
	var out Schedule
	err := s.update(ctx, id, func(r *record) error {
		if !r.visible(p) {
			return errNotFound(id)
		}
		if r.Paused != paused && !paused {
			r.LastTick = later(r.LastTick, time.Now().UTC())
		}
		r.Paused = paused
		out = r.view(time.Now())
		return nil
	})
	return out, err
}

// update changes schedule id with f, reading it again and retrying when
// someone else changed it meanwhile.
func (s *Scheduler) update(ctx context.Context, id string, f func(r *record) error) error {
	for range 10 {
		r, rev, err := s.get(ctx, id)
		if err != nil {
			return err
		}
		if err := f(&r); err != nil {
			return err
		}
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode schedule %s: %w", id, err)
		}
		uctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		_, err = s.schedules.Update(uctx, id, b, rev)
		cancel()
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return storeError(fmt.Errorf("update schedule %s: %w", id, err))
		}
		return nil
	}
	return session.Errorf(session.CodeConflict, "schedule %s keeps changing: try again", id)
}

// RunNow fires schedule id once, now, outside its timing (its ticks are
// untouched; a paused schedule runs too), if p may see it. The run acts as
// the schedule's creator, in the background; its result shows in LastRun.
func (s *Scheduler) RunNow(ctx context.Context, p session.Principal, id string) (Schedule, error) {
	r, _, err := s.get(ctx, id)
	if err != nil {
		return Schedule{}, err
	}
	if !r.visible(p) {
		return Schedule{}, errNotFound(id)
	}
	now := time.Now().UTC()
	run := Run{Tick: now, Session: r.Session, Status: StatusRunning, StartedAt: now}
	err = s.update(ctx, id, func(cur *record) error {
		cur.LastRun = &run
		r = *cur
		return nil
	})
	if err != nil {
		return Schedule{}, err
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return Schedule{}, session.Errorf(session.CodeUnavailable, "the gateway is shutting down: try again through another one")
	}
	s.runs.Add(1)
	s.mu.Unlock()
	go func() { // owned: s.runs.
		defer s.runs.Done()
		s.fire(r, run)
	}()
	s.log.Info("schedule run by hand", "schedule", id, "user", p.User)
	return r.view(now), nil
}
