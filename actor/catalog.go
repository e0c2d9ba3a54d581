package actor

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
)

// catalogTimeout bounds one catalog write.
const catalogTimeout = 5 * time.Second

// catalogTries is how many compare-and-sets an owner's catalog write tries
// before giving up (writeOwned), waiting by catalogRetry between them (a
// revision read from a replica that lags fails the compare-and-set until it
// catches up).
const catalogTries = 5

var catalogRetry = retry.Policy{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}

// catalogWriter mirrors session state to the catalog KV bucket off the
// actors' paths. Writes for one session are coalesced: only the newest state
// is written, and a delete replaces any put still waiting.
type catalogWriter struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu      sync.Mutex
	pending map[session.ID]*session.CatalogEntry // nil entry = delete; guarded by mu
	// guards holds, for a pending entry written as the session's owner,
	// the check that this node still owns it (lease.check), asked right
	// before the write; guarded by mu.
	guards  map[session.ID]func() error
	waiters map[session.ID][]func() // run once id's next write was tried; guarded by mu
	busy    int                     // writes taken but not finished; guarded by mu
	stopped bool                    // guarded by mu
	idle    *sync.Cond              // signalled when pending is empty and busy is 0

	// revs is the revision of each session's entry after this writer's
	// last compare-and-set of it (writeOwned); owned by run.
	revs map[session.ID]uint64

	wake chan struct{} // cap 1
	done chan struct{} // closed by stop
}

func newCatalogWriter(kv jetstream.KeyValue, log *slog.Logger) *catalogWriter {
	c := &catalogWriter{
		kv:      kv,
		log:     log,
		pending: map[session.ID]*session.CatalogEntry{},
		guards:  map[session.ID]func() error{},
		revs:    map[session.ID]uint64{},
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	c.idle = sync.NewCond(&c.mu)
	return c
}

// put schedules writing e (a copy is taken).
func (c *catalogWriter) put(e session.CatalogEntry) {
	e.Members = cloneMembers(e.Members)
	c.schedule(e.ID, &e)
}

// putThen schedules writing e, as put, and runs done (on the writer's
// goroutine) once a write of e or of a newer entry of its session was tried.
// A reply that must not overtake the catalog (a role change: gateways
// authorize from the catalog) is sent from done.
func (c *catalogWriter) putThen(e session.CatalogEntry, done func()) { c.putThenOwned(e, nil, done) }

// putThenOwned is putThen (done may be nil) for an owner's entry (active,
// naming this node): it is written only if owned still returns nil then,
// so not once this node may have lost the session. A node paused (SIGSTOP,
// a long GC pause) with an entry pending wrote it at the thaw, over the
// entry of the node that took the session over meanwhile; the catalog then
// named the paused node, and when the new owner was paused in turn nobody
// rescued its session (rescue activates what the catalog says was active on
// the node that is gone; issue 21). done runs whether or not it was written.
func (c *catalogWriter) putThenOwned(e session.CatalogEntry, owned func() error, done func()) {
	c.mu.Lock()
	if c.stopped && done != nil {
		c.mu.Unlock()
		done()
		return
	}
	if done != nil {
		if c.waiters == nil {
			c.waiters = map[session.ID][]func(){}
		}
		// Under the same lock as the entry, so that done waits for this
		// write and not for one of an older entry taken meanwhile.
		c.waiters[e.ID] = append(c.waiters[e.ID], done)
	}
	e.Members = cloneMembers(e.Members)
	c.pending[e.ID] = &e
	c.setGuardLocked(e.ID, owned)
	c.mu.Unlock()
	c.kick()
}

// setGuardLocked records the check of id's pending entry (nil: none).
func (c *catalogWriter) setGuardLocked(id session.ID, owned func() error) {
	if owned == nil {
		delete(c.guards, id)
	} else {
		c.guards[id] = owned
	}
}

// remove schedules deleting id's entry.
func (c *catalogWriter) remove(id session.ID) { c.schedule(id, nil) }

func (c *catalogWriter) schedule(id session.ID, e *session.CatalogEntry) {
	c.mu.Lock()
	c.pending[id] = e
	c.setGuardLocked(id, nil)
	c.mu.Unlock()
	c.kick()
}

func (c *catalogWriter) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// flush waits until every scheduled write has been tried.
func (c *catalogWriter) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for (len(c.pending) > 0 || c.busy > 0) && !c.stopped {
		c.idle.Wait()
	}
}

// stop writes what is pending and ends run.
func (c *catalogWriter) stop() {
	close(c.done)
}

func (c *catalogWriter) run() {
	for {
		select {
		case <-c.wake:
			c.writeAll()
		case <-c.done:
			c.writeAll()
			c.mu.Lock()
			c.stopped = true
			c.idle.Broadcast()
			left := c.waiters
			c.waiters = nil
			c.mu.Unlock()
			for _, fs := range left {
				for _, f := range fs {
					f()
				}
			}
			return
		}
	}
}

func (c *catalogWriter) writeAll() {
	for {
		c.mu.Lock()
		batch := c.pending
		if len(batch) == 0 {
			c.idle.Broadcast()
			c.mu.Unlock()
			return
		}
		guards := c.guards
		c.pending, c.guards = map[session.ID]*session.CatalogEntry{}, map[session.ID]func() error{}
		c.busy = len(batch)
		waiters := map[session.ID][]func(){}
		for id := range batch {
			if fs, ok := c.waiters[id]; ok {
				waiters[id] = fs
				delete(c.waiters, id)
			}
		}
		c.mu.Unlock()
		for id, e := range batch {
			if owned := guards[id]; owned != nil {
				c.writeOwned(id, e, owned)
				for _, f := range waiters[id] {
					f()
				}
				continue
			}
			rev, known := c.revs[id]
			delete(c.revs, id)
			if known && e != nil {
				c.writeIfUnchanged(id, e, rev)
			} else {
				c.write(id, e)
			}
			for _, f := range waiters[id] {
				f()
			}
		}
		c.mu.Lock()
		c.busy = 0
		c.mu.Unlock()
	}
}

// writeOwned writes an owner's entry e if owned returns nil, with a
// compare-and-set on the entry's revision read before owned is asked. A
// check followed by a plain put was not enough: a node paused (SIGSTOP, a
// long GC pause) between the two sent the put at its thaw, over the entry
// of the node that took the session over meanwhile, and the catalog named
// the paused node again (issue 21, a third freeze in a row: seen at the
// thaw in TestCluster_FreezeOwner with a pause widened between the two).
// A revision read before a check that passed predates any new owner (it
// writes only after this node's lease is gone), so the new owner's write,
// whenever it lands, fails this one; a write of this node that lands first
// is overwritten by the new owner's, which retries on the revision it finds.
func (c *catalogWriter) writeOwned(id session.ID, e *session.CatalogEntry, owned func() error) {
	b, err := json.Marshal(e)
	if err != nil {
		c.log.Warn("write catalog entry", "session", id, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
	defer cancel()
	for try := range catalogTries {
		if try > 0 {
			select {
			case <-time.After(catalogRetry.Delay(try)):
			case <-ctx.Done():
			}
		}
		rev, known := c.revs[id]
		if !known {
			ent, err := c.kv.Get(ctx, string(id))
			switch {
			case err == nil:
				rev = ent.Revision()
			case errors.Is(err, jetstream.ErrKeyNotFound):
				rev = 0 // Not written yet: the first write creates it.
			default:
				c.log.Warn("write catalog entry: read its revision", "session", id, "err", err)
				return
			}
		}
		if err := owned(); err != nil {
			c.log.Debug("catalog entry not written: this node may no longer own the session", "session", id, "err", err)
			return
		}
		next, err := c.kv.Update(ctx, string(id), b, rev)
		if err == nil {
			c.revs[id] = next
			return
		}
		delete(c.revs, id)
		if !isWrongLastSeq(err) {
			c.log.Warn("write catalog entry", "session", id, "err", err)
			return
		}
		// Written meanwhile (another node, or a write of this one whose
		// reply was lost): read it again and ask owned again.
	}
	c.log.Warn("write catalog entry: written by others at every try", "session", id, "tries", catalogTries)
}

// writeIfUnchanged writes e, an entry put without a check (the one a
// session writes when it hibernates, after its record is released), if rev,
// the revision of this writer's last owner write of it, is still the
// entry's: a write since then is another node's, which activated the
// session after this one released it, and is newer. Before, a node paused
// between the release and this put wrote it over the new owner's entry.
func (c *catalogWriter) writeIfUnchanged(id session.ID, e *session.CatalogEntry, rev uint64) {
	b, err := json.Marshal(e)
	if err != nil {
		c.log.Warn("write catalog entry", "session", id, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
	defer cancel()
	_, err = c.kv.Update(ctx, string(id), b, rev)
	switch {
	case err == nil:
	case isWrongLastSeq(err):
		c.log.Info("catalog entry not written: another node wrote it since this node released the session", "session", id)
	default:
		c.log.Warn("write catalog entry", "session", id, "err", err)
	}
}

func (c *catalogWriter) write(id session.ID, e *session.CatalogEntry) {
	ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
	defer cancel()
	if e == nil {
		if err := c.kv.Delete(ctx, string(id)); err != nil {
			c.log.Warn("delete catalog entry", "session", id, "err", err)
		}
		return
	}
	b, err := json.Marshal(e)
	if err == nil {
		_, err = c.kv.Put(ctx, string(id), b)
	}
	if err != nil {
		c.log.Warn("write catalog entry", "session", id, "err", err)
	}
}

func cloneMembers(m session.Members) session.Members {
	out := make(session.Members, len(m))
	for u, r := range m {
		out[u] = r
	}
	return out
}

// putCatalog schedules writing the session's catalog entry as it is now.
func (s *sessionActor) putCatalog() { s.putCatalogThen(nil) }

// putCatalogThen is putCatalog, and runs done (off the actor) once the entry
// was written (or its write failed and was logged).
func (s *sessionActor) putCatalogThen(done func()) {
	s.catalogAt = time.Now()
	s.catalogSeq, s.catalogSandbox = s.events.durable, s.sandbox.sandboxState
	// Not written once the session is no longer held (s.lease is nil
	// after a teardown, close or delete): only its owner names this node.
	owned := func() error { return errLeaseLost }
	if l := s.lease; l != nil {
		owned = l.check
	}
	s.h.catalog.putThenOwned(s.catalogEntry(session.StateActive), owned, done)
}

// catalogChanged keeps the catalog entry of an active session fresh while
// events are committed: it is rewritten at once if it was not written during
// the last CatalogInterval, else when that interval is up, so a busy session
// writes it at most once per interval.
func (s *sessionActor) catalogChanged() {
	if s.timers.catalogTimer != nil || s.events.durable == s.catalogSeq && s.sandbox.sandboxState == s.catalogSandbox {
		return
	}
	switch s.act.phase {
	case phaseActive, phaseDraining, phaseWaking:
	default:
		return // closing or deleting write their own entry
	}
	wait := s.h.cfg.CatalogInterval - time.Since(s.catalogAt)
	if wait <= 0 {
		s.putCatalog()
		return
	}
	s.timers.catalogTimer = time.AfterFunc(wait, func() { s.send(&catalogTick{}) })
}

func (s *sessionActor) stopCatalogTimer() {
	if s.timers.catalogTimer != nil {
		s.timers.catalogTimer.Stop()
		s.timers.catalogTimer = nil
	}
}
