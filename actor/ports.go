package actor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// History is one session's durable event log and metadata. The session actor
// is its only writer. storage/sqlite.Log implements it.
type History interface {
	// Append commits evs (consecutive seqs following LastSeq) in one
	// transaction; they are durable when it returns nil.
	Append(ctx context.Context, evs []session.Stored) error
	// Range returns the encoded events with seq > after in order, at most
	// limit of them and, past the first, no more than maxBytes in total;
	// more reports whether events beyond the last returned exist.
	Range(ctx context.Context, after session.Seq, limit, maxBytes int) (evs []json.RawMessage, more bool, err error)
	// LastSeq returns the seq of the last committed event, 0 if none.
	LastSeq(ctx context.Context) (session.Seq, error)
	// LastOfKind returns the newest event of kind, or nil if there is none.
	LastOfKind(ctx context.Context, kind session.Kind) (json.RawMessage, error)
	// PromptSeq returns the seq of the newest message event by user with
	// client_id clientID, or 0 if there is none. It is one indexed lookup.
	PromptSeq(ctx context.Context, user, clientID string) (session.Seq, error)
	// Meta and SetMeta read and replace the session's metadata.
	Meta(ctx context.Context) (session.Meta, error)
	SetMeta(ctx context.Context, m session.Meta) error
	// Close checkpoints the WAL and closes the file. Safe to call twice.
	Close() error
}

// Histories opens, creates and removes the history files of sessions.
// storage/sqlite.Dir implements it.
type Histories interface {
	// Create makes a new history for m.ID with metadata m; it fails with an
	// error matching session.ErrConflict if one exists.
	Create(ctx context.Context, m session.Meta) (History, error)
	// Open opens an existing history; session.ErrNotFound if there is none.
	Open(ctx context.Context, id session.ID) (History, error)
	// Remove deletes a closed history and its files.
	Remove(ctx context.Context, id session.ID) error
}

// Provider provisions sandboxes. compute/local.Provider implements it.
type Provider = compute.Provider

// historyStore is a history store whose methods return a concrete History
// type, such as *sqlite.Dir returning *sqlite.Log.
type historyStore[L History] interface {
	Create(ctx context.Context, m session.Meta) (L, error)
	Open(ctx context.Context, id session.ID) (L, error)
	Remove(ctx context.Context, id session.ID) error
}

// HistoriesOf adapts a store whose methods return a concrete History type
// (such as *sqlite.Dir) to Histories. A failed Create or Open returns a nil
// History, never a non-nil interface holding a nil pointer.
func HistoriesOf[L History](s historyStore[L]) Histories { return historiesAdapter[L]{s} }

type historiesAdapter[L History] struct{ s historyStore[L] }

func (h historiesAdapter[L]) Create(ctx context.Context, m session.Meta) (History, error) {
	l, err := h.s.Create(ctx, m)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (h historiesAdapter[L]) Open(ctx context.Context, id session.ID) (History, error) {
	l, err := h.s.Open(ctx, id)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (h historiesAdapter[L]) Remove(ctx context.Context, id session.ID) error {
	return h.s.Remove(ctx, id)
}

// Restore replaces id's history with a checkpoint copy, if the store can.
func (h historiesAdapter[L]) Restore(ctx context.Context, id session.ID, r io.Reader) error {
	rs, ok := h.s.(restorer)
	if !ok {
		return fmt.Errorf("restore history %s: this history store cannot restore checkpoints", id)
	}
	return rs.Restore(ctx, id, r)
}
