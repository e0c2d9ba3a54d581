package mount

import (
	"context"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// Reserver is asked before content is written to a volume: Volume.Save asks
// for the bytes it is about to upload, PutContent for the file's size. A
// store that also implements Reserver (Limited does) is asked; an error
// refuses the write, which then stores nothing.
type Reserver interface {
	Reserve(ctx context.Context, prefix string, n int64) error
}

// reserve asks store, if it is a Reserver, for n bytes in the volume at
// prefix.
func reserve(ctx context.Context, store blob.Store, prefix string, n int64) error {
	if r, ok := store.(Reserver); ok && n > 0 {
		return r.Reserve(ctx, prefix, n)
	}
	return nil
}

// Quota limits the bytes the sessions of each tenant store in the object
// store (workspace content, manifests and history checkpoints: everything
// under sessions/<id>/). It learns what is stored from a Collector's pass
// (Measure) and adds what is reserved on this node since; writes that would
// take a tenant beyond Limit fail with an error matching
// session.ErrInsufficientStorage (HTTP 507) that names the quota.
//
// The count is exact after each pass and may lag behind writes made on
// other nodes until the next one, so a tenant can exceed its quota by what
// its sessions on other nodes write between two passes. Until the first
// pass, only what was reserved through q counts.
type Quota struct {
	// Limit is the bytes each tenant may store; 0 means no limit.
	Limit int64
	// TenantOf returns the tenant of a session ("" in a single-tenant
	// install, which has one quota for everything). Required when Limit
	// is set. If it fails, the write is allowed and the failure logged.
	TenantOf func(ctx context.Context, id session.ID) (string, error)
	// Logger; nil means slog.Default().
	Logger *slog.Logger

	mu      sync.Mutex
	used    map[string]int64      // guarded by mu: tenant -> bytes at the last Measure plus reserved since
	tenants map[session.ID]string // guarded by mu: cache of TenantOf
}

// Measure sets what each session stores, from a Collector's pass. Sessions
// whose tenant cannot be found are counted for no tenant and logged.
func (q *Quota) Measure(ctx context.Context, usage map[session.ID]int64) {
	if q.Limit <= 0 || q.TenantOf == nil {
		return
	}
	used := make(map[string]int64)
	tenants := make(map[session.ID]string, len(usage))
	for id, n := range usage {
		t, err := q.tenant(ctx, id)
		if err != nil {
			q.logger().Warn("object-store quota: tenant of a session unknown; not counted", "session", id, "err", err)
			continue
		}
		tenants[id] = t
		used[t] += n
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.used = used
	for id, t := range tenants {
		q.tenants[id] = t
	}
}

// Used returns what tenant stores as far as q knows, and the limit.
func (q *Quota) Used(tenant string) (used, limit int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.used[tenant], q.Limit
}

func (q *Quota) logger() *slog.Logger {
	if q.Logger != nil {
		return q.Logger
	}
	return slog.Default()
}

func (q *Quota) tenant(ctx context.Context, id session.ID) (string, error) {
	q.mu.Lock()
	if q.tenants == nil {
		q.tenants = make(map[session.ID]string)
	}
	t, ok := q.tenants[id]
	q.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := q.TenantOf(ctx, id)
	if err != nil {
		return "", err
	}
	q.mu.Lock()
	q.tenants[id] = t
	q.mu.Unlock()
	return t, nil
}

// Reserve implements Reserver: it refuses n more bytes for the session of
// the volume at prefix when its tenant would go beyond Limit, and counts
// them otherwise.
func (q *Quota) Reserve(ctx context.Context, prefix string, n int64) error {
	if q.Limit <= 0 || q.TenantOf == nil || n <= 0 {
		return nil
	}
	id := sessionOf(prefix)
	t, err := q.tenant(ctx, id)
	if err != nil {
		q.logger().Warn("object-store quota: tenant of the session unknown; write allowed", "session", id, "err", err)
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.used == nil {
		q.used = make(map[string]int64)
	}
	if q.used[t]+n > q.Limit {
		who := "this install"
		if t != "" {
			who = fmt.Sprintf("tenant %q", t)
		}
		return session.Errorf(session.CodeInsufficientStorage,
			"the object-store quota of %s is full: its sessions store %s of %s (storage.tenant_quota_bytes) and this write needs %s more; "+
				"delete files or sessions (space is freed at the next garbage collection) or ask the operator for a larger quota",
			who, Bytes(q.used[t]), Bytes(q.Limit), Bytes(n))
	}
	q.used[t] += n
	return nil
}

// Bytes formats a byte count for people: "2.1 GiB (2254857830 bytes)".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB (%d bytes)", float64(n)/float64(div), "KMGTPE"[exp], n)
}

// Limited is a store whose workspace writes are limited by a Quota: it
// passes everything to Store and implements Reserver with Quota, and
// blob.Presigner when Store does.
type Limited struct {
	Store blob.Store
	Quota *Quota
}

var (
	_ blob.Store     = (*Limited)(nil)
	_ blob.Presigner = (*Limited)(nil)
	_ Reserver       = (*Limited)(nil)
)

// Reserve implements Reserver.
func (l *Limited) Reserve(ctx context.Context, prefix string, n int64) error {
	if l.Quota == nil {
		return nil
	}
	return l.Quota.Reserve(ctx, prefix, n)
}

func (l *Limited) Put(ctx context.Context, key string, r io.Reader, size int64, opts blob.PutOptions) (blob.Info, error) {
	return l.Store.Put(ctx, key, r, size, opts)
}

func (l *Limited) Get(ctx context.Context, key string) (io.ReadCloser, blob.Info, error) {
	return l.Store.Get(ctx, key)
}

func (l *Limited) Stat(ctx context.Context, key string) (blob.Info, error) {
	return l.Store.Stat(ctx, key)
}

func (l *Limited) Delete(ctx context.Context, key string) error { return l.Store.Delete(ctx, key) }

func (l *Limited) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	return l.Store.List(ctx, prefix)
}

// PresignGet implements blob.Presigner when Store does.
func (l *Limited) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	p, ok := l.Store.(blob.Presigner)
	if !ok {
		return "", noPresign(l.Store)
	}
	return p.PresignGet(ctx, key, ttl)
}

// PresignPut implements blob.Presigner when Store does.
func (l *Limited) PresignPut(ctx context.Context, key string, ttl time.Duration) (string, error) {
	p, ok := l.Store.(blob.Presigner)
	if !ok {
		return "", noPresign(l.Store)
	}
	return p.PresignPut(ctx, key, ttl)
}

func noPresign(s blob.Store) error {
	return fmt.Errorf("the workspace cannot reach the object store itself and %T cannot presign URLs: remote sandboxes need an S3 store", s)
}
