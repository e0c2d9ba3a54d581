package gateway_test

// Placement affinity with two real nodes: a hibernated session wakes on the
// node whose disk has its history file, and on another node once that one
// is gone.

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// affinityNode is a real node with its own disk.
type affinityNode struct {
	id   string
	host *actor.Host
	dir  *sqlite.Dir
}

// holds reports whether the node holds id's ownership lease (the session
// is active there).
func (n *affinityNode) holds(id session.ID) bool {
	for _, l := range n.host.Leases() {
		if l.Session == id {
			return true
		}
	}
	return false
}

// startAffinityNode runs a real node named id on ns with its own histories
// directory; Cleanup closes it (again, if the test did).
func startAffinityNode(t testing.TB, ns *server.Server, id string, hibernateAfter time.Duration) *affinityNode {
	t.Helper()
	n := &affinityNode{id: id, dir: &sqlite.Dir{Path: filepath.Join(t.TempDir(), "histories-"+id), Logger: testLogger()}}
	n.host = startNodeWith(t, ns, func(c *actor.Config) {
		c.Histories, c.NodeID, c.HibernateAfter = histories{n.dir}, id, hibernateAfter
		c.SecretKeys, c.DrainGrace, c.Logger = nil, 100*time.Millisecond, c.Logger.With("node", id)
	})
	return n
}

// affinityCount returns atrium_gateway_place_affinity_total{result=result}.
func affinityCount(t testing.TB, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "atrium_gateway_place_affinity_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no atrium_gateway_place_affinity_total{result=%q}", result)
	return 0
}

// TestGateway_PlacementAffinity: a session created on one of two nodes and
// woken through the gateway ten times in a row, hibernating in between,
// wakes every time on the node whose disk has its history file (the other
// node never gets a file; with random placement all ten would land there
// with probability 1/1024). Once that node is stopped, a wake falls back to
// the queue group and the other node takes the session over.
func TestGateway_PlacementAffinity(t *testing.T) {
	ns := startNATS(t)
	nodes := map[string]*affinityNode{}
	for _, id := range []string{"node-a", "node-b"} {
		nodes[id] = startAffinityNode(t, ns, id, 300*time.Millisecond)
	}
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	js, err := jetstream.New(connectNATS(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), session.Subjects{}.CatalogBucket())
	if err != nil {
		t.Fatal(err)
	}
	entry := func(id session.ID) session.CatalogEntry {
		t.Helper()
		ent, err := kv.Get(context.Background(), string(id))
		if err != nil {
			t.Fatalf("catalog entry %s: %v", id, err)
		}
		var ce session.CatalogEntry
		if err := json.Unmarshal(ent.Value(), &ce); err != nil {
			t.Fatalf("decode catalog entry %s: %v", id, err)
		}
		return ce
	}
	// hibernated waits until the session has hibernated, no node holds its
	// lease and the gateway sees it hibernated (GET answers from the
	// gateway's catalog copy once the actor is gone), and returns the node
	// its catalog entry names. The catalog is watched first: asking the
	// session would keep it awake.
	hibernated := func(id session.ID) string {
		t.Helper()
		eventually(t, "the session to hibernate", func() bool {
			return entry(id).State == session.StateHibernated
		})
		eventually(t, "the session's lease to be released", func() bool {
			for _, n := range nodes {
				if n.holds(id) {
					return false
				}
			}
			return true
		})
		eventually(t, "the gateway to see the session hibernated", func() bool {
			code, body := e.call("GET", "/v1/sessions/"+string(id), "alice", nil)
			var got session.Session
			if code != 200 || json.Unmarshal(body, &got) != nil {
				t.Fatalf("get: %d %s", code, body)
			}
			return got.State == session.StateHibernated
		})
		return entry(id).Node
	}

	s := e.create("alice", "sticky")
	home := hibernated(s.ID)
	if nodes[home] == nil {
		t.Fatalf("catalog entry names node %q, want one of the two", home)
	}
	var other *affinityNode
	for id, n := range nodes {
		if id != home {
			other = n
		}
	}
	if !nodes[home].dir.Exists(s.ID) || other.dir.Exists(s.ID) {
		t.Fatalf("history file on %s: %v, on %s: %v; want it on %s only",
			home, nodes[home].dir.Exists(s.ID), other.id, other.dir.Exists(s.ID), home)
	}

	roles := []session.Role{session.RoleViewer, session.RoleDriver}
	for i := range 10 {
		// A member change is a command that activates the session.
		e.member(s.ID, "alice", "bob", roles[i%2])
		if got := hibernated(s.ID); got != home {
			t.Fatalf("wake %d: the session ran on %q, want %s (where its history is)", i+1, got, home)
		}
		if other.dir.Exists(s.ID) {
			t.Fatalf("wake %d: node %s got a history file: the session was placed there", i+1, other.id)
		}
		if hits := affinityCount(t, e.reg, "hit"); hits != float64(i+1) {
			t.Fatalf("wake %d: %v affinity hits, want %d", i+1, hits, i+1)
		}
	}
	if miss, unknown := affinityCount(t, e.reg, "miss"), affinityCount(t, e.reg, "unknown"); miss != 0 || unknown != 0 {
		t.Fatalf("affinity misses %v, unknown %v; want none", miss, unknown)
	}

	// The home node shuts down: its own place subject has no responder, so
	// the wake goes to the queue group, and the other node restores the
	// session from the events stream.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := nodes[home].host.Close(ctx); err != nil {
		t.Fatalf("close node %s: %v", home, err)
	}
	e.member(s.ID, "alice", "carol", session.RoleViewer)
	if miss := affinityCount(t, e.reg, "miss"); miss != 1 {
		t.Fatalf("%v affinity misses after the home node stopped, want 1", miss)
	}
	if got := hibernated(s.ID); got != other.id {
		t.Fatalf("after the home node stopped the session ran on %q, want %s", got, other.id)
	}
	if !other.dir.Exists(s.ID) {
		t.Fatalf("node %s has no history file after taking the session over", other.id)
	}
	ce := entry(s.ID)
	if ce.Members["bob"] != roles[1] || ce.Members["carol"] != session.RoleViewer {
		t.Fatalf("members after takeover: %v", ce.Members)
	}
	// Every event is still there, in order, after the takeover.
	code, body := e.call("GET", "/v1/sessions/"+string(s.ID)+"/events?limit=1000&after=0", "alice", nil)
	var page struct{ Events []json.RawMessage }
	if code != 200 || json.Unmarshal(body, &page) != nil {
		t.Fatalf("events: %d %s", code, body)
	}
	evs := make([][]byte, len(page.Events))
	for i, ev := range page.Events {
		evs[i] = ev
	}
	if len(evs) != int(ce.LastSeq) || len(evs) < 12 {
		t.Fatalf("%d events after takeover, catalog last seq %d; want every member change", len(evs), ce.LastSeq)
	}
	checkSeqs(t, evs, 1, ce.LastSeq)
}
