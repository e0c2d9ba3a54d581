// Package quota enforces limits that every gateway shares, with NATS KV as
// the only coordinator: caps on things that run at once (invokes per
// session and per tenant) as slots, and caps on how often something
// happens (turns per hour per tenant) as sliding windows.
//
// A slot is a KV entry, taken with Create (so two gateways can never both
// take the last one) in a bucket whose TTL is Config.SlotTTL. The gateway
// that holds it renews it with Update(rev) every third of the TTL while it
// runs, and deletes it when done; the slots of a gateway that crashed
// expire with the TTL. A window is one entry per name that counts events
// per minute over the last hour, changed with compare-and-set.
//
// Package quota owns its two buckets, "<prefix>_invokes" (slots and the
// entries held with them) and "<prefix>_quota" (windows).
package quota

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	// DefaultSlotTTL is how long a slot outlives the last renewal by its
	// holder: the time a crashed gateway's slots stay taken.
	DefaultSlotTTL = 30 * time.Second
	// DefaultRetryAfter is the wait suggested to a caller refused by a
	// cap on things at once, which cannot know when one ends.
	DefaultRetryAfter = 5 * time.Second
	// DefaultRequestTimeout bounds one request to the KV store.
	DefaultRequestTimeout = 5 * time.Second
)

// Window is the span of a window (Store.Charge): one hour, counted by the
// minute (windowBuckets of windowStep).
const (
	Window        = time.Hour
	windowStep    = time.Minute
	windowBuckets = int64(Window / windowStep)
)

// maxCASRetries bounds the compare-and-set retries of one window charge
// that other gateways keep winning.
const maxCASRetries = 16

// Scopes of a limit, as the refusal names them.
const (
	ScopeSession = "session"
	ScopeTenant  = "tenant"
)

// Config configures a Store. NATS is required.
type Config struct {
	// NATS is the connection to the NATS system with JetStream; the caller
	// owns it.
	NATS *nats.Conn
	// Prefix names the buckets "<Prefix>_invokes" and "<Prefix>_quota";
	// default session.DefaultPrefix.
	Prefix string
	// SlotTTL is the TTL of the slots bucket; default DefaultSlotTTL.
	// Every gateway sharing the bucket must use the same value.
	SlotTTL time.Duration
	// Replicas is the JetStream replicas of the buckets; default 1.
	Replicas int
	// RetryAfter is the wait suggested when a slot cap is reached;
	// default DefaultRetryAfter.
	RetryAfter time.Duration
	// RequestTimeout bounds one KV request; default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Now is the clock of windows; default time.Now.
	Now func() time.Time
	// Logger receives renewal failures; default slog.Default().
	Logger *slog.Logger
}

// Store takes slots and charges windows. Create it with New, run Run in a
// goroutine its owner waits for, and Release every Hold it returns.
type Store struct {
	js         jetstream.JetStream
	prefix     string
	ttl        time.Duration
	replicas   int
	retryAfter time.Duration
	timeout    time.Duration
	now        func() time.Time
	log        *slog.Logger

	mu      sync.Mutex
	slots   jetstream.KeyValue // guarded by mu; nil until first opened
	windows jetstream.KeyValue // guarded by mu; nil until first opened
	holds   map[*Hold]struct{} // guarded by mu: the holds Run renews
}

// New returns a Store. Its buckets are opened, or created, on first use.
func New(cfg Config) (*Store, error) {
	if cfg.NATS == nil {
		return nil, errors.New("quota: config needs a NATS connection")
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("quota: open jetstream: %w", err)
	}
	s := &Store{
		js:         js,
		prefix:     cmp.Or(cfg.Prefix, session.DefaultPrefix),
		ttl:        cmp.Or(cfg.SlotTTL, DefaultSlotTTL),
		replicas:   max(cfg.Replicas, 1),
		retryAfter: cmp.Or(cfg.RetryAfter, DefaultRetryAfter),
		timeout:    cmp.Or(cfg.RequestTimeout, DefaultRequestTimeout),
		now:        cfg.Now,
		log:        cfg.Logger,
		holds:      make(map[*Hold]struct{}),
	}
	if s.ttl < 0 || s.retryAfter < 0 || s.timeout < 0 {
		return nil, errors.New("quota: durations in the config must not be negative")
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s, nil
}

// SlotTTL returns the TTL of slots.
func (s *Store) SlotTTL() time.Duration { return s.ttl }

// bucket opens (or creates) the slots bucket, or the windows bucket.
func (s *Store) bucket(ctx context.Context, windows bool) (jetstream.KeyValue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kv, name, ttl, what := s.slots, s.prefix+"_invokes", s.ttl, "Atrium invoke slots"
	if windows {
		kv, name, ttl, what = s.windows, s.prefix+"_quota", Window, "Atrium quota windows"
	}
	if kv != nil {
		return kv, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: name, Description: what, TTL: ttl, Replicas: s.replicas, History: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", name, err)
	}
	if windows {
		s.windows = kv
	} else {
		s.slots = kv
	}
	return kv, nil
}

// Slot is a cap on things at once: at most Limit holders of the slots
// named What, Scope and Name (e.g. "invokes", ScopeTenant, "acme"). A
// Limit of zero or less means no cap, and takes nothing.
type Slot struct {
	What, Scope, Name string
	Limit             int
}

// key returns the KV key of slot i of sl.
func (sl Slot) key(i int) string {
	return "slot." + keyPart(sl.What) + "." + sl.Scope + "." + keyPart(sl.Name) + "." + strconv.Itoa(i)
}

// keyPart encodes any string as a valid KV key token.
func keyPart(s string) string {
	if s == "" {
		return "_"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

// Acquire takes one slot of each of slots, in order, for a holder
// described by value (kept in the slot entries for operators), or none:
// when one is full it returns an *Exceeded naming it, after giving back the
// ones it took. Release the Hold when done.
func (s *Store) Acquire(ctx context.Context, value []byte, slots ...Slot) (*Hold, error) {
	kv, err := s.bucket(ctx, false)
	if err != nil {
		return nil, unavailable(err)
	}
	h := &Hold{s: s, kv: kv, entries: make(map[string]*held)}
	for _, sl := range slots {
		if sl.Limit <= 0 {
			continue
		}
		ok, err := h.take(ctx, sl, value)
		if err == nil && !ok {
			err = &Exceeded{What: sl.What, Scope: sl.Scope, Limit: sl.Limit, Wait: s.retryAfter}
		}
		if err != nil {
			h.drop(ctx)
			return nil, err
		}
	}
	s.mu.Lock()
	s.holds[h] = struct{}{}
	s.mu.Unlock()
	return h, nil
}

// Lookup returns the value of an entry put with Hold.Put, and false if
// there is none (never put, released, or expired with its holder).
func (s *Store) Lookup(ctx context.Context, key string) ([]byte, bool, error) {
	kv, err := s.bucket(ctx, false)
	if err != nil {
		return nil, false, unavailable(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	e, err := kv.Get(ctx, entryKey(key))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, unavailable(fmt.Errorf("read %s: %w", key, err))
	}
	return e.Value(), true, nil
}

func entryKey(key string) string { return "entry." + keyPart(key) }

// Run renews the slots and entries of every unreleased Hold, every third
// of the slot TTL, until ctx is done.
func (s *Store) Run(ctx context.Context) {
	t := time.NewTicker(s.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		holds := make([]*Hold, 0, len(s.holds))
		for h := range s.holds {
			holds = append(holds, h)
		}
		s.mu.Unlock()
		for _, h := range holds {
			h.renew(ctx)
		}
	}
}

// Hold is what one Acquire took: slots, and the entries Put with them.
// It is safe for concurrent use.
type Hold struct {
	s  *Store
	kv jetstream.KeyValue

	mu       sync.Mutex
	entries  map[string]*held // guarded by mu: by KV key
	released bool             // guarded by mu
}

// held is one KV entry of a hold.
type held struct {
	value []byte
	rev   uint64
}

// take takes a free slot of sl, starting from a random one so that
// holders rarely race for the same key. It reports false if all are taken.
func (h *Hold) take(ctx context.Context, sl Slot, value []byte) (bool, error) {
	start := rand.IntN(sl.Limit)
	for n := range sl.Limit {
		key := sl.key((start + n) % sl.Limit)
		rctx, cancel := context.WithTimeout(ctx, h.s.timeout)
		rev, err := h.kv.Create(rctx, key, value)
		cancel()
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return false, unavailable(fmt.Errorf("take slot %s: %w", key, err))
		}
		h.mu.Lock()
		h.entries[key] = &held{value: value, rev: rev}
		h.mu.Unlock()
		return true, nil
	}
	return false, nil
}

// Put adds an entry under key to the hold, for Store.Lookup from any
// gateway while the hold lasts. It fails with conflict if another hold
// has key.
func (h *Hold) Put(ctx context.Context, key string, value []byte) error {
	k := entryKey(key)
	ctx, cancel := context.WithTimeout(ctx, h.s.timeout)
	defer cancel()
	rev, err := h.kv.Create(ctx, k, value)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return session.Errorf(session.CodeConflict, "%s is taken", key)
	}
	if err != nil {
		return unavailable(fmt.Errorf("put %s: %w", key, err))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released { // Release ran meanwhile: don't leave the entry behind.
		_ = h.kv.Delete(ctx, k, jetstream.LastRevision(rev))
		return session.Errorf(session.CodeConflict, "the hold of %s was released", key)
	}
	h.entries[k] = &held{value: value, rev: rev}
	return nil
}

// renew extends every entry of the hold. An entry that expired (its
// gateway stalled longer than the TTL) is taken again if it is still free,
// and otherwise given up with a warning.
func (h *Hold) renew(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return
	}
	for key, e := range h.entries {
		rctx, cancel := context.WithTimeout(ctx, h.s.timeout)
		rev, err := h.kv.Update(rctx, key, e.value, e.rev)
		if err != nil && ctx.Err() == nil {
			rev, err = h.kv.Create(rctx, key, e.value)
		}
		cancel()
		switch {
		case err == nil:
			e.rev = rev
		case ctx.Err() != nil:
			return
		case errors.Is(err, jetstream.ErrKeyExists):
			h.s.log.Warn("quota entry lost: it expired before it was renewed and was taken again", "key", key)
			delete(h.entries, key)
		default:
			h.s.log.Warn("renew quota entry", "key", key, "err", err)
		}
	}
}

// Release gives back the hold's slots and deletes its entries. It is safe
// to call more than once.
func (h *Hold) Release(ctx context.Context) {
	h.s.mu.Lock()
	delete(h.s.holds, h)
	h.s.mu.Unlock()
	h.drop(ctx)
}

// drop deletes the hold's entries; those it cannot delete expire.
func (h *Hold) drop(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
	for key, e := range h.entries {
		rctx, cancel := context.WithTimeout(ctx, h.s.timeout)
		err := h.kv.Delete(rctx, key, jetstream.LastRevision(e.rev))
		cancel()
		if err != nil {
			h.s.log.Debug("release quota entry: it expires with the slot TTL", "key", key, "err", err)
		}
		delete(h.entries, key)
	}
}

// windowValue is the stored state of a window: counts by minute (Unix
// time divided by windowStep).
type windowValue struct {
	Counts map[int64]int `json:"counts"`
}

// Charge counts one event (e.g. a turn) in the window named What, Scope
// and Name, unless Limit events were already counted in the last hour: then
// it returns an *Exceeded whose Wait is the time until enough of them leave
// the window. A Limit of zero or less means no cap and counts nothing.
//
// Events are counted by the minute: one counts until the end of the hour
// after the start of its minute, so the window is 59 to 60 minutes long.
func (s *Store) Charge(ctx context.Context, what, scope, name string, limit int) error {
	if limit <= 0 {
		return nil
	}
	kv, err := s.bucket(ctx, true)
	if err != nil {
		return unavailable(err)
	}
	key := "window." + keyPart(what) + "." + scope + "." + keyPart(name)
	for range maxCASRetries {
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		err := s.charge(rctx, kv, key, what, scope, limit)
		cancel()
		if !errors.Is(err, errRace) {
			return err
		}
	}
	return session.Errorf(session.CodeUnavailable, "the %s quota is too busy to count this: try again", what)
}

// errRace means another gateway changed a window between read and write.
var errRace = errors.New("quota: window changed meanwhile")

func (s *Store) charge(ctx context.Context, kv jetstream.KeyValue, key, what, scope string, limit int) error {
	var (
		w   windowValue
		rev uint64
	)
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return unavailable(fmt.Errorf("read window %s: %w", key, err))
	default:
		rev = e.Revision()
		if err := json.Unmarshal(e.Value(), &w); err != nil {
			s.log.Warn("reset undecodable quota window", "key", key, "err", err)
			w = windowValue{}
		}
	}
	now := s.now()
	cur := now.UnixNano() / int64(windowStep)
	total := 0
	for m, n := range w.Counts {
		if m <= cur-windowBuckets || n <= 0 {
			delete(w.Counts, m)
			continue
		}
		total += n
	}
	if total >= limit {
		return &Exceeded{What: what, Scope: scope, Limit: limit, Wait: w.freeIn(now, total-limit+1), Window: Window}
	}
	if w.Counts == nil {
		w.Counts = make(map[int64]int)
	}
	w.Counts[cur]++
	b, _ := json.Marshal(w) // a map of ints always encodes.
	if rev == 0 {
		_, err = kv.Create(ctx, key, b)
	} else {
		_, err = kv.Update(ctx, key, b, rev)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), isWrongLastSeq(err):
		return errRace
	case err != nil:
		return unavailable(fmt.Errorf("write window %s: %w", key, err))
	}
	return nil
}

// freeIn returns how long until need of the window's events have left it.
func (w windowValue) freeIn(now time.Time, need int) time.Duration {
	for need > 0 {
		oldest := int64(-1)
		for m := range w.Counts {
			if oldest < 0 || m < oldest {
				oldest = m
			}
		}
		if oldest < 0 {
			break
		}
		need -= w.Counts[oldest]
		delete(w.Counts, oldest)
		if need <= 0 {
			leaves := time.Unix(0, (oldest+windowBuckets)*int64(windowStep))
			return max(leaves.Sub(now), time.Second)
		}
	}
	return Window
}

// isWrongLastSeq reports a failed compare-and-set of Update.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// unavailable reports a KV failure as the wire's unavailable, keeping the
// cause for logs.
func unavailable(err error) error {
	return &kvError{cause: err}
}

type kvError struct{ cause error }

func (e *kvError) Error() string { return "quota store unavailable: " + e.cause.Error() }
func (e *kvError) Unwrap() []error {
	return []error{session.Errorf(session.CodeUnavailable, "the quota store is unavailable: try again shortly"), e.cause}
}

// Exceeded is the refusal of a limit: HTTP 429 too_many_requests with
// Retry-After. It unwraps to a *session.Error of that code, so any wire
// error writer answers it correctly.
type Exceeded struct {
	// What is limited ("invokes", "sandboxes", "turns") and Scope its
	// scope (ScopeSession, ScopeTenant).
	What, Scope string
	// Limit is the limit that was reached.
	Limit int
	// Wait is how long to wait before trying again.
	Wait time.Duration
	// Window is the window of a rate limit; zero for a cap on things at
	// once.
	Window time.Duration
}

func (e *Exceeded) Error() string { return "quota: " + e.Message() }

// Message says what was refused and what to do, for the caller.
func (e *Exceeded) Message() string {
	whose := "this session"
	if e.Scope == ScopeTenant {
		whose = "your tenant"
	}
	if e.Window > 0 {
		return fmt.Sprintf("%s has reached its limit of %d %s per %s: retry in %ds",
			whose, e.Limit, e.What, windowName(e.Window), e.RetryAfterSeconds())
	}
	return fmt.Sprintf("%s has reached its limit of %d %s at once: retry in %ds, or end one of them",
		whose, e.Limit, e.What, e.RetryAfterSeconds())
}

func windowName(d time.Duration) string {
	if d == time.Hour {
		return "hour"
	}
	return d.String()
}

// RetryAfter returns Wait (the gateway's error writer reads it for the
// Retry-After header).
func (e *Exceeded) RetryAfter() time.Duration { return e.Wait }

// RetryAfterSeconds returns Wait in whole seconds, rounded up, at least 1:
// the value of the Retry-After header.
func (e *Exceeded) RetryAfterSeconds() int64 {
	return max(1, int64((e.Wait+time.Second-1)/time.Second))
}

// Unwrap returns the wire error.
func (e *Exceeded) Unwrap() error {
	return &session.Error{Code: session.CodeTooManyRequests, Message: e.Message()}
}
