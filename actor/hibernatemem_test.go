package actor

import (
	"runtime"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/atriumhq/atrium/session"
)

// TestHost_HibernatedActorsCollected hibernates sessions and checks that
// nothing keeps their actors: protoactor keeps the PIDs of stopped children
// in the spare capacity of the manager's child set, and a PID reaches its
// actor (see sessionCell).
func TestHost_HibernatedActorsCollected(t *testing.T) {
	e := newEnv(t, withHibernate(100*time.Millisecond))
	var mu sync.Mutex
	var actors []weak.Pointer[sessionActor]
	e.host.spawned = func(s *sessionActor) {
		mu.Lock()
		defer mu.Unlock()
		actors = append(actors, weak.Make(s))
	}
	for range 5 {
		e.create("alice", command("true"))
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(e.host.Leases()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions did not hibernate", len(e.host.Leases()))
		}
		time.Sleep(20 * time.Millisecond) // hibernation has no notification to wait on
	}
	live := func() int {
		runtime.GC()
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, p := range actors {
			if p.Value() != nil {
				n++
			}
		}
		return n
	}
	for n := live(); n > 0; n = live() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d hibernated session actors are still reachable", n, len(actors))
		}
		time.Sleep(20 * time.Millisecond) // the manager handles Terminated on its own goroutine
	}
	mu.Lock()
	defer mu.Unlock()
	if len(actors) != 5 {
		t.Errorf("%d session actors made, want 5", len(actors))
	}
}

// TestManager_Shrink rebuilds the manager's maps once they hold a quarter
// of their peak, keeping every entry.
func TestManager_Shrink(t *testing.T) {
	m := newManager(nil)
	ids := make([]session.ID, 400)
	for i := range ids {
		ids[i] = session.NewID()
		m.children[ids[i]] = &child{}
		m.byPID[string(ids[i])+"/pid"] = ids[i]
	}
	m.peak = len(ids)
	for i, id := range ids[:299] {
		delete(m.children, id)
		delete(m.byPID, string(id)+"/pid")
		m.shrink()
		if m.peak != len(ids) {
			t.Fatalf("rebuilt at %d children, peak %d", len(ids)-i-1, len(ids))
		}
	}
	delete(m.children, ids[299])
	delete(m.byPID, string(ids[299])+"/pid")
	m.shrink()
	if m.peak != 100 {
		t.Errorf("peak %d after shrinking to 100 children, want 100", m.peak)
	}
	for _, id := range ids[300:] {
		if m.children[id] == nil || m.byPID[string(id)+"/pid"] != id {
			t.Fatalf("%s lost by the rebuild", id)
		}
	}
	if len(m.children) != 100 || len(m.byPID) != 100 {
		t.Errorf("%d children, %d pids after the rebuild, want 100", len(m.children), len(m.byPID))
	}
}
