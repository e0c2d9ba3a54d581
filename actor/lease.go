package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// Ownership leases (DESIGN §5). Before a session actor opens its history it
// creates the key session.LeaseKey(id) in the owners bucket, whose TTL is
// Config.LeaseTTL; the revision of that create is the activation's fencing
// token, passed to the sandbox (compute.Spec.Fence), to workspace saves
// (mount.Volume) and to history checkpoints. A goroutine renews the lease
// with a compare-and-set Update every LeaseTTL/3. If renewing keeps failing
// for LeaseTTL*2/3 since the last success (the node is cut off from NATS),
// the session actor stops itself — turn killed, Cmd subscription gone,
// history closed — while a third of the TTL is left, so it is gone before
// the lease can expire and another node create it. Hibernation, deletion
// and shutdown delete the lease (compare-and-set on its revision), so the
// next node need not wait.

// Defaults of Config's scale-out fields.
const (
	// DefaultLeaseTTL is the owners bucket's TTL: how long a dead node's
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
)

// leaseRetry is the pause between failed renewals.
func leaseRetry(ttl time.Duration) time.Duration { return ttl / 12 }

// LeaseInfo describes one lease this node holds (Host.Leases).
type LeaseInfo struct {
	Session  session.ID `json:"session"`
	Fence    int64      `json:"fence"`
	Acquired time.Time  `json:"acquired"`
	Renewed  time.Time  `json:"renewed"`
}

// errLeaseLost is why a session whose lease could not be renewed stopped.
var errLeaseLost = errors.New("ownership lease lost")

// lease is one session's ownership lease held by this node.
type lease struct {
	h        *Host
	id       session.ID
	key      string
	val      []byte
	fence    int64     // the revision that acquired it
	acquired time.Time // when the create was sent
	// continued: this node released the lease last and nobody has held
	// it since (see Host.released), so the local history is current.
	continued bool
	lost      func() // called once, on the renewer's goroutine, if it is lost

	stop chan struct{} // closed by release
	done chan struct{} // closed when the renewer has ended

	mu       sync.Mutex
	rev      uint64    // guarded by mu: the current revision
	renewed  time.Time // guarded by mu: when the last successful renewal was sent
	released bool      // guarded by mu
	isLost   bool      // guarded by mu
}

// errLeaseHeld is a place request's answer for a session another node
// owns: unavailable, which the gateway retries until the lease expires or
// is released.
func errLeaseHeld(id session.ID, node string, ttl time.Duration) error {
	return session.Errorf(session.CodeUnavailable,
		"session %s is owned by node %q; retry: another node takes it over within %s if that node is gone", id, node, ttl)
}

// acquireLease takes id's lease. A lease this node's NodeID holds (a
// previous process of this node that died) is taken over at once; one
// another node holds fails with errLeaseHeld. lost runs if renewing fails
// for too long.
func (h *Host) acquireLease(ctx context.Context, id session.ID, lost func()) (*lease, error) {
	// A lease that took longer than this to get would have to be renewed
	// at once; and a node cut off from NATS must not wait for it.
	ctx, cancel := context.WithTimeout(ctx, h.cfg.LeaseTTL*2/3)
	defer cancel()
	now := time.Now()
	l := &lease{
		h: h, id: id, key: session.LeaseKey(id), acquired: now, lost: lost,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	l.val, _ = json.Marshal(session.Lease{Node: h.cfg.NodeID, Acquired: session.Time{Time: now.UTC()}})
	var rev uint64
	var err error
	h.leaseMu.Lock()
	marker, ok := h.released[id]
	delete(h.released, id)
	h.leaseMu.Unlock()
	if ok {
		// Ours was the last write to the key (the delete marker of our
		// release): one compare-and-set takes it back, and proves nobody
		// held it since.
		if rev, err = h.owners.Update(ctx, l.key, l.val, marker); err == nil {
			l.continued = true
		}
	}
	if !l.continued {
		rev, err = h.owners.Create(ctx, l.key, l.val)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		var ent jetstream.KeyValueEntry
		ent, err = h.owners.Get(ctx, l.key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			rev, err = h.owners.Create(ctx, l.key, l.val) // Expired or released meanwhile.
		case err != nil:
		default:
			var cur session.Lease
			if json.Unmarshal(ent.Value(), &cur) == nil && cur.Node == h.cfg.NodeID && h.cfg.NodeID != "" {
				// Ours, from a process of this node that is gone (this
				// process's manager never runs two actors per session).
				rev, err = h.owners.Update(ctx, l.key, l.val, ent.Revision())
			} else {
				return nil, errLeaseHeld(id, cur.Node, h.cfg.LeaseTTL)
			}
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, errLeaseHeld(id, "another", h.cfg.LeaseTTL)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("acquire lease of session %s: %w", id, err)
	}
	l.fence, l.rev, l.renewed = int64(rev), rev, now
	h.leaseMu.Lock()
	h.leases[id] = l
	h.leaseMu.Unlock()
	h.wg.Go(l.renew)
	return l, nil
}

// renew is the lease's goroutine: it renews every LeaseTTL/3 and declares
// the lease lost once LeaseTTL*2/3 passed since the last renewal that
// succeeded (measured from when it was sent, which is before the server
// restarted the TTL).
func (l *lease) renew() {
	defer close(l.done)
	ttl := l.h.cfg.LeaseTTL
	t := time.NewTimer(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		last, rev := l.renewed, l.rev
		l.mu.Unlock()
		start := time.Now()
		deadline := last.Add(ttl * 2 / 3)
		if !start.Before(deadline) {
			l.markLost("renewal failed for too long")
			return
		}
		ctx, cancel := context.WithDeadline(l.h.ctx, deadline)
		next, err := l.h.owners.Update(ctx, l.key, l.val, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// A retry of a renewal whose reply was lost, or a new owner.
			if ent, gerr := l.h.owners.Get(ctx, l.key); gerr == nil && string(ent.Value()) == string(l.val) {
				next, err = ent.Revision(), nil
			}
		}
		cancel()
		switch {
		case err == nil:
			l.mu.Lock()
			l.rev, l.renewed = next, start
			l.mu.Unlock()
			t.Reset(ttl / 3)
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyNotFound):
			l.markLost("another node holds it")
			return
		default:
			select {
			case <-l.stop:
				return
			default:
			}
			l.h.log.Warn("renew lease", "session", l.id, "err", err)
			t.Reset(leaseRetry(ttl))
		}
	}
}

func (l *lease) markLost(why string) {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return
	}
	l.isLost = true
	l.mu.Unlock()
	l.h.forgetLease(l)
	l.h.log.Error("ownership lease lost; stopping the session", "session", l.id, "fence", l.fence, "why", why)
	l.lost()
}

// release stops renewing and deletes the lease if this node still holds it,
// so the next node need not wait for the TTL. Safe to call twice and on a
// nil lease.
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
	close(l.stop)
	<-l.done
	l.h.forgetLease(l)
	if lost {
		return
	}
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, l.h.cfg.LeaseTTL)
	defer cancel()
	// A KV delete (ADR-8: a KV-Operation DEL marker) published directly,
	// for the marker's revision, which the next acquire on this node
	// compares against (see acquireLease).
	m := nats.NewMsg("$KV." + l.h.cfg.Subjects.OwnersBucket() + "." + l.key)
	m.Header.Set("KV-Operation", "DEL")
	ack, err := l.h.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev))
	if err != nil {
		// Someone else's now, or it expires on its own within LeaseTTL.
		l.h.log.Warn("release lease", "session", l.id, "err", err)
		return
	}
	l.h.leaseMu.Lock()
	l.h.released[l.id] = ack.Sequence
	l.h.leaseMu.Unlock()
}

// dropReleased forgets id's released lease (the session is deleted).
func (h *Host) dropReleased(id session.ID) {
	h.leaseMu.Lock()
	delete(h.released, id)
	h.leaseMu.Unlock()
}

// valid reports whether the lease is still held: not lost, not released.
func (l *lease) valid() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.released && !l.isLost
}

func (h *Host) forgetLease(l *lease) {
	h.leaseMu.Lock()
	if h.leases[l.id] == l {
		delete(h.leases, l.id)
	}
	h.leaseMu.Unlock()
}

// Leases returns the leases this node holds, by session: what
// `atrium cluster status` shows for a node.
func (h *Host) Leases() []LeaseInfo {
	h.leaseMu.Lock()
	ls := make([]*lease, 0, len(h.leases))
	for _, l := range h.leases {
		ls = append(ls, l)
	}
	h.leaseMu.Unlock()
	out := make([]LeaseInfo, 0, len(ls))
	for _, l := range ls {
		l.mu.Lock()
		out = append(out, LeaseInfo{Session: l.id, Fence: l.fence, Acquired: l.acquired, Renewed: l.renewed})
		l.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Session < out[j].Session })
	return out
}

// openOwners opens the owners bucket with TTL LeaseTTL, creating it or
// updating one made by an older node without a TTL (or with another TTL or
// replica count).
func openOwners(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Subjects.OwnersBucket(),
		Description: "Atrium session ownership leases and fencing tokens",
		TTL:         cfg.LeaseTTL,
		Replicas:    cfg.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("open owners bucket %s: %w", cfg.Subjects.OwnersBucket(), err)
	}
	return kv, nil
}

// openEvents creates or updates the stream that captures every session's
// events and metadata.
func openEvents(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.Stream, error) {
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Subjects.EventsStream(),
		Description: "Atrium session events and metadata, kept for takeover between checkpoints",
		Subjects:    []string{cfg.Subjects.AllEvents(), cfg.Subjects.AllMeta()},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.EventsMaxAge,
		Discard:     jetstream.DiscardOld,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("open events stream %s: %w", cfg.Subjects.EventsStream(), err)
	}
	return st, nil
}

// onLeaseLost stops the session at once: its lease could not be renewed in
// time (the node is cut off from NATS) or a newer owner fenced it. The turn
// is killed, the Cmd subscription dropped, pending commits abandoned (the
// next activation re-publishes or drops what only this file has) and the
// history closed, before the lease can expire; requests already queued are
// told to retry, which reaches the new owner.
func (s *sessionActor) onLeaseLost(ctx proto.Context, why string) {
	if s.lost || s.phase == phasePassivating {
		return
	}
	s.lost = true
	s.log.Error("stopping the session: this node no longer owns it", "why", why, "fence", s.fence)
	s.openErr = session.Errorf(session.CodeUnavailable, "this node no longer owns session %s; retry", s.id)
	s.teardownNow("ownership lost")
	s.h.metrics.leaseLost.Inc()
	if s.h.afterLeaseLost != nil {
		s.h.afterLeaseLost(s.id)
	}
	for _, c := range s.early {
		respond(c.msg, errorReply(s.openErr))
	}
	s.early = nil
	if s.creator != nil {
		respond(s.creator.msg, errorReply(s.openErr))
		s.creator = nil
	}
	s.phase = phasePassivating
	ctx.Send(ctx.Parent(), &passivate{pid: s.self})
}

// replace asks the nodes to activate id (as its owner), so that the prompts
// it has queued run on another node while this one shuts down. This node
// no longer listens on the place subject.
func (h *Host) replace(id session.ID, owner string) {
	b, _ := json.Marshal(session.PlaceRequest{Op: session.PlaceActivate, Session: id})
	msg := &nats.Msg{Subject: h.cfg.Subjects.Place(), Data: b, Header: nats.Header{}}
	msg.Header.Set(session.HeaderUser, owner)
	if err := h.cfg.NATS.PublishMsg(msg); err != nil {
		h.log.Warn("hand queued prompts to another node", "session", id, "err", err)
	}
}
