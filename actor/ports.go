package actor

import (
	"context"
	"encoding/json"

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
