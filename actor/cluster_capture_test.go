package actor

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
)

// fakeEvents is an in-memory EventStore whose Capture runs the guard like
// actor/jetstream.Events does, then stores the messages or fails with err.
type fakeEvents struct {
	mu        sync.Mutex
	err       error       // guarded by mu: what Capture fails with after its guard passed
	published []*nats.Msg // guarded by mu
}

var _ EventStore = (*fakeEvents)(nil)

func (f *fakeEvents) Capture(_ context.Context, msgs []*nats.Msg, guard func() error) (uint64, error) {
	if err := guard(); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return 0, f.err
	}
	f.published = append(f.published, msgs...)
	return uint64(len(f.published)), nil
}

func (f *fakeEvents) SameStored(context.Context, uint64, []byte) error { return nil }
func (f *fakeEvents) Last(context.Context, string) (*jetstream.RawStreamMsg, error) {
	return nil, nil
}
func (f *fakeEvents) Replay(context.Context, []string, uint64, uint64, func(ajs.Msg) error) error {
	return nil
}
func (f *fakeEvents) Purge(context.Context, string) error { return nil }

func (f *fakeEvents) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.published)
}

// TestCapture_Guards: captureEvents publishes nothing for a session this
// node does not hold, nor while the store says it is full (the reason
// reaches the caller), and a failed capture marks the session's lease so
// that its release is not remembered as current.
func TestCapture_Guards(t *testing.T) {
	h := leaseHost(t, "a", newFakeOwners(), 3*time.Second)
	ev := &fakeEvents{}
	h.events = ev
	const id = session.ID("s_1")
	evs := []session.Stored{{Seq: 1, JSON: []byte(`{"seq":1}`)}}

	if _, err := h.captureEvents(t.Context(), id, "e", evs, nil); !errors.Is(err, errLeaseLost) || ev.count() != 0 {
		t.Fatalf("capture of a session not held: %v (%d published), want errLeaseLost and nothing published", err, ev.count())
	}
	l, err := h.acquireLease(t.Context(), id, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.markCurrent(id)
	if _, err := h.captureEvents(t.Context(), id, "e", evs, nil); err != nil || ev.count() != 1 {
		t.Fatalf("capture while held: %v (%d published)", err, ev.count())
	}
	if l.uncaptured.Load() {
		t.Fatal("a capture that succeeded marked the lease uncaptured")
	}

	full := errors.Join(ajs.ErrStoreFull, errors.New("the file system of /data/nats has no room"))
	h.cfg.StoreFull = func() error { return full }
	_, err = h.captureEvents(t.Context(), id, "e", evs, nil)
	if !errors.Is(err, ajs.ErrStoreFull) || ev.count() != 1 {
		t.Fatalf("capture on a full store: %v (%d published), want ErrStoreFull and nothing more published", err, ev.count())
	}
	if !l.uncaptured.Load() {
		t.Fatal("a failed capture left the lease unmarked")
	}
	l.release(t.Context())
	// While the store is full no session is taken: its record's write
	// would wait on the same disk.
	if _, err := h.acquireLease(t.Context(), id, nil); !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "out of space") {
		t.Fatalf("acquire on a full store: %v, want unavailable naming the full store", err)
	}
	h.cfg.StoreFull = nil
	if l2, err := h.acquireLease(t.Context(), id, nil); err != nil || l2.continued {
		t.Fatalf("after a failed capture the next activation continued = %v (%v), want a full comparison", l2 != nil && l2.continued, err)
	}

	// A lease lost meanwhile: nothing published.
	h.node.lose("test")
	if _, err := h.captureEvents(t.Context(), id, "e", evs, nil); !errors.Is(err, errLeaseLost) || ev.count() != 1 {
		t.Fatalf("capture after the node lease was lost: %v (%d published), want errLeaseLost", err, ev.count())
	}
}
