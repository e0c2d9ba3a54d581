package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
)

// Ownership (DESIGN §5). A node holds one lease for itself and a record for
// each session it serves, both in the owners bucket:
//
//   - The node lease, key session.NodeLeaseKey(NodeID), carries a per-key
//     TTL of Config.LeaseTTL and names an incarnation: a random id the node
//     picks each time it (re)acquires the lease. A goroutine renews it with a
//     compare-and-set write every LeaseTTL/3. If renewing keeps failing for
//     LeaseTTL*2/3 since the last success (the node is cut off from NATS),
//     the node stops every session it serves — turns killed, Cmd
//     subscriptions gone, histories closed — while a third of the TTL is
//     left, so they are gone before the lease can expire; it then takes a
//     new incarnation once it can.
//   - A session's ownership record, key session.LeaseKey(id), names the node
//     and its incarnation. It is created with compare-and-set before the
//     session actor opens its history; the revision of that write is the
//     activation's fencing token, passed to the sandbox (compute.Spec.Fence),
//     to workspace saves (mount.Volume) and to history checkpoints. Records
//     are never renewed: a record is held while its node's lease names its
//     incarnation. Another node takes a session over by a compare-and-set
//     write on the record only after reading, from the stream's leader, that
//     the recorded incarnation's lease is gone. Hibernation, deletion and
//     shutdown delete the record (compare-and-set on its revision), so the
//     next node need not check anything.
//
// One renewal per node instead of one per session: a node with 10,000
// active sessions writes to NATS three times per TTL, not 10,000 times.

// Defaults of Config's scale-out fields.
const (
	// DefaultLeaseTTL is the TTL of a node's lease: how long a dead node's
	// sessions stay unreachable before another node takes them over.
	DefaultLeaseTTL = 3 * time.Second
	// DefaultReplicas is the JetStream replica count of the buckets and
	// the stream the node creates.
	DefaultReplicas = 1
	// DefaultCheckpointInterval is how often an active session's history
	// is checkpointed to Config.Checkpoints.
	DefaultCheckpointInterval = time.Minute
	// DefaultDrainGrace is how long Close lets running turns finish before
	// cancelling them.
	DefaultDrainGrace = 30 * time.Second
	// DefaultEventsMaxAge is how long the events stream keeps a message.
	// It must be far longer than the time between two checkpoints of a
	// session (CheckpointInterval while active, and at hibernation): a
	// takeover restores the newest checkpoint and replays the stream after
	// it, so the stream must still hold everything since then. A week
	// covers a checkpoint store that was down for days.
	DefaultEventsMaxAge = 7 * 24 * time.Hour
	// MinLeaseTTL is the shortest lease TTL: JetStream's per-key TTLs are
	// at least a second.
	MinLeaseTTL = time.Second
)

// ownersMarkerTTL is how long the owners bucket keeps the marker of a node
// lease that expired, which key watchers see as a delete.
const ownersMarkerTTL = time.Minute

// leaseRetry is the pause between failed renewals.
func leaseRetry(ttl time.Duration) time.Duration { return ttl / 12 }

// leaseSafeAge is how long after the start of its last successful renewal
// the node may still write as the owner of its sessions: publish events,
// write checkpoints and workspaces, start sandbox commands. The lease
// expires on the NATS servers no earlier than a TTL after that start, and a
// new owner writes only after that, so the rest of the TTL (a third) is the
// margin for a write that passed the check to land. The age is measured on
// the monotonic clock, which keeps running while the process is paused
// (SIGSTOP, a long GC pause, a frozen VM): the first write after a pause
// longer than this is refused even when the renewal goroutine has yet to
// notice that the lease is gone. It equals the renewal goroutine's own
// give-up point, so the two never disagree for long.
func leaseSafeAge(ttl time.Duration) time.Duration { return ttl * 2 / 3 }

// errLeaseStale means the node's lease was not renewed recently enough for
// this node to write as an owner (see leaseSafeAge).
var errLeaseStale = errors.New("the node lease was not renewed within its safe window")

// LeaseInfo describes one session this node owns (Host.Leases).
type LeaseInfo struct {
	Session  session.ID `json:"session"`
	Fence    int64      `json:"fence"`
	Acquired time.Time  `json:"acquired"`
	// Renewed is when the node's lease, which holds every session of the
	// node, was last renewed.
	Renewed time.Time `json:"renewed"`
}

// errLeaseLost is why a session whose lease could not be renewed stopped.
var errLeaseLost = errors.New("ownership lease lost")

// errNoNodeLease means this node cannot take sessions: it holds no node
// lease (it is cut off from NATS, or just lost it and has yet to take a new
// one).
var errNoNodeLease = session.Errorf(session.CodeUnavailable, "this node is not connected to the cluster; retry")

// nodeLease is the node's own lease (see above). Its goroutine, run, is
// started by Host.Start and stopped by Host.Close.
type nodeLease struct {
	h   *Host
	key string

	mu sync.Mutex
	// inc is the incarnation the lease names; "" while the node holds no
	// lease. guarded by mu.
	inc string
	// val is the lease's value, rev its revision after the last write and
	// renewed when the last successful write was sent; guarded by mu.
	val     []byte
	rev     uint64
	renewed time.Time
	// full is why the last write of the lease failed when the NATS
	// server said its store is full, nil otherwise; guarded by mu
	// (storefull.go).
	full error
}

// holds returns nil if the node's lease names incarnation inc ("": any)
// and its last successful renewal started less than leaseSafeAge ago on
// the monotonic clock; errLeaseLost or errLeaseStale otherwise. Every write
// an owner makes checks it first.
func (n *nodeLease) holds(inc string) error {
	if n == nil {
		return errLeaseLost
	}
	n.mu.Lock()
	cur, renewed := n.inc, n.renewed
	n.mu.Unlock()
	if cur == "" || (inc != "" && cur != inc) {
		return errLeaseLost
	}
	// renewed holds a monotonic reading (time.Now), which time.Since uses.
	if age, safe := time.Since(renewed), leaseSafeAge(n.h.cfg.LeaseTTL); age >= safe {
		return fmt.Errorf("%w: last renewed %v ago, safe for %v", errLeaseStale, age.Round(time.Millisecond), safe)
	}
	return nil
}

// current returns the incarnation the node's lease names and when it was
// last renewed; ok is false while the node holds no lease.
func (n *nodeLease) current() (inc string, renewed time.Time, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.inc, n.renewed, n.inc != ""
}

// acquire takes the node lease with a new incarnation: a create, or, when
// the key is still there (a previous process of this node, or this one
// before it lost the lease), a compare-and-set write over it. Sessions
// recorded under an older incarnation are then free to take over.
func (n *nodeLease) acquire(ctx context.Context) error {
	ttl := n.h.cfg.LeaseTTL
	now := time.Now()
	inc := session.NewEpoch()
	val, _ := json.Marshal(session.Lease{Node: n.h.cfg.NodeID, Inc: inc, Acquired: session.Time{Time: now.UTC()}})
	rev, err := n.h.owners.Create(ctx, n.key, val, ttl)
	if errors.Is(err, ajs.ErrExists) {
		var cur *ajs.Record
		if cur, err = n.h.owners.Latest(ctx, n.key); err == nil {
			if cur == nil {
				rev, err = n.h.owners.Create(ctx, n.key, val, ttl)
			} else {
				rev, err = n.h.owners.Swap(ctx, n.key, val, cur.Rev, ttl)
			}
		}
	}
	n.noteWrite(err)
	if err != nil {
		return fmt.Errorf("acquire node lease %s: %w", n.key, err)
	}
	n.mu.Lock()
	n.inc, n.val, n.rev, n.renewed = inc, val, rev, now
	n.mu.Unlock()
	n.h.log.Info("node lease acquired", "incarnation", inc, "ttl", ttl)
	return nil
}

// run renews the node lease every LeaseTTL/3 until stop is closed. When
// the lease is lost it stops every session of the node and takes a new
// incarnation as soon as NATS lets it.
func (n *nodeLease) run(stop <-chan struct{}) {
	ttl := n.h.cfg.LeaseTTL
	t := time.NewTimer(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		n.mu.Lock()
		inc, last, rev, val := n.inc, n.renewed, n.rev, n.val
		n.mu.Unlock()
		start := time.Now()
		if inc == "" {
			ctx, cancel := context.WithTimeout(n.h.ctx, ttl)
			err := n.acquire(ctx)
			cancel()
			if err != nil {
				n.h.log.Warn("node lease", "err", err)
				t.Reset(leaseRetry(ttl))
				continue
			}
			t.Reset(ttl / 3)
			continue
		}
		deadline := last.Add(ttl * 2 / 3)
		if !start.Before(deadline) {
			n.lose("renewal failed for too long")
			t.Reset(leaseRetry(ttl))
			continue
		}
		ctx, cancel := context.WithDeadline(n.h.ctx, deadline)
		next, err := n.h.owners.Swap(ctx, n.key, val, rev, ttl)
		if isWrongLastSeq(err) {
			// A retry of a renewal whose reply was lost, or the key expired
			// and someone wrote it.
			if cur, gerr := n.h.owners.Latest(ctx, n.key); gerr == nil && cur != nil && !cur.Deleted && string(cur.Value) == string(val) {
				next, err = cur.Rev, nil
			}
		}
		cancel()
		n.noteWrite(err)
		switch {
		case err == nil:
			n.mu.Lock()
			n.rev, n.renewed = next, start
			n.mu.Unlock()
			t.Reset(ttl / 3)
		case isWrongLastSeq(err):
			n.lose("it expired or was overwritten")
			t.Reset(leaseRetry(ttl))
		default:
			select {
			case <-stop:
				return
			default:
			}
			n.h.log.Warn("renew node lease", "err", err)
			t.Reset(leaseRetry(ttl))
		}
	}
}

// lose gives up the incarnation and stops every session held under it.
func (n *nodeLease) lose(why string) {
	n.mu.Lock()
	n.inc = ""
	n.mu.Unlock()
	h := n.h
	h.leaseMu.Lock()
	held := make([]*lease, 0, len(h.leases))
	for _, l := range h.leases {
		held = append(held, l)
	}
	h.leaseMu.Unlock()
	h.log.Error("node lease lost; stopping every session of this node", "why", why, "sessions", len(held))
	for _, l := range held {
		l.markLost(why)
	}
}

// release deletes the node lease (compare-and-set on its revision), once
// the node serves no session: nothing is left to wait for.
func (n *nodeLease) release(ctx context.Context) {
	n.mu.Lock()
	inc, rev := n.inc, n.rev
	n.inc = ""
	n.mu.Unlock()
	if inc == "" {
		return
	}
	if _, err := n.h.owners.Delete(ctx, n.key, rev); err != nil {
		n.h.log.Warn("release node lease", "err", err)
	}
}

// lease is one session's ownership record held by this node.
type lease struct {
	h        *Host
	id       session.ID
	key      string
	fence    int64     // the revision of the write that took it
	acquired time.Time // when that write was sent
	inc      string    // the node lease's incarnation it was taken under
	// continued: this node released the session last and nobody has held
	// it since (see Host.released), so the local history is current.
	continued bool
	// checkpointed is the last seq the session's newest checkpoint holds,
	// -1 if unknown: known when continued, set after each checkpoint.
	checkpointed atomic.Int64
	// uncaptured is set when a capture of the session's events failed
	// while held (captureEvents): the file may hold events the stream
	// lacks, so its release is not remembered as continued and the next
	// activation compares the file with the stream (and re-publishes).
	// Without it a session stopped by a full JetStream store woke on the
	// fast path, and the stream kept a gap where its uncaptured tail was.
	uncaptured atomic.Bool
	// current is set once the activation's file is known to agree with
	// the stream (continued, or brought up to date: markCurrent). Only
	// then may its release be remembered: an activation that failed
	// before (the stream out of reach, its store full) knows nothing of
	// the file, and the next one must compare it.
	current atomic.Bool
	lost    func() // called once, by markLost

	mu       sync.Mutex
	released bool // guarded by mu
	isLost   bool // guarded by mu
}

// released is what this node remembers of a session it released: the
// revision of the delete marker, which the next acquire on this node
// compares against, and the seq its newest checkpoint holds.
type releasedLease struct {
	marker       uint64
	checkpointed int64
}

// errLeaseHeld is a place request's answer for a session another node
// owns: unavailable, which the gateway retries until that node's lease
// expires or it releases the session.
func errLeaseHeld(id session.ID, node string, ttl time.Duration) error {
	return session.Errorf(session.CodeUnavailable,
		"session %s is owned by node %q; retry: another node takes it over within %s if that node is gone", id, node, ttl)
}

// acquireLease takes id's ownership record under the node's current
// incarnation. A record of an incarnation whose node lease is gone (a dead
// node, or an earlier process or incarnation of this one) is taken over; one
// a live incarnation holds fails with errLeaseHeld. lost runs if the node's
// lease is lost while the session is held.
func (h *Host) acquireLease(ctx context.Context, id session.ID, lost func()) (*lease, error) {
	if err := h.storeFull(); err != nil {
		// The record's write would wait on the same full disk (seen: 10 s
		// and more, past the gateway's timeout): refuse at once, saying
		// why; this also says why the node lease cannot be renewed.
		return nil, unavailableFor(err, "this node cannot take session %s now: %v; retry", id, err)
	}
	inc, _, ok := h.node.current()
	if !ok {
		return nil, h.node.noLease()
	}
	// A node cut off from NATS must not wait long for it.
	ctx, cancel := context.WithTimeout(ctx, h.cfg.LeaseTTL*2/3)
	defer cancel()
	now := time.Now()
	l := &lease{h: h, id: id, key: session.LeaseKey(id), acquired: now, inc: inc, lost: lost}
	l.checkpointed.Store(-1)
	val, _ := json.Marshal(session.Lease{Node: h.cfg.NodeID, Inc: inc, Acquired: session.Time{Time: now.UTC()}})
	var rev uint64
	var err error
	h.leaseMu.Lock()
	prev, ok := h.released[id]
	delete(h.released, id)
	h.leaseMu.Unlock()
	if ok {
		// Ours was the last write to the key (the delete marker of our
		// release): one compare-and-set takes it back, and proves nobody
		// held it since.
		if rev, err = h.owners.Swap(ctx, l.key, val, prev.marker, 0); err == nil {
			l.continued = true
			l.current.Store(true)
			l.checkpointed.Store(prev.checkpointed)
		}
	}
	if !l.continued {
		rev, err = h.owners.Create(ctx, l.key, val, 0)
	}
	if errors.Is(err, ajs.ErrExists) {
		rev, err = h.takeOver(ctx, id, l.key, val)
	}
	if err != nil {
		var serr *session.Error
		if errors.As(err, &serr) {
			return nil, err
		}
		if full := ajs.StoreFull(err); errors.Is(full, ajs.ErrStoreFull) {
			// The NATS server refuses writes for lack of room: say so.
			return nil, unavailableFor(full, "this node cannot take session %s now: %v; retry", id, full)
		}
		return nil, fmt.Errorf("acquire lease of session %s: %w", id, err)
	}
	l.fence = int64(rev)
	h.leaseMu.Lock()
	h.leases[id] = l
	h.leaseMu.Unlock()
	if cur, _, ok := h.node.current(); !ok || cur != inc {
		// The node lost its lease meanwhile: the record names a dead
		// incarnation, and this activation must not go on.
		l.markLost("the node lease was lost while acquiring")
		l.release(context.WithoutCancel(ctx))
		return nil, errNoNodeLease
	}
	return l, nil
}

// takeOver writes val over the record key of session id if the
// incarnation it names is dead; errLeaseHeld if it is alive. It reads both
// the record and the node's lease from the stream's leader.
func (h *Host) takeOver(ctx context.Context, id session.ID, key string, val []byte) (uint64, error) {
	cur, err := h.owners.Latest(ctx, key)
	if err != nil {
		return 0, err
	}
	if cur == nil || cur.Deleted {
		// Released meanwhile.
		var last uint64
		if cur != nil {
			last = cur.Rev
		}
		rev, err := h.owners.Swap(ctx, key, val, last, 0)
		if isWrongLastSeq(err) {
			return 0, errLeaseHeld(id, "another", h.cfg.LeaseTTL)
		}
		return rev, err
	}
	var rec session.Lease
	if err := json.Unmarshal(cur.Value, &rec); err != nil {
		rec = session.Lease{} // Unreadable: no live incarnation can claim it.
	}
	alive, err := h.incarnationAlive(ctx, rec)
	if err != nil {
		return 0, err
	}
	if alive {
		return 0, errLeaseHeld(id, rec.Node, h.cfg.LeaseTTL)
	}
	rev, err := h.owners.Swap(ctx, key, val, cur.Rev, 0)
	if isWrongLastSeq(err) {
		return 0, errLeaseHeld(id, "another", h.cfg.LeaseTTL)
	}
	if err == nil {
		h.log.Info("took over a session from a node that is gone", "session", id, "from", rec.Node, "incarnation", rec.Inc)
	}
	return rev, err
}

// incarnationAlive reports whether the lease of rec.Node still names
// rec.Inc. Records written before node leases (no Inc) are never alive.
func (h *Host) incarnationAlive(ctx context.Context, rec session.Lease) (bool, error) {
	if rec.Node == "" || rec.Inc == "" {
		return false, nil
	}
	if rec.Node == h.cfg.NodeID {
		// Never alive: this node runs one actor per session (the
		// manager), the one acquiring, so a record of ours is left from an
		// earlier incarnation or from a release that failed.
		return false, nil
	}
	msg, err := h.owners.Latest(ctx, session.NodeLeaseKey(rec.Node))
	if err != nil || msg == nil || msg.Deleted {
		return false, err
	}
	var nl session.Lease
	return json.Unmarshal(msg.Value, &nl) == nil && nl.Inc == rec.Inc, nil
}

// isWrongLastSeq reports whether err is a failed compare-and-set.
func isWrongLastSeq(err error) bool { return ajs.IsWrongLastSeq(err) }

func (l *lease) markLost(why string) {
	l.mu.Lock()
	if l.released || l.isLost {
		l.mu.Unlock()
		return
	}
	l.isLost = true
	l.mu.Unlock()
	l.h.forgetLease(l)
	l.h.log.Error("ownership lease lost; stopping the session", "session", l.id, "fence", l.fence, "why", why)
	if l.lost != nil {
		l.lost()
	}
}

// release deletes the record if this node still holds it, so the next
// node need not check anything. Safe to call twice and on a nil lease.
func (l *lease) release(ctx context.Context) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return
	}
	l.released = true
	lost := l.isLost
	l.mu.Unlock()
	l.h.forgetLease(l)
	if lost {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.h.cfg.LeaseTTL)
	defer cancel()
	// A delete marker, whose revision the next acquire on this node
	// compares against (see acquireLease).
	marker, err := l.h.owners.Delete(ctx, l.key, uint64(l.fence))
	if err != nil {
		// Someone else's now, or the node lease expires and frees it.
		l.h.log.Warn("release lease", "session", l.id, "err", err)
		return
	}
	if l.uncaptured.Load() || !l.current.Load() {
		return // Not known current: the next activation reconciles.
	}
	l.h.leaseMu.Lock()
	l.h.released[l.id] = releasedLease{marker: marker, checkpointed: l.checkpointed.Load()}
	l.h.leaseMu.Unlock()
}

// markCurrent notes that the file of id's activation agrees with the
// stream (see lease.current).
func (h *Host) markCurrent(id session.ID) {
	h.leaseMu.Lock()
	l := h.leases[id]
	h.leaseMu.Unlock()
	if l != nil {
		l.current.Store(true)
	}
}

// leaseFence returns the fencing token of id's activation on this node: the
// revision of the write that took its ownership record, the one fence
// source (sandbox handles, workspace manifests and checkpoints carry it).
// Work on a session this node does not hold gets none: an unavailable
// error the caller retries, which reaches the owner.
func (h *Host) leaseFence(id session.ID) (int64, error) {
	h.leaseMu.Lock()
	l := h.leases[id]
	h.leaseMu.Unlock()
	if l == nil {
		return 0, session.Errorf(session.CodeUnavailable, "session %s is not held by this node, so it has no fencing token; retry", id)
	}
	return l.fence, nil
}

// dropReleased forgets id's released lease (the session is deleted).
func (h *Host) dropReleased(id session.ID) {
	h.leaseMu.Lock()
	delete(h.released, id)
	h.leaseMu.Unlock()
}

// valid reports whether the session is still held and may be written:
// not lost, not released, and the node lease that holds it renewed within
// its safe window (see check).
func (l *lease) valid() bool { return l.check() == nil }

// check returns nil if this node may write the session now: the record is
// neither lost nor released, the node lease still names the incarnation it
// was taken under, and that lease's last renewal is recent enough on the
// monotonic clock (leaseSafeAge). A flag alone is not enough: after a
// pause (SIGSTOP, a GC pause, a frozen VM) the renewal goroutine notices the
// expiry only when its timer fires, and a write that runs first would land
// after another node took the session over.
func (l *lease) check() error {
	if l == nil {
		return errLeaseLost
	}
	l.mu.Lock()
	gone := l.released || l.isLost
	l.mu.Unlock()
	if gone {
		return errLeaseLost
	}
	return l.h.node.holds(l.inc)
}

// mayWrite returns nil if this node may write session id as its owner now
// (see lease.check); it is checked before every capture of its events.
func (h *Host) mayWrite(id session.ID) error {
	h.leaseMu.Lock()
	l := h.leases[id]
	h.leaseMu.Unlock()
	if l == nil {
		return fmt.Errorf("session %s: %w", id, errLeaseLost)
	}
	if err := l.check(); err != nil {
		return fmt.Errorf("session %s: %w", id, err)
	}
	return nil
}

// nodeMayWrite returns nil if the node's lease was renewed within its safe
// window: checked before sandbox and workspace writes, which a session's
// sandbox may need after its record was released (sleep saves).
func (h *Host) nodeMayWrite() error {
	if h.node == nil {
		return nil // Not started: nothing is owned, nothing to fence.
	}
	return h.node.holds("")
}

func (h *Host) forgetLease(l *lease) {
	h.leaseMu.Lock()
	if h.leases[l.id] == l {
		delete(h.leases, l.id)
	}
	h.leaseMu.Unlock()
}

// NodeLease reports whether the node holds its lease and when it last
// renewed it (what readiness checks).
func (h *Host) NodeLease() (renewed time.Time, held bool) {
	if h.node == nil {
		return time.Time{}, false
	}
	_, renewed, held = h.node.current()
	return renewed, held
}

// Leases returns the sessions this node owns: what `atrium cluster status`
// shows for a node.
func (h *Host) Leases() []LeaseInfo {
	var renewed time.Time
	if h.node != nil {
		_, renewed, _ = h.node.current()
	}
	h.leaseMu.Lock()
	out := make([]LeaseInfo, 0, len(h.leases))
	for _, l := range h.leases {
		out = append(out, LeaseInfo{Session: l.id, Fence: l.fence, Acquired: l.acquired, Renewed: renewed})
	}
	h.leaseMu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Session < out[j].Session })
	return out
}

// openCatalog creates or updates the session catalog bucket with the
// configured replica count.
func openCatalog(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Subjects.CatalogBucket(),
		Description: "Atrium session catalog",
		Replicas:    cfg.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("open catalog bucket %s: %w", cfg.Subjects.CatalogBucket(), err)
	}
	return kv, nil
}

// openOwners opens the owners bucket: no bucket TTL (records are held by
// their node's lease, not renewed), per-key TTLs for node leases, and
// markers when a node lease expires. It updates a bucket an older node made
// (with a bucket TTL, or another replica count).
func openOwners(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         cfg.Subjects.OwnersBucket(),
		Description:    "Atrium node leases, session ownership records and fencing tokens",
		Replicas:       cfg.Replicas,
		Storage:        jetstream.FileStorage,
		LimitMarkerTTL: ownersMarkerTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("open owners bucket %s: %w", cfg.Subjects.OwnersBucket(), err)
	}
	return kv, nil
}

// openEvents creates or updates the stream that captures every session's
// events and metadata (eventsStreamConfig).
func openEvents(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.Stream, error) {
	st, err := js.CreateOrUpdateStream(ctx, eventsStreamConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("open events stream %s: %w", cfg.Subjects.EventsStream(), err)
	}
	return st, nil
}

// eventsStreamConfig is the events stream's configuration. The owner
// publishes a session's events on its Capture subject, which only the
// stream listens to; the stream stores them under the session's Events
// subject (a subject transform) and republishes each message it stored on
// that subject (RePublish), which is what gateways subscribe to. So a
// watcher receives only what the stream stored: a message the stream
// refuses — a duplicate Nats-Msg-Id, such as the frame of a frozen owner
// that leaves its socket at the thaw, after the new owner wrote that seq —
// reaches nobody (issue 21). The stream's leader republishes, after the
// message is stored (in a cluster, once a quorum has it).
//
// Events keep the subject they had before (a stream made by an older
// version captured the Events subjects directly): replay, the stream's last
// event and purges see old and new messages alike.
func eventsStreamConfig(cfg *Config) jetstream.StreamConfig {
	// The session id is the one wildcard of both source subjects.
	events := cfg.Subjects.Events("{{wildcard(1)}}")
	return jetstream.StreamConfig{
		Name:             cfg.Subjects.EventsStream(),
		Description:      "Atrium session events and metadata, kept for takeover between checkpoints",
		Subjects:         []string{cfg.Subjects.AllCapture(), cfg.Subjects.AllMeta()},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: cfg.Subjects.AllCapture(), Destination: events},
		RePublish:        &jetstream.RePublish{Source: cfg.Subjects.AllEvents(), Destination: events},
		Storage:          jetstream.FileStorage,
		Replicas:         cfg.Replicas,
		MaxAge:           cfg.EventsMaxAge,
		Discard:          jetstream.DiscardOld,
		Duplicates:       2 * time.Minute,
	}
}

// storeFullStop is why and when a session stopped because the JetStream
// store was full (Host.storeFullStops).
type storeFullStop struct {
	at  time.Time
	why string
}

// onLeaseLost stops the session at once: its lease could not be renewed in
// time (the node is cut off from NATS) or a newer owner fenced it. The turn
// is killed, the Cmd subscription dropped, pending commits abandoned (the
// next activation re-publishes or drops what only this file has) and the
// history closed, before the lease can expire; requests already queued are
// told to retry, which reaches the new owner.
func (s *sessionActor) onLeaseLost(ctx proto.Context, why string) {
	if s.act.lost || s.act.phase == phasePassivating {
		return
	}
	s.act.lost = true
	s.log.Error("stopping the session: this node no longer owns it", "why", why, "fence", s.fence)
	s.act.openErr = session.Errorf(session.CodeUnavailable, "this node no longer owns session %s; retry", s.id)
	if err := s.h.storeFull(); err != nil {
		// Stopped because its events cannot be stored: say why, now to
		// the callers and in the session once it is served again.
		s.act.openErr = unavailableFor(err, "session %s stopped on this node: %v; retry", s.id, err)
		s.h.storeFullStops.LoadOrStore(s.id, storeFullStop{at: time.Now(), why: err.Error()})
	}
	s.teardownNow("ownership lost")
	s.h.metrics.leaseLost.Inc()
	if s.h.afterLeaseLost != nil {
		s.h.afterLeaseLost(s.id)
	}
	for _, c := range s.act.early {
		respond(c.msg, errorReply(s.act.openErr))
	}
	s.act.early = nil
	if s.act.creator != nil {
		respond(s.act.creator.msg, errorReply(s.act.openErr))
		s.act.creator = nil
	}
	s.act.phase = phasePassivating
	ctx.Send(ctx.Parent(), &passivate{pid: s.self})
}

// replace asks the nodes to activate id (as its owner): the prompts it has
// queued run on another node while this one shuts down (this node no longer
// listens on the place subject), or the session of a node that is gone
// finishes its interrupted turn and runs its queue (rescue.go).
func (h *Host) replace(id session.ID, owner string) {
	b, _ := json.Marshal(session.PlaceRequest{Op: session.PlaceActivate, Session: id})
	msg := &nats.Msg{Subject: h.cfg.Subjects.Place(), Data: b, Header: nats.Header{}}
	msg.Header.Set(session.HeaderUser, owner)
	if err := h.cfg.NATS.PublishMsg(msg); err != nil {
		h.log.Warn("hand queued prompts to another node", "session", id, "err", err)
	}
}
