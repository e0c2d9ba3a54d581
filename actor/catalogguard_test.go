package actor

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// TestCatalog_OwnerEntryNotWrittenOnceLost: an owner's catalog entry that
// is still pending when the node may have lost the session (its lease
// check fails at write time: a pause, SIGSTOP, with the entry queued) is
// not written, so it cannot overwrite the entry of the node that took the
// session over; its waiter is still answered. Entries written without the
// check, and with a check that passes, are written.
func TestCatalog_OwnerEntryNotWrittenOnceLost(t *testing.T) {
	e := newEnv(t)
	c := newCatalogWriter(e.kv, testLogger(t))
	done := make(chan struct{})
	go func() { c.run(); close(done) }()
	t.Cleanup(func() { c.stop(); <-done })

	newer := session.CatalogEntry{ID: "s_taken", Node: "node-b", State: session.StateActive}
	c.put(newer)
	c.flush()
	lost := errors.New("the node lease was not renewed within its safe window")
	answered := make(chan struct{})
	c.putThenOwned(session.CatalogEntry{ID: "s_taken", Node: "node-a", State: session.StateActive},
		func() error { return lost }, func() { close(answered) })
	c.flush()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter of an entry not written was never answered")
	}
	if got := catalogNode(t, e.kv, "s_taken"); got != "node-b" {
		t.Fatalf("catalog names %q after a lost owner's pending write; want node-b's entry kept", got)
	}

	c.putThenOwned(session.CatalogEntry{ID: "s_taken", Node: "node-a", State: session.StateActive},
		func() error { return nil }, nil)
	c.flush()
	if got := catalogNode(t, e.kv, "s_taken"); got != "node-a" {
		t.Fatalf("catalog names %q after an owner's write whose check passed; want node-a", got)
	}
	// A later entry without a check replaces a pending checked one, and
	// its check with it.
	c.mu.Lock()
	c.pending["s_taken"] = &session.CatalogEntry{ID: "s_taken", Node: "x"}
	c.setGuardLocked("s_taken", func() error { return lost })
	c.mu.Unlock()
	c.put(session.CatalogEntry{ID: "s_taken", Node: "node-c", State: session.StateHibernated})
	c.flush()
	if got := catalogNode(t, e.kv, "s_taken"); got != "node-c" {
		t.Fatalf("catalog names %q; want node-c (written without a check)", got)
	}
}

func catalogNode(t testing.TB, kv jetstream.KeyValue, id string) string {
	t.Helper()
	ent, err := kv.Get(t.Context(), id)
	if err != nil {
		t.Fatalf("catalog entry %s: %v", id, err)
	}
	var c session.CatalogEntry
	if err := json.Unmarshal(ent.Value(), &c); err != nil {
		t.Fatal(err)
	}
	return c.Node
}
