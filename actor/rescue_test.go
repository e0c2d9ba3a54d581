package actor

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// TestCluster_RescueDespiteStaleCatalog: node a holds a busy session and
// dies; the catalog entry names node b, the node that held the session
// before a (a catalog write b made just before a pause, sent at its thaw
// over a's entry: issue 21, the third freeze in a row). Node b still takes
// the session over when a's lease ends: the rescue finds what a held in the
// ownership records, which are written with compare-and-set only. Before,
// the rescue read only the catalog, found no session of node a and did
// nothing, and the session waited until node a ran again.
func TestCluster_RescueDespiteStaleCatalog(t *testing.T) {
	ns := startJetStream(t)
	prov := newProvider(t)
	a := startNode(t, "a", ns.ClientURL(), prov, nil)
	e := gatewayEnv(t, ns.ClientURL())
	id := e.create("alice", shell())
	for _, text := range []string{"sleep 30", "echo rescued"} {
		if rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: text}); rep.Error != nil {
			t.Fatalf("prompt %q: %v", text, rep.Error)
		}
	}
	b := startNode(t, "b", ns.ClientURL(), prov, nil)
	if _, ok := leaseOf(a.host, id); !ok {
		t.Fatalf("node a does not hold %s", id)
	}
	a.host.catalog.flush()

	a.nc.Close() // Node a dies: no renewal, no release, no catalog write.
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	rewriteCatalogEntry(t, js, id, func(c *session.CatalogEntry) {
		if c.Node != "a" || c.State != session.StateActive {
			t.Fatalf("catalog entry before the stale write: node %q, state %q; want active on a", c.Node, c.State)
		}
		c.Node = "b" // The stale write of the node that held it before.
	})

	// No command is sent: only the rescue can bring the session to node b.
	eventually(t, "node b to take the session over although the catalog names b", func() bool {
		_, ok := leaseOf(b.host, id)
		return ok
	})
	fin, evs := waitTurn(t, e, id, 2)
	if fin.Status != session.TurnOK {
		t.Errorf("queued turn 2 finished %+v", fin)
	}
	if got := outputText(t, evs, 2, "stdout"); got != "rescued\n" {
		t.Errorf("turn 2 stdout %q", got)
	}
	checkContiguous(t, evs)
}

// TestCluster_ResumeDespiteStaleCatalog: node a holds a busy session and
// dies while no other node runs; its catalog entry says hibernated (the
// late write of a node paused between its release and that write). Node b,
// started once a's lease is gone, resumes the session from its ownership
// record, which names a's dead incarnation: nobody else would (b never saw
// a's lease end, and no command is sent).
func TestCluster_ResumeDespiteStaleCatalog(t *testing.T) {
	ns := startJetStream(t)
	prov := newProvider(t)
	a := startNode(t, "a", ns.ClientURL(), prov, nil)
	e := gatewayEnv(t, ns.ClientURL())
	id := e.create("alice", shell())
	for _, text := range []string{"sleep 30", "echo resumed"} {
		if rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: text}); rep.Error != nil {
			t.Fatalf("prompt %q: %v", text, rep.Error)
		}
	}
	a.host.catalog.flush()
	a.nc.Close() // Node a dies.

	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	rewriteCatalogEntry(t, js, id, func(c *session.CatalogEntry) {
		c.State = session.StateHibernated // The stale write.
	})
	owners, err := js.KeyValue(t.Context(), session.Subjects{}.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "node a's lease to end", func() bool {
		_, err := owners.Get(t.Context(), session.NodeLeaseKey("a"))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})

	b := startNode(t, "b", ns.ClientURL(), prov, nil)
	eventually(t, "node b to resume the session its record says a dead node held", func() bool {
		_, ok := leaseOf(b.host, id)
		return ok
	})
	fin, evs := waitTurn(t, e, id, 2)
	if fin.Status != session.TurnOK {
		t.Errorf("queued turn 2 finished %+v", fin)
	}
	if got := outputText(t, evs, 2, "stdout"); got != "resumed\n" {
		t.Errorf("turn 2 stdout %q", got)
	}
	checkContiguous(t, evs)
}

// rewriteCatalogEntry reads session id's catalog entry, lets change edit
// it, and puts it back unconditionally, as a late write would.
func rewriteCatalogEntry(t *testing.T, js jetstream.JetStream, id session.ID, change func(*session.CatalogEntry)) {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), session.Subjects{}.CatalogBucket())
	if err != nil {
		t.Fatal(err)
	}
	ent, err := kv.Get(t.Context(), string(id))
	if err != nil {
		t.Fatalf("catalog entry of %s: %v", id, err)
	}
	var c session.CatalogEntry
	if err := json.Unmarshal(ent.Value(), &c); err != nil {
		t.Fatal(err)
	}
	change(&c)
	stale, _ := json.Marshal(c)
	if _, err := kv.Put(t.Context(), string(id), stale); err != nil {
		t.Fatal(err)
	}
}
