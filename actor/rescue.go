package actor

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
)

// Work nobody is connected to wake. A session that is active in the catalog
// may have an interrupted turn to finish or queued prompts to run, with no
// client around to send it a command. Two paths activate such sessions:
//
//   - resume, when a node starts: its own sessions (the catalog names the
//     node that last held each), and those of nodes whose lease is gone
//     (they died while nobody was watching);
//   - watchNodes, while a node runs: when another node's lease ends (it
//     expired — the node died or was cut off — or was deleted at shutdown),
//     the first node to claim the end (a create in the owners bucket)
//     activates every session the catalog says was active there, taking
//     each over as a command would. It activates them itself rather than
//     through the place queue group: a node whose lease ended may still be
//     subscribed to it (a frozen process keeps its connection), and half
//     the requests would wait on a node that cannot answer.

// resume activates the sessions that were active on this node when it last
// stopped, and those of nodes that are gone.
func (h *Host) resume(ctx context.Context) {
	entries, err := h.activeEntries(ctx)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("resume active sessions: read catalog", "err", err)
		}
		return
	}
	alive := map[string]bool{h.cfg.NodeID: true}
	done := map[session.ID]bool{}
	for _, c := range entries {
		if c.Node != "" && c.Node != h.cfg.NodeID {
			live, ok := alive[c.Node]
			if !ok {
				msg, err := h.owners.Latest(ctx, session.NodeLeaseKey(c.Node))
				live = err != nil || (msg != nil && !msg.Deleted) // In doubt, leave it.
				alive[c.Node] = live
			}
			if live {
				continue
			}
		}
		h.activate(c)
		done[c.ID] = true
	}
	n := len(done)
	n += h.resumeHeld(ctx, done)
	if n > 0 {
		h.log.Info("resuming sessions that were active when their node stopped", "sessions", n)
	}
}

// resumeHeld activates the sessions whose ownership record names an
// incarnation that is gone (an earlier process of this node, or a node whose
// lease ended or was taken again) and that the catalog pass did not (done):
// the records say who held a session, the catalog's node and state are hints
// a paused node could leave stale (see rescue). It returns how many.
func (h *Host) resumeHeld(ctx context.Context, done map[session.ID]bool) int {
	recs, err := h.owners.List(ctx, session.LeaseKey(">"))
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("resume held sessions: read the ownership records", "err", err)
		}
		return 0
	}
	const doubt = "\x00" // a lease that could not be read: leave its sessions
	incs := map[string]string{}
	if inc, _, ok := h.node.current(); ok {
		incs[h.cfg.NodeID] = inc
	}
	n := 0
	for _, r := range recs {
		id := session.ID(strings.TrimPrefix(r.Key, session.LeaseKey("")))
		var rec session.Lease
		if id.Validate() != nil || done[id] || json.Unmarshal(r.Value, &rec) != nil || rec.Node == "" || rec.Inc == "" {
			continue
		}
		inc, ok := incs[rec.Node]
		if !ok {
			msg, err := h.owners.Latest(ctx, session.NodeLeaseKey(rec.Node))
			var nl session.Lease
			switch {
			case err != nil:
				inc = doubt
			case msg != nil && !msg.Deleted && json.Unmarshal(msg.Value, &nl) == nil:
				inc = nl.Inc
			}
			incs[rec.Node] = inc
		}
		if inc == doubt || inc == rec.Inc {
			continue // Held by a live incarnation, or in doubt.
		}
		h.activate(session.CatalogEntry{ID: id})
		done[id] = true
		n++
	}
	if n > 0 {
		h.log.Warn("resuming sessions held by a node that is gone which the catalog did not show as active there", "sessions", n)
	}
	return n
}

// watchNodes rescues the active sessions of every node whose lease ends
// while this node runs. Two paths see an end: a watcher of the node leases
// (at once, as a delete or an expiry marker), and a poll, every half TTL,
// of the newest message of every node lease this node has heard of, read
// from the stream's leader. The poll ends itself a lease that has not been
// renewed for staleAfter (see endStale), and rescues a lease found ended
// that nobody rescued; it needs no watcher, which is what makes it work
// after this process was paused (its watcher's consumer may be gone then)
// or when the servers fail to expire a lease. The watcher is made again
// when it delivers nothing for two TTLs: this node's own renewals pass
// through it every third of a TTL.
func (h *Host) watchNodes(ctx context.Context) {
	ttl := h.cfg.LeaseTTL
	names := &nodeNames{set: map[string]bool{}}
	// The poll runs apart from the watcher: making a watcher again is a
	// JetStream request that can wait long for a lost reply.
	h.wg.Go(func() { h.pollNodes(ctx, names) })
	tick := time.NewTicker(ttl / 2)
	defer tick.Stop()
	for ctx.Err() == nil {
		start := time.Now()
		updates, stop, err := h.owners.Watch(ctx, session.NodeLeaseKey("*"))
		if took := time.Since(start); took > ttl {
			h.log.Warn("watching the node leases took long to start", "took", took.Round(time.Millisecond), "err", err)
		}
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("watch node leases; retrying", "err", err)
				select {
				case <-time.After(ttl / 4):
				case <-ctx.Done():
				}
			}
			continue
		}
		last := time.Now() // of the last update this watcher delivered
	watch:
		for {
			var ent *ajs.Record
			select {
			case e, ok := <-updates:
				if !ok {
					break watch
				}
				ent = e
				last = time.Now()
			case <-tick.C:
				if time.Since(last) >= 2*ttl {
					h.log.Warn("the node lease watcher delivered nothing for two lease TTLs; watching again", "silent_for", time.Since(last).Round(time.Millisecond))
					break watch
				}
				continue
			case <-ctx.Done():
				break watch
			}
			if ent == nil {
				continue
			}
			node := strings.TrimPrefix(ent.Key, session.NodeLeaseKey(""))
			if node == h.cfg.NodeID {
				continue
			}
			names.add(node)
			if ent.Deleted {
				h.claimRescue(ctx, names, node, ent.Rev)
			}
		}
		stop()
	}
}

// nodeNames is the set of other nodes the watcher has heard of, read by
// the poll, and the rescue claims this node has tried.
type nodeNames struct {
	mu  sync.Mutex
	set map[string]bool // guarded by mu
	// claims: a claim (key) being tried (false) or settled (true: made,
	// by this node or another); guarded by mu.
	claims map[string]bool
}

// startClaim reports whether claim is neither being tried nor settled,
// and marks it as being tried.
func (n *nodeNames) startClaim(claim string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.claims[claim]; ok {
		return false
	}
	if n.claims == nil {
		n.claims = map[string]bool{}
	}
	n.claims[claim] = false
	return true
}

// endClaim settles claim, or forgets it so that it is tried again.
func (n *nodeNames) endClaim(claim string, settled bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if settled {
		n.claims[claim] = true
	} else {
		delete(n.claims, claim)
	}
}

func (n *nodeNames) add(node string) {
	n.mu.Lock()
	n.set[node] = true
	n.mu.Unlock()
}

func (n *nodeNames) list() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.set))
	for node := range n.set {
		out = append(out, node)
	}
	return out
}

// pollNodes polls every node in names every half TTL until ctx ends (see
// watchNodes and pollNode).
func (h *Host) pollNodes(ctx context.Context, names *nodeNames) {
	type polled struct {
		rev uint64
		at  time.Time
	}
	known := map[string]*polled{}
	tick := time.NewTicker(h.cfg.LeaseTTL / 2)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		for _, node := range names.list() {
			p := known[node]
			if p == nil {
				p = &polled{}
				known[node] = p
			}
			start := time.Now()
			h.pollNode(ctx, names, node, &p.rev, &p.at)
			if took := time.Since(start); took > 2*h.cfg.LeaseTTL {
				// The poll is the path that works after a pause: a poll
				// that blocks leaves a frozen node's sessions unrescued.
				h.log.Warn("polling a node lease took long", "node", node, "took", took.Round(time.Millisecond))
			}
		}
	}
}

// pollNode reads node's lease from the stream's leader: an end (delete or
// expiry marker) is rescued if nobody did (claimRescue); a lease whose
// revision has not changed for staleAfter since this node first read it is
// ended (endStale). rev and at are the poll's memory of the node.
func (h *Host) pollNode(ctx context.Context, names *nodeNames, node string, rev *uint64, at *time.Time) {
	rctx, cancel := context.WithTimeout(ctx, h.cfg.LeaseTTL/2)
	msg, err := h.owners.Latest(rctx, session.NodeLeaseKey(node))
	cancel()
	switch {
	case err != nil:
		h.log.Warn("poll a node lease", "node", node, "err", err)
		return
	case msg == nil:
		// Gone without a trace: nats-server 2.15.2 was seen to expire a
		// node lease's message without writing the marker that watchers
		// see. A lease this poll saw before is then over: rescue it.
		if *rev != 0 {
			h.claimRescue(ctx, names, node, *rev)
			*rev = 0
		}
		return
	case msg.Deleted:
		h.claimRescue(ctx, names, node, msg.Rev)
		return
	case msg.Rev != *rev:
		*rev, *at = msg.Rev, time.Now()
	case time.Since(*at) >= staleAfter(h.cfg.LeaseTTL):
		h.endStale(ctx, node, *rev, time.Since(*at))
		*at = time.Now() // once per staleAfter at most
	}
}

// claimRescue rescues node's sessions if this node is the first to claim
// the end of its lease at revision rev (a create in the owners bucket,
// naming this node). The watcher and the poll both call it for one end;
// names keeps it to one try at a time. A create that failed otherwise than
// finding the claim made (a timeout under load) is tried again by the next
// poll, and a claim found made by this node itself (the create was applied
// but its reply lost) is rescued as if just made. Before, any failure of
// the create gave up, and a claim whose reply was lost was rescued by
// nobody: a session of a frozen node then waited until that node ran again.
func (h *Host) claimRescue(ctx context.Context, names *nodeNames, node string, rev uint64) {
	claim := "rescue." + node + "." + strconv.FormatUint(rev, 10)
	if !names.startClaim(claim) {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, h.cfg.LeaseTTL)
	_, err := h.owners.Create(cctx, claim, []byte(h.cfg.NodeID), ownersMarkerTTL)
	if errors.Is(err, ajs.ErrExists) {
		var cur *ajs.Record
		if cur, err = h.owners.Latest(cctx, claim); err == nil && (cur == nil || cur.Deleted || string(cur.Value) != h.cfg.NodeID) {
			cancel()
			names.endClaim(claim, true) // Another node's: it rescues.
			return
		}
	}
	cancel()
	if err != nil {
		names.endClaim(claim, false)
		if ctx.Err() == nil {
			h.log.Warn("claim the rescue of a node whose lease ended; retrying at the next poll", "gone", node, "err", err)
		}
		return
	}
	names.endClaim(claim, true)
	h.log.Info("a node's lease ended; this node rescues its sessions", "gone", node, "lease_revision", rev)
	if h.rescueHook != nil {
		h.rescueHook(node)
		return
	}
	h.rescue(ctx, node)
}

// staleAfter is how long after seeing a node lease's last renewal a node
// ends that lease itself: the TTL and a half. The holder stops writing
// leaseSafeAge (two thirds of the TTL) after the start of that renewal,
// which came before it was seen, so it has stopped well before.
func staleAfter(ttl time.Duration) time.Duration { return ttl + ttl/2 }

// endStale deletes node's lease, if its newest revision is still rev (a
// compare-and-set: a renewal since then keeps it), when the NATS servers
// failed to expire it by its TTL. Seen with nats-server 2.15.2 in a 3-server
// cluster (issue 21): after one node lease expired and was taken again, the
// per-message TTL of another node's lease no longer fired, so that node,
// frozen, was never taken over. Everyone watching sees the delete as the
// lease's end, as they would the expiry's marker.
func (h *Host) endStale(ctx context.Context, node string, rev uint64, unseen time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.LeaseTTL)
	defer cancel()
	_, err := h.owners.Delete(ctx, session.NodeLeaseKey(node), rev)
	switch {
	case err == nil:
		h.log.Warn("ended the lease of a node that stopped renewing it (its TTL did not expire it)",
			"gone", node, "unrenewed_for", unseen.Round(time.Millisecond))
	case isWrongLastSeq(err):
		// Renewed meanwhile, or ended: the next poll sees which.
	default:
		h.log.Warn("end the lease of a node that stopped renewing it", "gone", node, "err", err)
	}
}

// rescue activates on this node every session that node, whose lease
// ended, held: those whose ownership record names it, and those the catalog
// says were active on it. Reading both is retried with backoff for up to a
// minute: this node claimed the rescue, nobody else does it.
//
// The records are what decides: they are written with compare-and-set
// only, so a paused node cannot write one over its successor's. The
// catalog's node field can be stale: a catalog write that passed its lease
// check just before a pause (SIGSTOP) reaches NATS at the thaw, over the
// entry of the node that took the session over meanwhile; a rescue that
// read only the catalog then found nothing of the next node to freeze, and
// its sessions waited until it ran again (issue 21, a third freeze in a
// row). The catalog still adds sessions active on node that it held no
// record of (a node that stopped with prompts queued).
func (h *Host) rescue(ctx context.Context, node string) {
	var (
		entries []session.CatalogEntry
		held    []session.ID
	)
	backoff := retry.Policy{Min: 50 * time.Millisecond, Max: time.Second}.BackOff()
	deadline := time.Now().Add(time.Minute)
	for {
		rctx, cancel := context.WithTimeout(ctx, openTimeout)
		var err error
		if entries, err = h.catalogEntries(rctx); err == nil {
			held, err = h.heldBy(rctx, node)
		}
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			h.log.Warn("rescue the sessions of a node that is gone: read the catalog and the ownership records", "gone", node, "err", err)
			return
		}
		h.log.Info("rescue the sessions of a node that is gone: read the catalog and the ownership records; retrying", "gone", node, "err", err)
		select {
		case <-time.After(backoff.NextBackOff()):
		case <-ctx.Done():
			return
		}
	}
	byID := make(map[session.ID]session.CatalogEntry, len(entries))
	var todo []session.CatalogEntry
	active := 0
	for _, c := range entries {
		byID[c.ID] = c
		if c.State == session.StateActive {
			active++
			if c.Node == node {
				todo = append(todo, c)
			}
		}
	}
	var stale []session.ID
	for _, id := range held {
		c, ok := byID[id]
		switch {
		case !ok:
			// Deleted meanwhile, or never written: nobody to act as.
			h.log.Warn("a session held by a node that is gone has no catalog entry; not rescued", "gone", node, "session", id)
		case c.State != session.StateActive || c.Node != node:
			todo = append(todo, c)
			stale = append(stale, id)
		}
	}
	if len(stale) > 0 {
		h.log.Warn("the catalog did not name the node that held these sessions; rescuing them from their ownership records",
			"gone", node, "sessions", stale)
	}
	for _, c := range todo {
		h.wg.Go(func() { h.rescueOne(ctx, c) })
	}
	if len(todo) > 0 {
		h.log.Info("taking over the active sessions of a node whose lease ended", "gone", node, "sessions", len(todo))
	} else {
		h.log.Info("a node whose lease ended held no session and had no active one in the catalog", "gone", node, "active", active)
	}
}

// heldBy returns the sessions whose ownership record names node under an
// incarnation its lease does not name now: those it held when its lease
// ended (a node that came back under a new incarnation keeps what it took
// since).
func (h *Host) heldBy(ctx context.Context, node string) ([]session.ID, error) {
	recs, err := h.owners.List(ctx, session.LeaseKey(">"))
	if err != nil {
		return nil, err
	}
	var live string
	if cur, err := h.owners.Latest(ctx, session.NodeLeaseKey(node)); err != nil {
		return nil, err
	} else if cur != nil && !cur.Deleted {
		var nl session.Lease
		if json.Unmarshal(cur.Value, &nl) == nil {
			live = nl.Inc
		}
	}
	var out []session.ID
	for _, r := range recs {
		var rec session.Lease
		if json.Unmarshal(r.Value, &rec) != nil || rec.Node != node || rec.Inc == "" || rec.Inc == live {
			continue
		}
		id := session.ID(strings.TrimPrefix(r.Key, session.LeaseKey("")))
		if id.Validate() != nil {
			continue
		}
		out = append(out, id)
	}
	return out, nil
}

// rescueOne activates session c on this node, through its own place
// subject so that the answer is seen: a failure is logged, and an
// unavailable answer (the record is still held a moment, the activation
// raced with a command) is retried with backoff for up to a minute. Without
// this a failed rescue went unnoticed, and a session whose old node is
// frozen (still subscribed to its command subject) stayed unserved until
// that node ran again.
func (h *Host) rescueOne(ctx context.Context, c session.CatalogEntry) {
	b, _ := json.Marshal(session.PlaceRequest{Op: session.PlaceActivate, Session: c.ID})
	backoff := retry.Policy{Min: 50 * time.Millisecond, Max: time.Second}.BackOff()
	deadline := time.Now().Add(time.Minute)
	for {
		msg := &nats.Msg{Subject: h.cfg.Subjects.PlaceOn(h.cfg.NodeID), Data: b, Header: nats.Header{}}
		msg.Header.Set(session.HeaderUser, c.Owner)
		rctx, cancel := context.WithTimeout(ctx, openTimeout)
		resp, err := h.cfg.NATS.RequestMsgWithContext(rctx, msg)
		cancel()
		var rep session.Reply
		if err == nil {
			if err = json.Unmarshal(resp.Data, &rep); err == nil && rep.Error != nil {
				err = rep.Error
			}
		}
		if err == nil || ctx.Err() != nil {
			return
		}
		var serr *session.Error
		again := !errors.As(err, &serr) || serr.Code == session.CodeUnavailable
		if !again || time.Now().After(deadline) {
			h.log.Warn("rescue a session of a node that is gone", "session", c.ID, "err", err)
			return
		}
		h.log.Info("rescue a session of a node that is gone: retrying", "session", c.ID, "err", err)
		select {
		case <-time.After(backoff.NextBackOff()):
		case <-ctx.Done():
			return
		}
	}
}

// activate starts activating session c on this node.
func (h *Host) activate(c session.CatalogEntry) {
	h.system.Root.Send(h.manager, &placeMsg{req: session.PlaceRequest{Op: session.PlaceActivate, Session: c.ID}})
}

// activeEntries reads the catalog entries whose state is active.
func (h *Host) activeEntries(ctx context.Context) ([]session.CatalogEntry, error) {
	all, err := h.catalogEntries(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, c := range all {
		if c.State == session.StateActive {
			out = append(out, c)
		}
	}
	return out, nil
}

// catalogEntries reads every entry of the catalog, whatever its state;
// unreadable entries are left out.
func (h *Host) catalogEntries(ctx context.Context) ([]session.CatalogEntry, error) {
	w, err := h.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var out []session.CatalogEntry
	for {
		var ent jetstream.KeyValueEntry
		select {
		case ent = <-w.Updates():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if ent == nil {
			return out, nil // The initial values are done.
		}
		var c session.CatalogEntry
		if err := json.Unmarshal(ent.Value(), &c); err != nil || c.ID.Validate() != nil {
			continue
		}
		out = append(out, c)
	}
}
