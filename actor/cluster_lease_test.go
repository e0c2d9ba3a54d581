package actor

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
)

// fakeOwners is an in-memory OwnerStore: one revision counter for the
// whole register, like a JetStream stream's sequence. fail, when set, makes
// every write fail with its error (a node cut off from NATS). TTLs are not
// enforced: the tests that need an expiry write it themselves.
type fakeOwners struct {
	mu   sync.Mutex
	rev  uint64                 // guarded by mu
	keys map[string]*ajs.Record // guarded by mu
	fail error                  // guarded by mu
}

var _ OwnerStore = (*fakeOwners)(nil)

func newFakeOwners() *fakeOwners { return &fakeOwners{keys: map[string]*ajs.Record{}} }

func (f *fakeOwners) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func (f *fakeOwners) Latest(_ context.Context, key string) (*ajs.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	r := f.keys[key]
	if r == nil {
		return nil, nil
	}
	c := *r
	return &c, nil
}

// writeLocked stores a record at key if cond holds for its current one.
func (f *fakeOwners) writeLocked(key string, val []byte, deleted bool) uint64 {
	f.rev++
	f.keys[key] = &ajs.Record{Key: key, Rev: f.rev, Value: val, Deleted: deleted}
	return f.rev
}

func (f *fakeOwners) Create(_ context.Context, key string, val []byte, _ time.Duration) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return 0, f.fail
	}
	if r := f.keys[key]; r != nil && !r.Deleted {
		return 0, ajs.ErrExists
	}
	return f.writeLocked(key, val, false), nil
}

func (f *fakeOwners) Swap(_ context.Context, key string, val []byte, rev uint64, _ time.Duration) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return 0, f.fail
	}
	var cur uint64
	if r := f.keys[key]; r != nil {
		cur = r.Rev
	}
	if cur != rev {
		return 0, ajs.ErrRevision
	}
	return f.writeLocked(key, val, false), nil
}

func (f *fakeOwners) Delete(_ context.Context, key string, rev uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return 0, f.fail
	}
	r := f.keys[key]
	if r == nil || r.Rev != rev {
		return 0, ajs.ErrRevision
	}
	return f.writeLocked(key, nil, true), nil
}

func (f *fakeOwners) List(_ context.Context, pattern string) ([]*ajs.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	var out []*ajs.Record
	for key, r := range f.keys {
		if !r.Deleted && keyMatches(pattern, key) {
			c := *r
			out = append(out, &c)
		}
	}
	return out, nil
}

// keyMatches reports whether key matches the NATS wildcard pattern (* one
// token, > the rest).
func keyMatches(pattern, key string) bool {
	p, k := strings.Split(pattern, "."), strings.Split(key, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(k) > i
		case i >= len(k):
			return false
		case tok != "*" && tok != k[i]:
			return false
		}
	}
	return len(p) == len(k)
}

func (f *fakeOwners) Watch(ctx context.Context, pattern string) (<-chan *ajs.Record, func(), error) {
	return nil, nil, errors.New("fakeOwners: no watch")
}

// leaseHost is a Host with only what ownership needs: its lease state
// machine runs against owners, without NATS.
func leaseHost(t *testing.T, node string, owners OwnerStore, ttl time.Duration) *Host {
	t.Helper()
	h := &Host{
		cfg:      Config{NodeID: node, LeaseTTL: ttl},
		log:      testLogger(t),
		owners:   owners,
		leases:   map[session.ID]*lease{},
		released: map[session.ID]releasedLease{},
	}
	h.ctx, h.cancel = context.WithCancelCause(context.Background())
	t.Cleanup(func() { h.cancel(errors.New("test over")) })
	h.node = &nodeLease{h: h, key: session.NodeLeaseKey(node)}
	if err := h.node.acquire(t.Context()); err != nil {
		t.Fatalf("acquire node lease of %s: %v", node, err)
	}
	return h
}

// TestLease_FenceIsTheRecordRevision: a session's fence is the revision of
// the write that took its record, the only fence source; a release and a
// later acquire on the same node continue the record with a higher fence,
// and a session the node does not hold has no fence.
func TestLease_FenceIsTheRecordRevision(t *testing.T) {
	owners := newFakeOwners()
	h := leaseHost(t, "a", owners, 3*time.Second)
	const id = session.ID("s_1")
	if _, err := h.leaseFence(id); err == nil {
		t.Fatal("leaseFence of a session not held: nil error")
	}
	l, err := h.acquireLease(t.Context(), id, nil)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	rec, _ := owners.Latest(t.Context(), session.LeaseKey(id))
	if rec == nil || int64(rec.Rev) != l.fence {
		t.Fatalf("record %+v, fence %d: want the fence to be the record's revision", rec, l.fence)
	}
	if f, err := h.leaseFence(id); err != nil || f != l.fence {
		t.Fatalf("leaseFence = %d, %v; want %d", f, err, l.fence)
	}
	if err := h.mayWrite(id); err != nil {
		t.Fatalf("mayWrite while held: %v", err)
	}
	h.markCurrent(id) // what a successful bringUpToDate does
	l.release(t.Context())
	if err := h.mayWrite(id); !errors.Is(err, errLeaseLost) {
		t.Fatalf("mayWrite after release: %v, want errLeaseLost", err)
	}
	if _, err := h.leaseFence(id); err == nil {
		t.Fatal("leaseFence after release: nil error")
	}
	l2, err := h.acquireLease(t.Context(), id, nil)
	if err != nil {
		t.Fatalf("acquire again: %v", err)
	}
	if !l2.continued || l2.fence <= l.fence {
		t.Fatalf("second activation: continued %v fence %d, want continued with a fence above %d", l2.continued, l2.fence, l.fence)
	}
}

// TestLease_TakeOver: a record whose node's lease still names its
// incarnation is held (unavailable, naming the node); once that lease is
// gone, another node takes the record over with a higher fence, and the
// old holder's release no longer touches it.
func TestLease_TakeOver(t *testing.T) {
	owners := newFakeOwners()
	a := leaseHost(t, "a", owners, 3*time.Second)
	b := leaseHost(t, "b", owners, 3*time.Second)
	const id = session.ID("s_1")
	la, err := a.acquireLease(t.Context(), id, nil)
	if err != nil {
		t.Fatalf("a acquires: %v", err)
	}
	_, err = b.acquireLease(t.Context(), id, nil)
	var serr *session.Error
	if !errors.As(err, &serr) || serr.Code != session.CodeUnavailable {
		t.Fatalf("b acquires a held session: %v, want unavailable", err)
	}
	// Node a's lease expires (what the servers' TTL does).
	nl, _ := owners.Latest(t.Context(), session.NodeLeaseKey("a"))
	if _, err := owners.Delete(t.Context(), session.NodeLeaseKey("a"), nl.Rev); err != nil {
		t.Fatal(err)
	}
	lb, err := b.acquireLease(t.Context(), id, nil)
	if err != nil {
		t.Fatalf("b takes over: %v", err)
	}
	if lb.fence <= la.fence {
		t.Fatalf("fences: b %d, a %d; want b's above", lb.fence, la.fence)
	}
	la.release(t.Context())
	rec, _ := owners.Latest(t.Context(), session.LeaseKey(id))
	var got session.Lease
	if rec == nil || rec.Deleted || json.Unmarshal(rec.Value, &got) != nil || got.Node != "b" {
		t.Fatalf("after a's late release the record is %+v, want b's", rec)
	}
}

// TestLease_RenewalFailsSessionsStop: a node that cannot renew its lease
// (cut off from the store) stops every session it holds before the lease
// can expire — a third of the TTL early — and refuses writes from then on;
// once the store answers again it takes a new incarnation, and the old
// records are free to take over.
func TestLease_RenewalFailsSessionsStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		owners := newFakeOwners()
		h := leaseHost(t, "a", owners, ttl)
		oldInc, _, _ := h.node.current()
		var lostAt time.Time
		lost := make(chan struct{})
		l, err := h.acquireLease(t.Context(), "s_1", func() { lostAt = time.Now(); close(lost) })
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { h.node.run(stop) })
		defer func() { close(stop); wg.Wait() }()

		// Renewals succeed for a while.
		time.Sleep(2 * ttl)
		synctest.Wait()
		if err := h.mayWrite("s_1"); err != nil {
			t.Fatalf("after two TTLs of renewals: %v", err)
		}
		cut := time.Now()
		owners.setFail(errors.New("nats: connection closed"))
		<-lost
		if d := lostAt.Sub(cut); d > leaseSafeAge(ttl) {
			t.Errorf("lost %v after the store went away, want at most leaseSafeAge %v", d, leaseSafeAge(ttl))
		}
		if err := l.check(); !errors.Is(err, errLeaseLost) {
			t.Errorf("check after the loss: %v, want errLeaseLost", err)
		}
		if _, err := h.leaseFence("s_1"); err == nil {
			t.Error("leaseFence after the loss: nil error")
		}
		if _, err := h.acquireLease(t.Context(), "s_2", nil); err == nil {
			t.Error("acquire while the node holds no lease: nil error")
		}
		owners.setFail(nil)
		time.Sleep(ttl)
		synctest.Wait()
		inc, _, ok := h.node.current()
		if !ok || inc == oldInc {
			t.Fatalf("after the store came back: incarnation %q (held %v), want a new one", inc, ok)
		}
		// The record of the old incarnation is free: this node takes it
		// back with a new fence.
		l2, err := h.acquireLease(t.Context(), "s_1", nil)
		if err != nil || l2.fence <= l.fence {
			t.Fatalf("re-acquire: fence %v, %v; want one above %d", l2, err, l.fence)
		}
	})
}

// TestLease_OverwrittenLeaseStopsSessions: a renewal whose compare-and-set
// fails (the lease expired and another writer took the key) loses the
// lease at once, without waiting for the safe window.
func TestLease_OverwrittenLeaseStopsSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		owners := newFakeOwners()
		h := leaseHost(t, "a", owners, ttl)
		lost := make(chan struct{})
		if _, err := h.acquireLease(t.Context(), "s_1", func() { close(lost) }); err != nil {
			t.Fatal(err)
		}
		key := session.NodeLeaseKey("a")
		cur, _ := owners.Latest(t.Context(), key)
		if _, err := owners.Swap(t.Context(), key, []byte(`{"node":"a","inc":"someone-else"}`), cur.Rev, ttl); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { h.node.run(stop) })
		defer func() { close(stop); wg.Wait() }()
		start := time.Now()
		<-lost
		if d := time.Since(start); d > ttl/3+time.Millisecond {
			t.Errorf("lost after %v, want at the first renewal (%v)", d, ttl/3)
		}
		if err := h.mayWrite("s_1"); !errors.Is(err, errLeaseLost) {
			t.Errorf("mayWrite: %v, want errLeaseLost", err)
		}
	})
}

// TestLease_Keys: the keys of the register are the ones the other nodes
// and older versions read (session.LeaseKey, session.NodeLeaseKey).
func TestLease_Keys(t *testing.T) {
	owners := newFakeOwners()
	h := leaseHost(t, "a", owners, 3*time.Second)
	if _, err := h.acquireLease(t.Context(), "s_1", nil); err != nil {
		t.Fatal(err)
	}
	owners.mu.Lock()
	defer owners.mu.Unlock()
	for _, want := range []string{session.LeaseKey("s_1"), session.NodeLeaseKey("a")} {
		if _, ok := owners.keys[want]; !ok {
			t.Errorf("no key %s in %v", want, keysOf(owners.keys))
		}
	}
}

func keysOf(m map[string]*ajs.Record) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestLease_ReleaseRemembered: a release is remembered (the next activation
// on this node continues on the fast path, without comparing its file with
// the stream) only when the activation's file was known current and no
// capture of its events failed; otherwise the next activation reconciles.
// An activation that failed before it compared the file (the store full)
// and then released made the next one skip the comparison, and the stream
// kept a gap where the uncaptured tail was (issue 21 item 2).
func TestLease_ReleaseRemembered(t *testing.T) {
	for _, tc := range []struct {
		name       string
		current    bool
		uncaptured bool
		want       bool
	}{
		{"current", true, false, true},
		{"never compared", false, false, false},
		{"capture failed", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := leaseHost(t, "a", newFakeOwners(), 3*time.Second)
			const id = session.ID("s_1")
			l, err := h.acquireLease(t.Context(), id, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.current {
				h.markCurrent(id)
			}
			l.uncaptured.Store(tc.uncaptured)
			l.release(t.Context())
			l2, err := h.acquireLease(t.Context(), id, nil)
			if err != nil {
				t.Fatal(err)
			}
			if l2.continued != tc.want {
				t.Errorf("next activation continued = %v, want %v", l2.continued, tc.want)
			}
		})
	}
}

// lossyOwners is a fakeOwners whose next Create is applied but answered
// with a timeout, as a JetStream reply lost under load.
type lossyOwners struct {
	*fakeOwners
	mu   sync.Mutex
	lose int // guarded by mu: how many Creates to answer so
}

func (l *lossyOwners) Create(ctx context.Context, key string, val []byte, ttl time.Duration) (uint64, error) {
	rev, err := l.fakeOwners.Create(ctx, key, val, ttl)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && l.lose > 0 {
		l.lose--
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

// TestRescue_ClaimSurvivesALostReply: the claim of a node lease's end
// whose create was applied but answered with a timeout is rescued by this
// node when it sees the end again (the next poll): the claim names it. A
// claim another node made is left to that node, and one end is rescued
// once however often it is seen.
func TestRescue_ClaimSurvivesALostReply(t *testing.T) {
	owners := &lossyOwners{fakeOwners: newFakeOwners()}
	h := leaseHost(t, "a", owners, 3*time.Second)
	owners.mu.Lock()
	owners.lose = 1
	owners.mu.Unlock()
	var rescued []string
	h.rescueHook = func(node string) { rescued = append(rescued, node) }
	names := &nodeNames{set: map[string]bool{}}

	h.claimRescue(t.Context(), names, "b", 7)
	if len(rescued) != 0 {
		t.Fatalf("rescued %v after a create answered with a timeout; want a retry later", rescued)
	}
	h.claimRescue(t.Context(), names, "b", 7)
	h.claimRescue(t.Context(), names, "b", 7)
	if len(rescued) != 1 || rescued[0] != "b" {
		t.Fatalf("rescued %v; want node b once, when the end was seen again", rescued)
	}

	// Node c's end is claimed by another node first: not rescued here.
	if _, err := owners.fakeOwners.Create(t.Context(), "rescue.c.9", []byte("other"), 0); err != nil {
		t.Fatal(err)
	}
	h.claimRescue(t.Context(), names, "c", 9)
	if len(rescued) != 1 {
		t.Fatalf("rescued %v; a claim another node made is that node's", rescued)
	}
	// A store that fails: tried again once it answers.
	owners.setFail(errors.New("nats: timeout"))
	h.claimRescue(t.Context(), names, "d", 11)
	owners.setFail(nil)
	h.claimRescue(t.Context(), names, "d", 11)
	if len(rescued) != 2 || rescued[1] != "d" {
		t.Fatalf("rescued %v; want d after the store answered again", rescued)
	}
}
