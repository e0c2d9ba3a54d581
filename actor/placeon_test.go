package actor

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// TestHost_PlaceOnNode: a node takes place requests on its own subject
// (Subjects.PlaceOn) besides the queue group, and names itself in the
// catalog entries it writes; once it has closed, nobody answers its subject.
func TestHost_PlaceOnNode(t *testing.T) {
	ns := startJetStream(t)
	prov := newProvider(t)
	nodes := map[string]*clusterNode{
		"a": startNode(t, "a", ns.ClientURL(), prov, nil, withHibernate(200*time.Millisecond)),
		"b": startNode(t, "b", ns.ClientURL(), prov, nil, withHibernate(200*time.Millisecond)),
	}
	e := gatewayEnv(t, ns.ClientURL())
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	if e.kv, err = js.KeyValue(t.Context(), e.subj.CatalogBucket()); err != nil {
		t.Fatal(err)
	}
	hibernated := func(id session.ID) session.CatalogEntry {
		t.Helper()
		var c session.CatalogEntry
		eventually(t, "the session to hibernate", func() bool {
			var ok bool
			c, ok = e.catalog(id)
			if !ok || c.State != session.StateHibernated {
				return false
			}
			for _, n := range nodes {
				if _, held := leaseOf(n.host, id); held {
					return false
				}
			}
			return true
		})
		return c
	}
	activateOn := func(node string, id session.ID) {
		t.Helper()
		resp, err := e.request(e.subj.PlaceOn(node), "alice", session.PlaceRequest{Op: session.PlaceActivate, Session: id}, 20*time.Second)
		if err != nil {
			t.Fatalf("activate %s on node %s: %v", id, node, err)
		}
		var rep session.Reply
		if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.Error != nil {
			t.Fatalf("activate %s on node %s: %s", id, node, resp.Data)
		}
		if _, held := leaseOf(nodes[node].host, id); !held {
			t.Fatalf("node %s activated %s but holds no lease for it", node, id)
		}
	}

	id := e.create("alice", shell())
	home := hibernated(id).Node
	if nodes[home] == nil {
		t.Fatalf("catalog entry names node %q, want a or b", home)
	}
	other := map[string]string{"a": "b", "b": "a"}[home]

	// Each node answers on its own subject, whether or not its disk has
	// the history, and the entry it writes at hibernation names it.
	for _, n := range []string{other, home, other} {
		activateOn(n, id)
		if got := hibernated(id).Node; got != n {
			t.Fatalf("activated on node %s, catalog entry names %q", n, got)
		}
	}

	// A closed node stops taking requests on its own subject too.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := nodes[other].host.Close(ctx); err != nil {
		t.Fatalf("close node %s: %v", other, err)
	}
	_, err = e.request(e.subj.PlaceOn(other), "alice", session.PlaceRequest{Op: session.PlaceActivate, Session: id}, 5*time.Second)
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("place on closed node %s: %v, want no responders", other, err)
	}
	activateOn(home, id)
}
