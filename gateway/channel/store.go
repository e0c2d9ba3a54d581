package channel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go/jetstream"
)

// Binding is what the service keeps about a session that has somewhere to
// deliver its events: a chat thread, outbound webhooks, or both. It is
// stored in the bindings bucket under "s.<session id>".
type Binding struct {
	Session session.ID `json:"session"`
	// Owner and Tenant are the session's owner, as whom the driver reads
	// the session's history.
	Owner  string `json:"owner"`
	Tenant string `json:"tenant"`
	// Thread is the chat thread the session posts to, if any.
	Thread *Thread `json:"thread,omitempty"`
	// Hooks are the outbound webhooks the session delivers events to.
	Hooks []Subscription `json:"hooks,omitempty"`
	// Cursor is the seq up to which every event has been delivered: the
	// next driver of the session starts after it.
	Cursor session.Seq `json:"cursor"`
	// View is the state of the thread's messages at Cursor, so that a
	// driver taking over edits the same messages.
	View *view `json:"view,omitempty"`
}

// Subscription delivers a session's events of some kinds (all, if Kinds is
// empty) to an outbound webhook target.
type Subscription struct {
	Target string         `json:"target"`
	Kinds  []session.Kind `json:"kinds,omitempty"`
}

// wants reports whether the subscription delivers events of kind k.
func (s Subscription) wants(k session.Kind) bool {
	return len(s.Kinds) == 0 || slices.Contains(s.Kinds, k)
}

// Errors of the stores.
var (
	// errDuplicate: the event was handled already.
	errDuplicate = errors.New("channel: duplicate event")
	// errInProgress: another gateway is handling the event right now.
	errInProgress = errors.New("channel: event being handled")
)

// claimStale is how long a claim on an event may stay "processing" before
// another gateway takes it over (its holder died).
const claimStale = 30 * time.Second

// store keeps the service's state in three NATS KV buckets: bindings
// (durable), dedupe claims (expiring after Config.DedupeTTL) and driver
// leases (expiring after Config.LeaseTTL unless renewed).
type store struct {
	js      jetstream.JetStream
	timeout time.Duration
	now     func() time.Time

	bindings, dedupe, leases bucket
}

// storeFor returns the store of a service configured by cfg, its buckets
// named with prefix and replicated cfg.Replicas times.
func storeFor(js jetstream.JetStream, prefix string, cfg *Config) *store {
	replicas := max(cfg.Replicas, 1)
	return &store{js: js, timeout: cfg.Timeout, now: cfg.Now,
		bindings: bucket{cfg: jetstream.KeyValueConfig{Bucket: prefix + "_channels",
			Description: "Atrium chat threads and webhooks bound to sessions", Replicas: replicas}},
		dedupe: bucket{cfg: jetstream.KeyValueConfig{Bucket: prefix + "_channel_dedupe",
			Description: "Atrium chat platform events already handled", TTL: cfg.DedupeTTL, Replicas: replicas}},
		leases: bucket{cfg: jetstream.KeyValueConfig{Bucket: prefix + "_channel_leases",
			Description: "Atrium gateways driving sessions' chat threads and webhooks", TTL: cfg.LeaseTTL, Replicas: replicas}},
	}
}

// bucket is a KV bucket opened (or created) on first use.
type bucket struct {
	cfg jetstream.KeyValueConfig

	mu sync.Mutex
	kv jetstream.KeyValue // guarded by mu; nil until opened
}

func (s *store) open(ctx context.Context, b *bucket) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	// Not cancelled with ctx: a bucket creation the server has started is
	// waited for, so that closing never races with it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, b.cfg)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", b.cfg.Bucket, err)
	}
	b.kv = kv
	return kv, nil
}

// threadRecord is a thread's entry ("t.<key>"): the session bound to it.
type threadRecord struct {
	Session session.ID `json:"session"`
	Thread  Thread     `json:"thread"`
}

// sessionOf returns the session bound to th, or "".
func (s *store) sessionOf(ctx context.Context, th Thread) (session.ID, error) {
	return s.getID(ctx, "t."+th.key())
}

// latestIn returns the session most recently started in th's channel, or "".
func (s *store) latestIn(ctx context.Context, th Thread) (session.ID, error) {
	return s.getID(ctx, "p."+th.place())
}

func (s *store) getID(ctx context.Context, key string) (session.ID, error) {
	kv, err := s.open(ctx, &s.bindings)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read binding %s: %w", key, err)
	}
	var r threadRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return "", fmt.Errorf("decode binding %s: %w", key, err)
	}
	return r.Session, nil
}

// bindThread binds th to id unless it is bound already, and returns the
// session th is bound to. With replace, th is bound to id whatever it was
// bound to (a command that starts a new session in a chat).
func (s *store) bindThread(ctx context.Context, th Thread, id session.ID, owner, tenant string, replace bool) (session.ID, error) {
	kv, err := s.open(ctx, &s.bindings)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rec, _ := json.Marshal(threadRecord{Session: id, Thread: th})
	key := "t." + th.key()
	if replace {
		_, err = kv.Put(ctx, key, rec)
	} else {
		_, err = kv.Create(ctx, key, rec)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		bound, err := s.getID(ctx, key)
		if err != nil {
			return "", err
		}
		if bound != "" {
			return bound, nil
		}
		return "", fmt.Errorf("bind thread: %s exists but is empty", key)
	}
	if err != nil {
		return "", fmt.Errorf("bind thread: %w", err)
	}
	if _, err := kv.Put(ctx, "p."+th.place(), rec); err != nil {
		return "", fmt.Errorf("bind thread: record latest session of channel: %w", err)
	}
	t := th
	_, err = s.updateBinding(ctx, id, func(b *Binding) {
		b.Thread = &t
		b.Owner, b.Tenant = owner, tenant
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// binding returns id's binding and its revision; nil if it has none.
func (s *store) binding(ctx context.Context, id session.ID) (*Binding, uint64, error) {
	kv, err := s.open(ctx, &s.bindings)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	e, err := kv.Get(ctx, "s."+string(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read binding of %s: %w", id, err)
	}
	var b Binding
	if err := json.Unmarshal(e.Value(), &b); err != nil {
		return nil, 0, fmt.Errorf("decode binding of %s: %w", id, err)
	}
	return &b, e.Revision(), nil
}

// updateBinding applies change to id's binding (a new one if it has none)
// and stores it, retrying when another gateway changed it meanwhile.
func (s *store) updateBinding(ctx context.Context, id session.ID, change func(*Binding)) (*Binding, error) {
	kv, err := s.open(ctx, &s.bindings)
	if err != nil {
		return nil, err
	}
	for range 20 {
		b, rev, err := s.binding(ctx, id)
		if err != nil {
			return nil, err
		}
		if b == nil {
			b = &Binding{Session: id}
		}
		change(b)
		val, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("encode binding of %s: %w", id, err)
		}
		wctx, cancel := context.WithTimeout(ctx, s.timeout)
		if rev == 0 {
			_, err = kv.Create(wctx, "s."+string(id), val)
		} else {
			_, err = kv.Update(wctx, "s."+string(id), val, rev)
		}
		cancel()
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, fmt.Errorf("write binding of %s: %w", id, err)
		}
	}
	return nil, fmt.Errorf("write binding of %s: too many concurrent changes", id)
}

// unbind forgets a deleted session: its binding, and its thread's record
// if the thread is still bound to it.
func (s *store) unbind(ctx context.Context, b *Binding) error {
	kv, err := s.open(ctx, &s.bindings)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if b.Thread != nil {
		key := "t." + b.Thread.key()
		if e, err := kv.Get(ctx, key); err == nil {
			var r threadRecord
			if json.Unmarshal(e.Value(), &r) == nil && r.Session == b.Session {
				_ = kv.Delete(ctx, key, jetstream.LastRevision(e.Revision()))
			}
		}
	}
	if err := kv.Purge(ctx, "s."+string(b.Session)); err != nil {
		return fmt.Errorf("forget binding of %s: %w", b.Session, err)
	}
	return nil
}

// claimRecord is a dedupe entry.
type claimRecord struct {
	Done bool      `json:"done"`
	At   time.Time `json:"at"`
}

// claim is the right to handle one platform event.
type claim struct {
	key string
	rev uint64
}

// claim takes the right to handle the event key: errDuplicate if it was
// handled already, errInProgress if another gateway is handling it. A claim
// whose holder died (still processing after claimStale) is taken over.
func (s *store) claim(ctx context.Context, key string) (claim, error) {
	kv, err := s.open(ctx, &s.dedupe)
	if err != nil {
		return claim{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	val, _ := json.Marshal(claimRecord{At: s.now()})
	rev, err := kv.Create(ctx, key, val)
	if err == nil {
		return claim{key: key, rev: rev}, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return claim{}, fmt.Errorf("claim event: %w", err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return s.claim(ctx, key) // released a moment ago
	}
	if err != nil {
		return claim{}, fmt.Errorf("claim event: %w", err)
	}
	var r claimRecord
	if json.Unmarshal(e.Value(), &r) == nil {
		if r.Done {
			return claim{}, errDuplicate
		}
		if s.now().Sub(r.At) < claimStale {
			return claim{}, errInProgress
		}
	}
	rev, err = kv.Update(ctx, key, val, e.Revision())
	if err != nil {
		return claim{}, errInProgress // someone else took it over first
	}
	return claim{key: key, rev: rev}, nil
}

// done marks a claimed event handled.
func (s *store) done(ctx context.Context, c claim) error {
	kv, err := s.open(ctx, &s.dedupe)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	val, _ := json.Marshal(claimRecord{Done: true, At: s.now()})
	if _, err := kv.Update(ctx, c.key, val, c.rev); err != nil {
		return fmt.Errorf("mark event handled: %w", err)
	}
	return nil
}

// release gives a claim up, so that the platform's next delivery of the
// event is handled.
func (s *store) release(ctx context.Context, c claim) {
	kv, err := s.open(ctx, &s.dedupe)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	_ = kv.Delete(ctx, c.key, jetstream.LastRevision(c.rev))
}

// acquire takes id's driver lease for holder; false if another holds it.
func (s *store) acquire(ctx context.Context, id session.ID, holder string) (uint64, bool, error) {
	kv, err := s.open(ctx, &s.leases)
	if err != nil {
		return 0, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rev, err := kv.Create(ctx, string(id), []byte(holder))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("acquire lease of %s: %w", id, err)
	}
	return rev, true, nil
}

// renew renews a lease held at rev and returns its new revision. An error
// means the lease is lost (expired and perhaps taken) or NATS is
// unreachable: either way the holder must stop.
func (s *store) renew(ctx context.Context, id session.ID, holder string, rev uint64) (uint64, error) {
	kv, err := s.open(ctx, &s.leases)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rev, err = kv.Update(ctx, string(id), []byte(holder), rev)
	if err != nil {
		return 0, fmt.Errorf("renew lease of %s: %w", id, err)
	}
	return rev, nil
}

// releaseLease gives up a lease held at rev.
func (s *store) releaseLease(ctx context.Context, id session.ID, rev uint64) {
	kv, err := s.open(ctx, &s.leases)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	_ = kv.Delete(ctx, string(id), jetstream.LastRevision(rev))
}
