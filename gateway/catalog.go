package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
	"github.com/nats-io/nats.go/jetstream"
)

// Delays before the catalog watcher restarts after it failed: the first,
// doubling up to the last.
const (
	catalogRetryMin = 100 * time.Millisecond
	catalogRetryMax = 10 * time.Second
)

// catalogCache is this gateway's copy of the session catalog, kept by a
// watcher of the KV bucket (watchCatalog), so that authorizing a request
// and listing sessions cost no round trip. It lags the bucket by the
// watcher's delivery, and the bucket lags the nodes: the node remains the
// authority on roles (see access). A session it does not hold is read from
// the bucket, so one that was just created is found as soon as its node has
// written it, and a session this gateway deleted is gone at once.
type catalogCache struct {
	mu      sync.RWMutex
	ready   bool                      // guarded by mu: entries holds the whole bucket
	entries map[session.ID]cachedItem // guarded by mu
}

// cachedItem is a catalog entry and its KV revision. A nil entry is a
// session this gateway deleted whose deletion the watcher has not yet
// delivered; it is never found again (session IDs are never reused).
type cachedItem struct {
	entry *session.CatalogEntry // read-only once cached
	rev   uint64
}

// lookup returns id's entry (nil if the session does not exist) and whether
// the cache knows; if not, the bucket must be asked.
func (c *catalogCache) lookup(id session.ID) (*session.CatalogEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	it, ok := c.entries[id]
	if !ok || !c.ready && it.entry != nil {
		return nil, false
	}
	return it.entry, true
}

// put stores entry at rev unless the cache has a newer revision.
func (c *catalogCache) put(entry *session.CatalogEntry, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if it, ok := c.entries[entry.ID]; ok && it.rev >= rev {
		return
	}
	if c.entries == nil {
		c.entries = make(map[session.ID]cachedItem)
	}
	c.entries[entry.ID] = cachedItem{entry: entry, rev: rev}
}

// remove drops id's entry, deleted from the bucket at rev.
func (c *catalogCache) remove(id session.ID, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if it, ok := c.entries[id]; ok && it.entry != nil && it.rev > rev {
		return
	}
	delete(c.entries, id)
}

// forget marks id deleted by this gateway.
func (c *catalogCache) forget(id session.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = make(map[session.ID]cachedItem)
	}
	c.entries[id] = cachedItem{rev: math.MaxUint64}
}

// reset forgets the entries (not the deletions) and waits for a new watcher
// to deliver the whole bucket again.
func (c *catalogCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ready = false
	maps := c.entries
	c.entries = make(map[session.ID]cachedItem)
	for id, it := range maps {
		if it.entry == nil {
			c.entries[id] = it
		}
	}
}

func (c *catalogCache) setReady() {
	c.mu.Lock()
	c.ready = true
	c.mu.Unlock()
}

// list returns the entries p has a role on and whether the cache is ready.
func (c *catalogCache) list(p session.Principal) ([]session.CatalogEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.ready {
		return nil, false
	}
	var out []session.CatalogEntry
	for _, it := range c.entries {
		if it.entry != nil && roleIn(it.entry, p).Valid() {
			out = append(out, *it.entry)
		}
	}
	return out, true
}

// watchCatalog keeps s.cache until the server closes, restarting its watcher
// when it fails. Until a watcher has delivered the whole bucket, requests
// read the bucket directly.
func (s *Server) watchCatalog() {
	s.keepWatching(catalogRetryMin, catalogRetryMax, s.followCatalog, s.cache.reset,
		"catalog watcher stopped: reading the catalog directly until it restarts")
}

// keepWatching runs follow until the server closes: whenever it returns,
// stopped runs and, after a pause, follow again. The pause doubles from min
// to max while follow keeps failing before it got going (ok false), and is
// back to min once it did. The first failure in a row is logged at warn as
// msg, the next ones at debug.
func (s *Server) keepWatching(minDelay, maxDelay time.Duration, follow func() (ok bool, err error), stopped func(), msg string) {
	policy := retry.Policy{Min: minDelay, Max: maxDelay}
	for failures := 1; ; failures++ {
		ok, err := follow()
		stopped()
		if s.ctx.Err() != nil {
			return
		}
		if ok {
			failures = 1
		}
		delay := policy.Delay(failures)
		level := slog.LevelWarn // once, then quieter until it has worked again
		if failures > 1 {
			level = slog.LevelDebug
		}
		s.log.Log(s.ctx, level, msg, "retry_in", delay, "err", err)
		t := time.NewTimer(delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// followCatalog runs one watcher of the catalog bucket: every current entry,
// then every change, until the watcher fails or the server closes. It
// reports whether the cache became ready.
func (s *Server) followCatalog() (ready bool, err error) {
	kv, err := s.catalog(s.ctx)
	if err != nil {
		return false, err
	}
	w, err := kv.WatchAll(s.ctx)
	if err != nil {
		return false, fmt.Errorf("watch catalog: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-s.ctx.Done():
			return ready, nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return ready, errors.New("catalog watcher ended")
			case e == nil: // every current entry has been delivered.
				s.cache.setReady()
				ready = true
			case e.Operation() == jetstream.KeyValuePut:
				var entry session.CatalogEntry
				if err := json.Unmarshal(e.Value(), &entry); err != nil {
					s.log.Warn("skip undecodable catalog entry", "key", e.Key(), "err", err)
					continue
				}
				entry.ID = session.ID(e.Key())
				s.cache.put(&entry, e.Revision())
			default: // deleted or purged
				s.cache.remove(session.ID(e.Key()), e.Revision())
			}
		}
	}
}

// catalog returns the session catalog bucket, opening it (or creating it
// empty, if no node has yet) on first use.
func (s *Server) catalog(ctx context.Context) (jetstream.KeyValue, error) {
	s.kvMu.Lock()
	defer s.kvMu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	bucket := s.subj.CatalogBucket()
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		// As the nodes make it (actor.openCatalog): the nodes update a
		// bucket whose configuration differs, but not its replica count
		// once it holds data, so it must be right from the start.
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Description: "Atrium session catalog",
			Replicas: s.replicas, Storage: jetstream.FileStorage})
	}
	if err != nil {
		return nil, fmt.Errorf("open catalog %s: %w", bucket, err)
	}
	s.kv = kv
	return kv, nil
}

// catalogGet returns id's catalog entry, or nil if there is none: from the
// cache, else from the bucket. The entry is shared: read it only.
func (s *Server) catalogGet(ctx context.Context, id session.ID) (*session.CatalogEntry, error) {
	if entry, ok := s.cache.lookup(id); ok {
		return entry, nil
	}
	kv, err := s.catalog(ctx)
	if err != nil {
		return nil, catalogError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	e, err := kv.Get(ctx, string(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, catalogError(fmt.Errorf("read catalog entry %s: %w", id, err))
	}
	var entry session.CatalogEntry
	if err := json.Unmarshal(e.Value(), &entry); err != nil {
		return nil, fmt.Errorf("decode catalog entry %s: %w", id, err)
	}
	return &entry, nil
}

// refreshCatalog reads id's entry from the bucket into the cache, so that
// the caller's next request sees what its last one changed as soon as the
// node has written it. Best effort: the watcher delivers it anyway.
func (s *Server) refreshCatalog(ctx context.Context, id session.ID) {
	kv, err := s.catalog(ctx)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	e, err := kv.Get(ctx, string(id))
	if err != nil {
		return
	}
	var entry session.CatalogEntry
	if json.Unmarshal(e.Value(), &entry) == nil {
		entry.ID = id
		s.cache.put(&entry, e.Revision())
	}
}

// catalogList returns the catalog entries p has a role on, newest first:
// from the cache, else from the bucket with one watcher, which delivers
// every current value and then a nil marker.
func (s *Server) catalogList(ctx context.Context, p session.Principal) ([]session.CatalogEntry, error) {
	if out, ok := s.cache.list(p); ok {
		sortNewestFirst(out)
		return out, nil
	}
	kv, err := s.catalog(ctx)
	if err != nil {
		return nil, catalogError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, catalogError(fmt.Errorf("watch catalog: %w", err))
	}
	defer func() { _ = w.Stop() }()
	var out []session.CatalogEntry
	for {
		select {
		case <-ctx.Done():
			return nil, catalogError(fmt.Errorf("read catalog: %w", ctx.Err()))
		case e, ok := <-w.Updates():
			if !ok {
				return nil, catalogError(errors.New("read catalog: watcher stopped"))
			}
			if e == nil {
				sortNewestFirst(out)
				return out, nil
			}
			var entry session.CatalogEntry
			if err := json.Unmarshal(e.Value(), &entry); err != nil {
				s.log.Warn("skip undecodable catalog entry", "key", e.Key(), "err", err)
				continue
			}
			if cached, ok := s.cache.lookup(entry.ID); ok && cached == nil {
				continue // deleted by this gateway a moment ago
			}
			if roleIn(&entry, p).Valid() {
				out = append(out, entry)
			}
		}
	}
}

func sortNewestFirst(es []session.CatalogEntry) {
	slices.SortFunc(es, func(a, b session.CatalogEntry) int {
		if c := b.CreatedAt.Compare(a.CreatedAt.Time); c != 0 {
			return c
		}
		return strings.Compare(string(b.ID), string(a.ID))
	})
}
