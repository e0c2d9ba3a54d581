package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// storageGC runs the node's object-store garbage collection and keeps the
// per-tenant quota's count: one pass soon after start-up, then one every
// Storage.GCInterval (with jitter, so the nodes of a cluster spread out).
// Every node runs it; passes are safe to run at once (mount.Collector).
type storageGC struct {
	collector *mount.Collector
	quota     *mount.Quota // nil without a tenant quota
	interval  time.Duration
	log       *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startStorageGC starts collecting store's garbage; quota, if set, is
// measured by every pass.
func startStorageGC(cfg Storage, store blob.Store, quota *mount.Quota, log *slog.Logger) *storageGC {
	g := &storageGC{
		collector: &mount.Collector{Blob: store, Grace: cfg.GCGrace, KeepHistory: cfg.WorkspaceHistory, Logger: log,
			// The session's workspace and its agent's home (actor/agenthome.go).
			Volumes: []string{"workspace", "agent-home"}},
		quota:    quota,
		interval: cmpDur(cfg.GCInterval, DefaultGCInterval),
		log:      log,
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	g.wg.Go(func() { g.run(ctx) })
	return g
}

// DefaultGCInterval is how often a node collects object-store garbage when
// Storage.GCInterval is 0.
const DefaultGCInterval = time.Hour

func cmpDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (g *storageGC) run(ctx context.Context) {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.pass(ctx)
		// ±10% jitter.
		t.Reset(g.interval + time.Duration((rand.Float64()-0.5)*0.2*float64(g.interval)))
	}
}

// pass runs one collection; a failure is logged and retried at the next.
func (g *storageGC) pass(ctx context.Context) {
	st, err := g.collector.Collect(ctx)
	if err != nil {
		if ctx.Err() == nil {
			g.log.Warn("object-store garbage collection failed; the next pass retries", "err", err)
		}
		return
	}
	if g.quota != nil {
		g.quota.Measure(ctx, st.Usage)
	}
}

// stop cancels a pass in progress and waits for it. Safe to call twice.
func (g *storageGC) stop() {
	if g == nil {
		return
	}
	g.cancel()
	g.wg.Wait()
}

// catalogTenant returns a function giving a session's tenant from the
// session catalog.
func catalogTenant(nc *nats.Conn) func(ctx context.Context, id session.ID) (string, error) {
	return func(ctx context.Context, id session.ID) (string, error) {
		js, err := jetstream.New(nc)
		if err != nil {
			return "", fmt.Errorf("jetstream: %w", err)
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, session.Subjects{}.CatalogBucket())
		if err != nil {
			return "", fmt.Errorf("open the session catalog: %w", err)
		}
		e, err := kv.Get(ctx, string(id))
		if err != nil {
			return "", fmt.Errorf("catalog entry of %s: %w", id, err)
		}
		var ce session.CatalogEntry
		if err := json.Unmarshal(e.Value(), &ce); err != nil {
			return "", fmt.Errorf("catalog entry of %s: %w", id, err)
		}
		return ce.Tenant, nil
	}
}

// limitStore returns the store the node writes workspaces through: store
// itself, or with a tenant quota (and that quota).
func limitStore(cfg Storage, store blob.Store, nc *nats.Conn, log *slog.Logger) (blob.Store, *mount.Quota) {
	if cfg.TenantQuotaBytes <= 0 {
		return store, nil
	}
	q := &mount.Quota{Limit: cfg.TenantQuotaBytes, TenantOf: catalogTenant(nc), Logger: log}
	return &mount.Limited{Store: store, Quota: q}, q
}
