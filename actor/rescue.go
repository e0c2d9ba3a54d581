package actor

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
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
//     places every session the catalog says was active there. The place
//     queue group spreads them over the nodes; each takes the session over
//     as a command would.

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
	n := 0
	for _, c := range entries {
		if c.Node != "" && c.Node != h.cfg.NodeID {
			live, ok := alive[c.Node]
			if !ok {
				msg, err := h.ownersLatest(ctx, session.NodeLeaseKey(c.Node))
				live = err != nil || (msg != nil && !isKVDelete(msg.Header)) // In doubt, leave it.
				alive[c.Node] = live
			}
			if live {
				continue
			}
		}
		h.activate(c)
		n++
	}
	if n > 0 {
		h.log.Info("resuming sessions that were active when their node stopped", "sessions", n)
	}
}

// watchNodes rescues the active sessions of every node whose lease ends
// while this node runs.
func (h *Host) watchNodes(ctx context.Context) {
	w, err := h.owners.Watch(ctx, session.NodeLeaseKey("*"), jetstream.UpdatesOnly())
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("watch node leases", "err", err)
		}
		return
	}
	defer w.Stop()
	for {
		var ent jetstream.KeyValueEntry
		select {
		case ent = <-w.Updates():
		case <-ctx.Done():
			return
		}
		if ent == nil || (ent.Operation() != jetstream.KeyValueDelete && ent.Operation() != jetstream.KeyValuePurge) {
			continue
		}
		node := strings.TrimPrefix(ent.Key(), session.NodeLeaseKey(""))
		if node == h.cfg.NodeID {
			continue
		}
		// One node rescues each end of a lease: the one whose create of
		// the claim succeeds.
		claim := "rescue." + node + "." + strconv.FormatUint(ent.Revision(), 10)
		if _, err := h.owners.Create(ctx, claim, []byte(h.cfg.NodeID), jetstream.KeyTTL(ownersMarkerTTL)); err != nil {
			continue
		}
		h.rescue(ctx, node)
	}
}

// rescue places every session the catalog says was active on node.
func (h *Host) rescue(ctx context.Context, node string) {
	entries, err := h.activeEntries(ctx)
	if err != nil {
		h.log.Warn("rescue the sessions of a node that is gone: read catalog", "gone", node, "err", err)
		return
	}
	n := 0
	for _, c := range entries {
		if c.Node == node {
			h.replace(c.ID, c.Owner)
			n++
		}
	}
	if n > 0 {
		h.log.Info("placing the active sessions of a node whose lease ended", "gone", node, "sessions", n)
	}
}

// activate starts activating session c on this node.
func (h *Host) activate(c session.CatalogEntry) {
	h.system.Root.Send(h.manager, &placeMsg{req: session.PlaceRequest{Op: session.PlaceActivate, Session: c.ID}})
}

// activeEntries reads the catalog entries whose state is active.
func (h *Host) activeEntries(ctx context.Context) ([]session.CatalogEntry, error) {
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
		if err := json.Unmarshal(ent.Value(), &c); err != nil || c.State != session.StateActive || c.ID.Validate() != nil {
			continue
		}
		out = append(out, c)
	}
}
