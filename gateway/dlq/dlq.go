// Package dlq keeps the dead letters of background runs (tasks, scheduled runs) in NATS KV
// bucket <prefix>_dlq, and retries transient failures with exponential backoff and jitter.
//
// A background run that fails for a reason worth retrying (Transient) is
// retried in place with a Backoff; one that fails for good, or runs out of
// attempts, is Put here with the reason, so that nothing is silently lost.
// A person then retries it by hand (Retry, which calls the handler its kind
// registered with Handle) or drops it (Delete).
package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultBucket is the bucket of dead letters with the default prefix.
const DefaultBucket = session.DefaultPrefix + "_dlq"

// MaxReasonBytes bounds Entry.Reason; a longer reason is cut.
const MaxReasonBytes = 2048

// Entry is one dead letter: a background run that failed for good (the
// DeadLetter of GET /v1/dlq). Put assigns its ID ("dl_…").
type Entry = api.DeadLetter

// Config configures a Queue. JetStream is required.
type Config struct {
	// JetStream is the JetStream context of the gateway's NATS connection.
	JetStream jetstream.JetStream
	// Bucket is the KV bucket of the entries; default DefaultBucket.
	Bucket string
	// Replicas is the number of replicas of the bucket; default 1.
	Replicas int
	// Logger receives the queue's logs; default slog.Default().
	Logger *slog.Logger
}

// Queue is the list of dead letters. Create it with Open; it holds no
// goroutines and needs no closing.
type Queue struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu       sync.Mutex
	handlers map[string]func(ctx context.Context, e Entry) error // guarded by mu
}

// Open opens (or creates) the bucket of dead letters.
func Open(ctx context.Context, cfg Config) (*Queue, error) {
	if cfg.JetStream == nil {
		return nil, errors.New("dlq: config needs JetStream")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	kv, err := cfg.JetStream.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cmp.Or(cfg.Bucket, DefaultBucket),
		Description: "Atrium dead letters: background runs that failed for good",
		Replicas:    max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("dlq: open bucket %s: %w", cmp.Or(cfg.Bucket, DefaultBucket), err)
	}
	return &Queue{kv: kv, log: cfg.Logger, handlers: make(map[string]func(context.Context, Entry) error)}, nil
}

// newID returns a fresh entry id such as "dl_3kq7xq4m2fdh2dnbw5ad".
func newID() string {
	return "dl_" + strings.TrimPrefix(string(session.NewID()), "s_")
}

// validID reports whether id can be an entry's id (and so a KV key).
func validID(id string) bool {
	return strings.HasPrefix(id, "dl_") && session.ID(id).Validate() == nil
}

// Put stores e as a new dead letter and returns it as stored: with a fresh
// ID, FailedAt set to now if it was zero, and Reason cut to MaxReasonBytes.
func (q *Queue) Put(ctx context.Context, e Entry) (Entry, error) {
	if e.Kind == "" {
		return Entry{}, errors.New("dlq: put: entry has no kind")
	}
	e.ID = newID()
	if e.FailedAt.IsZero() {
		e.FailedAt = time.Now()
	}
	e.FailedAt = e.FailedAt.UTC()
	e.Reason = cut(e.Reason)
	b, err := json.Marshal(e)
	if err != nil {
		return Entry{}, fmt.Errorf("dlq: encode entry: %w", err)
	}
	if _, err := q.kv.Create(ctx, e.ID, b); err != nil {
		return Entry{}, fmt.Errorf("dlq: store entry %s: %w", e.ID, err)
	}
	q.log.Info("dead letter", "id", e.ID, "kind", e.Kind, "ref", e.Ref, "user", e.User,
		"permanent", e.Permanent, "attempts", e.Attempts)
	return e, nil
}

// Get returns entry id; an unknown id gives an error wrapping
// session.ErrNotFound.
func (q *Queue) Get(ctx context.Context, id string) (Entry, error) {
	e, _, err := q.get(ctx, id)
	return e, err
}

func (q *Queue) get(ctx context.Context, id string) (Entry, uint64, error) {
	if !validID(id) {
		return Entry{}, 0, session.Errorf(session.CodeNotFound, "there is no dead letter %q: list them with `atrium dlq ls`", id)
	}
	kve, err := q.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Entry{}, 0, session.Errorf(session.CodeNotFound, "there is no dead letter %s: list them with `atrium dlq ls`", id)
	}
	if err != nil {
		return Entry{}, 0, fmt.Errorf("dlq: read entry %s: %w", id, err)
	}
	var e Entry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return Entry{}, 0, fmt.Errorf("dlq: decode entry %s: %w", id, err)
	}
	return e, kve.Revision(), nil
}

// List returns the entries of tenant, newest first.
func (q *Queue) List(ctx context.Context, tenant string) ([]Entry, error) {
	keys, err := q.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("dlq: list entries: %w", err)
	}
	var out []Entry
	for k := range keys.Keys() {
		e, _, err := q.get(ctx, k)
		if errors.Is(err, session.ErrNotFound) {
			continue // deleted since it was listed
		}
		if err != nil {
			_ = keys.Stop()
			return nil, err
		}
		if e.Tenant == tenant {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := b.FailedAt.Compare(a.FailedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out, nil
}

// Delete drops entry id; an unknown id gives an error wrapping
// session.ErrNotFound.
func (q *Queue) Delete(ctx context.Context, id string) error {
	_, rev, err := q.get(ctx, id)
	if err != nil {
		return err
	}
	return q.deleteAt(ctx, id, rev)
}

func (q *Queue) deleteAt(ctx context.Context, id string, rev uint64) error {
	err := q.kv.Delete(ctx, id, jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return session.Errorf(session.CodeConflict, "dead letter %s changed meanwhile: list it again", id)
	}
	if err != nil {
		return fmt.Errorf("dlq: delete entry %s: %w", id, err)
	}
	return nil
}

// Handle registers how entries of kind are retried by hand (`atrium dlq retry ID`): Retry calls it
// and deletes the entry when it returns nil; on error the entry stays with the new reason.
func (q *Queue) Handle(kind string, retry func(ctx context.Context, e Entry) error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.handlers[kind] = retry
}

// handler returns the retry handler registered for kind, or nil.
func (q *Queue) handler(kind string) func(context.Context, Entry) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.handlers[kind]
}

// CanRetry reports whether entries of kind have a retry handler here.
func (q *Queue) CanRetry(kind string) bool { return q.handler(kind) != nil }

// Retry runs entry id again with the handler of its kind. On success the
// entry is deleted; on failure it stays, with the new reason, one more
// attempt, Permanent set from the error, and FailedAt now; the error is
// returned. An entry whose kind has no handler gives an unavailable error.
func (q *Queue) Retry(ctx context.Context, id string) error {
	e, _, err := q.get(ctx, id)
	if err != nil {
		return err
	}
	retry := q.handler(e.Kind)
	if retry == nil {
		return session.Errorf(session.CodeUnavailable, "dead letters of kind %q cannot be retried by this server: drop it with `atrium dlq drop %s`", e.Kind, id)
	}
	runErr := retry(ctx, e)
	// The entry is read again: it may have changed (or been dropped) while
	// the run went on, and a drop wins.
	cur, rev, err := q.get(context.WithoutCancel(ctx), id)
	if errors.Is(err, session.ErrNotFound) {
		return runErr
	}
	if err != nil {
		return errors.Join(runErr, err)
	}
	if runErr == nil {
		if err := q.deleteAt(context.WithoutCancel(ctx), id, rev); err != nil {
			return fmt.Errorf("dlq: retried %s, but: %w", id, err)
		}
		q.log.Info("dead letter retried", "id", id, "kind", e.Kind, "ref", e.Ref)
		return nil
	}
	cur.Reason = cut(runErr.Error())
	cur.Permanent = !IsTransient(runErr)
	cur.Attempts++
	cur.FailedAt = time.Now().UTC()
	b, err := json.Marshal(cur)
	if err != nil {
		return errors.Join(runErr, fmt.Errorf("dlq: encode entry: %w", err))
	}
	if _, err := q.kv.Update(context.WithoutCancel(ctx), id, b, rev); err != nil {
		return errors.Join(runErr, fmt.Errorf("dlq: update entry %s: %w", id, err))
	}
	return runErr
}

// cut shortens a reason to MaxReasonBytes, on a rune boundary.
func cut(s string) string {
	if len(s) <= MaxReasonBytes {
		return s
	}
	return strings.ToValidUTF8(s[:MaxReasonBytes-len("…")], "") + "…"
}
