// Package sqlite stores each session's history — its event log and metadata —
// in its own SQLite file (modernc.org/sqlite, WAL mode). Dir owns the
// directory of history files; Log is one open history, written by one session
// actor and read concurrently by many goroutines.
//
// # Costs
//
// Open (waking a hibernated session) opens one SQLite connection, which
// builds the WAL index and parses the schema; Meta, LastSeq and LastOfKind
// run on that connection too, and the pool of read connections that Range
// uses connects only when Range is first called. Open with those reads and a
// Close takes about 0.5 ms on two shared vCPUs (BenchmarkOpen), most of it
// SQLite's own work: opening the files, building the WAL index, parsing the
// schema.
//
// Close checkpoints the WAL into the database file, and SQLite deletes the WAL
// when its last connection closes, so a closed history is its .db file alone.
// The price is paid by the first commit after the next Open: it starts a new
// WAL, whose header SQLite fsyncs, and the directory too, because the WAL file
// is new. That happens even with SyncNormal, whose later commits do no fsync at
// all: the first commit took 0.35–0.4 ms against about 35 µs for later ones
// (BenchmarkWakeAppend's first-append-ns against BenchmarkAppend batch=1).
// Checkpointing differently at Close does not avoid it: PASSIVE, RESTART
// and TRUNCATE all leave the same two fsyncs, and so does an empty WAL file
// kept with SQLITE_FCNTL_PERSIST_WAL. Only a WAL left holding frames would
// avoid them, and the next Open would then read it all back.
//
// modernc.org/sqlite watches a context that can be cancelled (ctx.Done() is
// not nil) with a goroutine per statement, and database/sql adds one per
// query. With such a context a LastOfKind costs about twice as much (23 µs
// against 13 µs) and an Append of one event about 6 µs more. Callers on hot
// paths pass context.Background() or context.WithoutCancel(ctx).
package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/atriumhq/atrium/session"
)

// DefaultMaxBytes is the default size cap of one session's history.
const DefaultMaxBytes int64 = 1 << 30

// Sync modes of Dir.Sync.
const (
	// SyncNormal commits survive a crash of the process (not of the machine).
	SyncNormal = "normal"
	// SyncFull fsyncs every commit; commits survive power loss.
	SyncFull = "full"
)

// Dir is a directory of history files, one <Path>/<id>.db per session. The
// zero value of every field but Path is usable.
type Dir struct {
	// Path is the directory; Create makes it if it is missing.
	Path string
	// Sync is SyncNormal (the default) or SyncFull.
	Sync string
	// MaxBytes caps each history's size; 0 means DefaultMaxBytes. An Append
	// that would pass it fails with an error matching session.ErrUnavailable.
	MaxBytes int64
	// Logger receives lifecycle messages; nil means slog.Default().
	Logger *slog.Logger
}

// Create makes a new history for m.ID holding metadata m and opens it. It
// fails with an error matching session.ErrConflict if the history exists. The
// file is built under a temporary name and linked into place, so a crash
// never leaves a half-made history that Open accepts.
func (d *Dir) Create(ctx context.Context, m session.Meta) (_ *Log, err error) {
	if err := m.ID.Validate(); err != nil {
		return nil, fmt.Errorf("create history: %w", err)
	}
	if d.Exists(m.ID) {
		return nil, fmt.Errorf("create history: %w", session.Errorf(session.CodeConflict, "session %s already exists", m.ID))
	}
	if err := os.MkdirAll(d.Path, 0o750); err != nil {
		return nil, fmt.Errorf("create history %s: make dir: %w", m.ID, err)
	}
	f, err := os.CreateTemp(d.Path, "."+string(m.ID)+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	tmp := f.Name()
	defer removeFiles(tmp) // Cleans up after a failure; the temporary name only.
	empty := d.emptyHistory(ctx)
	if empty != nil {
		_, err = f.Write(empty)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	l, err := d.open(ctx, tmp, m.ID, empty == nil)
	if err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	err = l.SetMeta(ctx, m)
	if cerr := l.Close(); err == nil {
		err = cerr // Close checkpoints, so the whole history is in tmp now.
	}
	if err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	if err := os.Link(tmp, d.file(m.ID)); errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create history: %w", session.Errorf(session.CodeConflict, "session %s already exists", m.ID))
	} else if err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	// SQLite warns about a file with two links, so drop the temporary one now.
	if err := os.Remove(tmp); err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	if err := syncDir(d.Path); err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	return d.Open(ctx, m.ID)
}

// emptyFile is the bytes of a closed history file in WAL mode with the
// current schema and no metadata, built once per process by the first Create
// (see Dir.emptyHistory).
var emptyFile struct {
	mu sync.Mutex             // held while building
	b  atomic.Pointer[[]byte] // nil until built
}

// emptyHistory returns the bytes of an empty history file (WAL mode, schema
// migrated, no metadata), building them in d.Path on first use; nil if that
// failed, and Create then builds the file itself. Copying them saves each
// Create turning a new file into a WAL database and running the migrations,
// which costs a rollback journal, its fsyncs and the schema's parse: about a
// third of a Create. The journal mode, page size and user_version live in
// the file, so the copy is the same database the migrations would make.
func (d *Dir) emptyHistory(ctx context.Context) []byte {
	if b := emptyFile.b.Load(); b != nil {
		return *b
	}
	emptyFile.mu.Lock()
	defer emptyFile.mu.Unlock()
	if b := emptyFile.b.Load(); b != nil {
		return *b
	}
	f, err := os.CreateTemp(d.Path, ".empty.*.tmp")
	if err != nil {
		return nil
	}
	tmp := f.Name()
	defer removeFiles(tmp)
	if err := f.Close(); err != nil {
		return nil
	}
	l, err := d.open(context.WithoutCancel(ctx), tmp, "", true)
	if err != nil {
		return nil
	}
	if err := l.Close(); err != nil { // Close checkpoints: the file is whole.
		return nil
	}
	b, err := os.ReadFile(tmp)
	if err != nil || len(b) == 0 {
		return nil
	}
	emptyFile.b.Store(&b)
	return b
}

// Open opens the history of id and brings its schema up to date. It fails with
// an error matching session.ErrNotFound if there is none.
func (d *Dir) Open(ctx context.Context, id session.ID) (*Log, error) {
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("open history: %w", err)
	}
	if !d.Exists(id) {
		return nil, fmt.Errorf("open history: %w", session.Errorf(session.CodeNotFound, "session %s not found", id))
	}
	l, err := d.open(ctx, d.file(id), id, false)
	if err != nil {
		return nil, fmt.Errorf("open history %s: %w", id, err)
	}
	return l, nil
}

// Remove deletes the history of id, which must be closed, with its WAL files.
// Removing a history that does not exist is not an error.
func (d *Dir) Remove(ctx context.Context, id session.ID) error {
	if err := id.Validate(); err != nil {
		return fmt.Errorf("remove history: %w", err)
	}
	// The WAL goes first: a crash halfway must not leave a stray WAL that a
	// later file of the same name would pick up.
	if err := removeFiles(d.file(id)); err != nil {
		return fmt.Errorf("remove history %s: %w", id, err)
	}
	if err := syncDir(d.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove history %s: %w", id, err)
	}
	return nil
}

// Exists reports whether a history for id exists.
func (d *Dir) Exists(id session.ID) bool {
	if id.Validate() != nil {
		return false
	}
	_, err := os.Stat(d.file(id))
	return err == nil
}

// List returns the ids of all histories in the directory, sorted. A missing
// directory holds none.
func (d *Dir) List() ([]session.ID, error) {
	ents, err := os.ReadDir(d.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("list histories: %w", err)
	}
	var ids []session.ID
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".db")
		if id := session.ID(name); ok && e.Type().IsRegular() && id.Validate() == nil {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (d *Dir) file(id session.ID) string { return filepath.Join(d.Path, string(id)+".db") }

func (d *Dir) logger() *slog.Logger {
	if d.Logger != nil {
		return d.Logger
	}
	return slog.Default()
}

// removeFiles removes a database file's WAL, shared-memory file and then the
// file itself, ignoring those that do not exist.
func removeFiles(db string) error {
	var errs []error
	for _, p := range []string{db + "-wal", db + "-shm", db} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncDir makes a directory's entries (created, linked, removed files) durable.
func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync dir: %w", err)
	}
	return nil
}
