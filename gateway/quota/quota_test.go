package quota_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/quota"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTimeout bounds every wait in these tests.
const waitTimeout = 20 * time.Second

func startNATS(t testing.TB) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(waitTimeout) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

// newStore returns a Store on its own connection to ns, as one gateway
// would have.
func newStore(t testing.TB, ns *server.Server, cfg quota.Config) *quota.Store {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(nc.Close)
	cfg.NATS = nc
	s, err := quota.New(cfg)
	if err != nil {
		t.Fatalf("quota store: %v", err)
	}
	return s
}

// run runs s.Run until the test ends.
func run(t testing.TB, s *quota.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

func exceeded(t testing.TB, err error) *quota.Exceeded {
	t.Helper()
	var e *quota.Exceeded
	if !errors.As(err, &e) {
		t.Fatalf("want *quota.Exceeded, got %v", err)
	}
	if !errors.Is(err, session.ErrTooManyRequests) {
		t.Errorf("%v does not match session.ErrTooManyRequests", err)
	}
	return e
}

func TestStore_SlotsAcrossGateways(t *testing.T) {
	ns := startNATS(t)
	a, b := newStore(t, ns, quota.Config{}), newStore(t, ns, quota.Config{})
	ctx := context.Background()
	sess := func(id string) quota.Slot {
		return quota.Slot{What: "invokes", Scope: quota.ScopeSession, Name: id, Limit: 2}
	}
	tenant := quota.Slot{What: "invokes", Scope: quota.ScopeTenant, Name: "acme corp/ü", Limit: 3}

	h1, err := a.Acquire(ctx, nil, sess("s1"), tenant)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := b.Acquire(ctx, nil, sess("s1"), tenant)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Acquire(ctx, nil, sess("s1"), tenant)
	if e := exceeded(t, err); e.Scope != quota.ScopeSession || e.Limit != 2 || e.Wait != quota.DefaultRetryAfter {
		t.Fatalf("third invoke of s1: %+v", e)
	}
	h3, err := b.Acquire(ctx, nil, sess("s2"), tenant)
	if err != nil {
		t.Fatal(err)
	}
	// The tenant is full: s3's session slot is given back, not kept.
	_, err = a.Acquire(ctx, nil, sess("s3"), tenant)
	if e := exceeded(t, err); e.Scope != quota.ScopeTenant || e.Limit != 3 {
		t.Fatalf("fourth invoke of the tenant: %+v", e)
	}
	h1.Release(ctx)
	h1.Release(ctx) // twice is fine
	h4, err := a.Acquire(ctx, nil, sess("s3"), tenant)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	for _, h := range []*quota.Hold{h2, h3, h4} {
		h.Release(ctx)
	}
	// No cap takes nothing.
	if _, err := a.Acquire(ctx, nil, quota.Slot{What: "invokes", Scope: quota.ScopeTenant, Name: "x", Limit: 0}); err != nil {
		t.Fatal(err)
	}
}

// Gateways racing for the last slots never take more than the limit.
func TestStore_SlotsRace(t *testing.T) {
	ns := startNATS(t)
	stores := []*quota.Store{newStore(t, ns, quota.Config{}), newStore(t, ns, quota.Config{}), newStore(t, ns, quota.Config{})}
	slot := quota.Slot{What: "invokes", Scope: quota.ScopeTenant, Name: "t", Limit: 3}
	var (
		wg  sync.WaitGroup
		won atomic.Int32
	)
	for i := range 12 {
		wg.Go(func() {
			_, err := stores[i%len(stores)].Acquire(context.Background(), nil, slot)
			switch {
			case err == nil:
				won.Add(1)
			default:
				exceeded(t, err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 3 {
		t.Fatalf("%d holders took the 3 slots", won.Load())
	}
}

// A crashed gateway's slots (never renewed, never released) expire with the
// TTL; a running gateway's are renewed and stay, and so do its entries.
func TestStore_CrashedHolderExpires(t *testing.T) {
	ns := startNATS(t)
	const ttl = 3 * time.Second // renewed every second: a holder would have to stall for 2s to lose it
	crashed := newStore(t, ns, quota.Config{SlotTTL: ttl})
	alive := newStore(t, ns, quota.Config{SlotTTL: ttl})
	run(t, alive)
	other := newStore(t, ns, quota.Config{SlotTTL: ttl})
	ctx := context.Background()
	slot := func(name string) quota.Slot {
		return quota.Slot{What: "invokes", Scope: quota.ScopeTenant, Name: name, Limit: 1}
	}
	if _, err := crashed.Acquire(ctx, nil, slot("a")); err != nil {
		t.Fatal(err)
	}
	kept, err := alive.Acquire(ctx, nil, slot("b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kept.Put(ctx, "inv_1", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := kept.Put(ctx, "inv_1", nil); !errors.Is(err, session.ErrConflict) {
		t.Fatalf("second put of a key: %v", err)
	}
	start := time.Now()
	deadline := start.Add(waitTimeout)
	for {
		h, err := other.Acquire(ctx, nil, slot("a"))
		if err == nil {
			h.Release(ctx)
			break
		}
		exceeded(t, err)
		if time.Now().After(deadline) {
			t.Fatal("the crashed holder's slot never expired")
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	if time.Since(start) < ttl/2 {
		t.Errorf("the slot expired after %s, well before its TTL of %s", time.Since(start), ttl)
	}
	// By now more than the TTL has passed since "b" was taken: only
	// renewal kept it.
	for time.Since(start) < ttl+ttl/2 {
		time.Sleep(50 * time.Millisecond) // let the TTL pass once more
	}
	if _, err := other.Acquire(ctx, nil, slot("b")); err == nil {
		t.Fatal("a renewed slot was taken by another gateway")
	} else {
		exceeded(t, err)
	}
	if v, ok, err := other.Lookup(ctx, "inv_1"); err != nil || !ok || string(v) != `{"x":1}` {
		t.Fatalf("lookup of a renewed entry = %s, %v, %v", v, ok, err)
	}
	kept.Release(ctx)
	if _, ok, err := other.Lookup(ctx, "inv_1"); err != nil || ok {
		t.Fatalf("lookup after release = %v, %v", ok, err)
	}
	if h, err := other.Acquire(ctx, nil, slot("b")); err != nil {
		t.Fatalf("slot after release: %v", err)
	} else {
		h.Release(ctx)
	}
}

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func TestStore_ChargeWindow(t *testing.T) {
	ns := startNATS(t)
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	c := &clock{t: t0}
	a := newStore(t, ns, quota.Config{Now: c.now})
	b := newStore(t, ns, quota.Config{Now: c.now})
	ctx := context.Background()
	charge := func(s *quota.Store, at time.Duration) error {
		c.set(t0.Add(at))
		return s.Charge(ctx, "turns", quota.ScopeTenant, "acme", 3)
	}
	for i, at := range []time.Duration{0, 10*time.Minute + 30*time.Second, 20 * time.Minute} {
		if err := charge([]*quota.Store{a, b}[i%2], at); err != nil {
			t.Fatalf("turn %d: %v", i+1, err)
		}
	}
	e := exceeded(t, charge(b, 30*time.Minute))
	if e.Scope != quota.ScopeTenant || e.Limit != 3 || e.Wait != 30*time.Minute || e.Window != time.Hour {
		t.Fatalf("fourth turn: %+v", e)
	}
	if e.RetryAfterSeconds() != 1800 {
		t.Fatalf("Retry-After %d, want 1800", e.RetryAfterSeconds())
	}
	// Another tenant has its own window.
	if err := a.Charge(ctx, "turns", quota.ScopeTenant, "other", 3); err != nil {
		t.Fatal(err)
	}
	// A refused turn counts nothing: an hour after the first, one is free.
	if err := charge(a, time.Hour); err != nil {
		t.Fatalf("an hour later: %v", err)
	}
	// The second turn (10:10:30) counts by its minute: it leaves the
	// window an hour after 10:10, at 11:10.
	e = exceeded(t, charge(a, time.Hour+5*time.Minute))
	if e.Wait != 5*time.Minute {
		t.Fatalf("wait %s, want 5m", e.Wait)
	}
	// No limit counts nothing.
	if err := a.Charge(ctx, "turns", quota.ScopeTenant, "acme", 0); err != nil {
		t.Fatal(err)
	}
}

// Gateways charging one window at once never count more than the limit.
func TestStore_ChargeRace(t *testing.T) {
	ns := startNATS(t)
	a, b := newStore(t, ns, quota.Config{}), newStore(t, ns, quota.Config{})
	var (
		wg sync.WaitGroup
		ok atomic.Int32
	)
	for i := range 10 {
		wg.Go(func() {
			err := []*quota.Store{a, b}[i%2].Charge(context.Background(), "turns", quota.ScopeTenant, "t", 4)
			if err == nil {
				ok.Add(1)
			} else if !errors.As(err, new(*quota.Exceeded)) {
				t.Errorf("charge: %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 4 {
		t.Fatalf("%d turns counted against a limit of 4", ok.Load())
	}
}
