package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// TestGateway_PlaceRetriesWhileLeaseHeld: a node answers a place request
// unavailable while another node still holds the session's ownership lease
// (it is handing the session over, or died and the lease has yet to
// expire). The gateway waits and places again instead of failing the
// command.
func TestGateway_PlaceRetriesWhileLeaseHeld(t *testing.T) {
	ns := startNATS(t)
	nc := connectNATS(t, ns)
	subj := session.Subjects{}
	id := catalogHibernated(t, nc, subj)

	// The node: the first two activations find the lease held elsewhere.
	var mu sync.Mutex
	refused := 0
	var cmd *nats.Subscription
	reply := func(m *nats.Msg, r session.Reply) {
		data, _ := json.Marshal(r)
		m.Respond(data)
	}
	place, err := nc.QueueSubscribe(subj.Place(), subj.PlaceQueue(), func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if refused < 2 {
			refused++
			reply(m, session.Reply{Error: session.Errorf(session.CodeUnavailable, "session %s is owned by node %q; retry", id, "z")})
			return
		}
		if cmd == nil {
			cmd, _ = nc.Subscribe(subj.Cmd(id), func(m *nats.Msg) { reply(m, session.Reply{Seq: 2}) })
			nc.Flush()
		}
		reply(m, session.Reply{})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		place.Unsubscribe()
		mu.Lock()
		if cmd != nil {
			cmd.Unsubscribe()
		}
		mu.Unlock()
	})
	nc.Flush()

	_, srv, _ := startGateway(t, ns)
	start := time.Now()
	code, body := callURL(t, srv.URL, "POST", "/v1/sessions/"+string(id)+"/messages", "alice", `{"text":"hi"}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("prompt while the session's lease was held: %d %s", code, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if refused != 2 {
		t.Errorf("the node refused %d activations, want 2", refused)
	}
	t.Logf("served after %v", time.Since(start))
}

// catalogHibernated writes the catalog entry of a new hibernated session
// owned by alice, with no node behind it, and returns its id.
func catalogHibernated(t *testing.T, nc *nats.Conn, subj session.Subjects) session.ID {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subj.CatalogBucket()})
	if err != nil {
		t.Fatal(err)
	}
	id := session.NewID()
	entry := session.CatalogEntry{ID: id, Title: "t", Owner: "alice", Members: session.Members{"alice": session.RoleOwner},
		Epoch: "e1", State: session.StateHibernated, LastSeq: 1}
	b, _ := json.Marshal(entry)
	if _, err := kv.Put(ctx, string(id), b); err != nil {
		t.Fatal(err)
	}
	return id
}
