package actor

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestCatalog_OwnerEntryNotWrittenAfterAPause: a node's owner entry whose
// lease check passed, and which was then held back (the process paused by
// SIGSTOP between the check and the write) while another node took the
// session over and wrote its own entry, does not land over that entry at
// the thaw: the write is a compare-and-set on the revision read before the
// check, and the check asked again after it failed says the lease is gone.
// Before, the check was followed by a plain put, which landed at the thaw,
// and the catalog named the paused node again: a rescue of the new owner
// then found nothing (issue 21, a third freeze in a row).
func TestCatalog_OwnerEntryNotWrittenAfterAPause(t *testing.T) {
	e := newEnv(t)
	c := newCatalogWriter(e.kv, testLogger(t))
	done := make(chan struct{})
	go func() { c.run(); close(done) }()
	t.Cleanup(func() { c.stop(); <-done })
	const id = session.ID("s_paused")

	// Node a owns the session and writes its entry.
	c.putThenOwned(session.CatalogEntry{ID: id, Node: "node-a", State: session.StateActive}, func() error { return nil }, nil)
	c.flush()
	if got := catalogNode(t, e.kv, string(id)); got != "node-a" {
		t.Fatalf("catalog names %q, want node-a", got)
	}

	// Its next write passes the check and is then held back: meanwhile
	// node b takes the session over and writes its entry; once thawed,
	// node a's lease is gone.
	var mu sync.Mutex
	checks := 0
	paused := func() error {
		mu.Lock()
		defer mu.Unlock()
		checks++
		if checks > 1 {
			return errLeaseStale // The thawed node asks again.
		}
		newer, _ := json.Marshal(session.CatalogEntry{ID: id, Node: "node-b", State: session.StateActive})
		if _, err := e.kv.Put(t.Context(), string(id), newer); err != nil {
			t.Errorf("node b's entry: %v", err)
		}
		return nil // The check passed before the pause.
	}
	answered := make(chan struct{})
	c.putThenOwned(session.CatalogEntry{ID: id, Node: "node-a", State: session.StateActive}, paused, func() { close(answered) })
	c.flush()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter of an entry not written was never answered")
	}
	if got := catalogNode(t, e.kv, string(id)); got != "node-b" {
		t.Fatalf("catalog names %q after a paused owner's write landed; want node-b's entry kept", got)
	}

	// An owner whose write races with another write (one that landed
	// after the new owner read the revision: the paused node's) writes
	// its entry on the revision it finds.
	var once sync.Once
	racing := func() error {
		once.Do(func() {
			stale, _ := json.Marshal(session.CatalogEntry{ID: id, Node: "node-a", State: session.StateActive})
			if _, err := e.kv.Put(t.Context(), string(id), stale); err != nil {
				t.Errorf("node a's stale entry: %v", err)
			}
		})
		return nil
	}
	c.putThenOwned(session.CatalogEntry{ID: id, Node: "node-b", State: session.StateActive, Title: "b's"}, racing, nil)
	c.flush()
	if got := catalogNode(t, e.kv, string(id)); got != "node-b" {
		t.Fatalf("catalog names %q after the owner's write raced with a stale one; want node-b", got)
	}

	// The entry a session writes when it hibernates (no check: its record
	// is released) lands if nobody wrote since this node's last owner
	// write, and not over a newer owner's entry.
	const h = session.ID("s_hibernates")
	owner := func() error { return nil }
	c.putThenOwned(session.CatalogEntry{ID: h, Node: "node-a", State: session.StateActive}, owner, nil)
	c.flush()
	c.put(session.CatalogEntry{ID: h, Node: "node-a", State: session.StateHibernated})
	c.flush()
	if got := catalogState(t, e, h); got != session.StateHibernated {
		t.Fatalf("hibernated entry with nobody writing since: state %q, want hibernated", got)
	}
	c.putThenOwned(session.CatalogEntry{ID: h, Node: "node-a", State: session.StateActive}, owner, nil)
	c.flush()
	newer, _ := json.Marshal(session.CatalogEntry{ID: h, Node: "node-b", State: session.StateActive})
	if _, err := e.kv.Put(t.Context(), string(h), newer); err != nil {
		t.Fatal(err)
	}
	c.put(session.CatalogEntry{ID: h, Node: "node-a", State: session.StateHibernated})
	c.flush()
	if got, state := catalogNode(t, e.kv, string(h)), catalogState(t, e, h); got != "node-b" || state != session.StateActive {
		t.Fatalf("catalog names %q (%s) after a late hibernation entry; want node-b's active entry kept", got, state)
	}
}

func catalogState(t testing.TB, e *env, id session.ID) session.State {
	t.Helper()
	ent, err := e.kv.Get(t.Context(), string(id))
	if err != nil {
		t.Fatalf("catalog entry %s: %v", id, err)
	}
	var c session.CatalogEntry
	if err := json.Unmarshal(ent.Value(), &c); err != nil {
		t.Fatal(err)
	}
	return c.State
}
