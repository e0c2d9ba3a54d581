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
// Close takes about 0.75 ms on two shared vCPUs (BenchmarkOpen), most of it
// SQLite's own work: opening the files, building the WAL index, parsing the
// schema. With 64 wakes at once over 2,000 histories in one directory
// (BenchmarkOpenParallel) each costs about 0.85 ms of CPU.
//
// Close checkpoints the WAL into the database file and truncates it, so a
// closed history's database file alone holds all of it; the empty -wal and
// the -shm file are kept (SQLITE_FCNTL_PERSIST_WAL), so waking and closing a
// history creates and deletes no file. Creating and deleting them on every
// wake cost 1.4 to 3.4 ms of CPU per wake in BenchmarkOpenParallel: on ext4
// without a journal, the inode allocator scans recently deleted inodes on
// every create, and the directory's lock serializes concurrent wakes.
// Dir.Remove deletes all three files. A history whose WAL files are missing
// (closed by an older atrium) opens as well and gets them again.
//
// The first commit after an Open starts the WAL afresh, and SQLite fsyncs
// its header and the directory. That happens even with SyncNormal, whose
// later commits do no fsync at all: the first commit took 0.35–0.4 ms on a
// quiet machine, 2.3–4.3 ms at load 20, against about 35 µs for later ones
// (BenchmarkWakeAppend's first-append-ns against BenchmarkAppend batch=1).
// When Close left the WAL empty, that first commit runs with synchronous
// OFF (quietstart.go explains why this loses nothing SyncNormal keeps):
// 0.17–0.25 ms at load 20.
//
// modernc.org/sqlite watches a context that can be cancelled (ctx.Done() is
// not nil) with a goroutine per statement, and database/sql adds one per
// query. With such a context a LastOfKind costs about twice as much (23 µs
// against 13 µs) and an Append of one event about 6 µs more. Callers on hot
// paths pass context.Background() or context.WithoutCancel(ctx).
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

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
// fails with an error matching session.ErrConflict if the history exists.
// The file is built in memory, written to an unnamed file (O_TMPFILE), synced
// and only then linked under its name, so a crash never leaves a half-made
// history that Open accepts, and no temporary name is created and removed.
// (Where O_TMPFILE is not supported a temporary name is used instead.)
func (d *Dir) Create(ctx context.Context, m session.Meta) (_ *Log, err error) {
	if err := m.ID.Validate(); err != nil {
		return nil, fmt.Errorf("create history: %w", err)
	}
	if _, err := d.syncMode(); err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	if d.Exists(m.ID) {
		return nil, fmt.Errorf("create history: %w", session.Errorf(session.CodeConflict, "session %s already exists", m.ID))
	}
	if err := os.MkdirAll(d.Path, 0o750); err != nil {
		return nil, fmt.Errorf("create history %s: make dir: %w", m.ID, err)
	}
	b, err := newHistory(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	if err := writeNew(d.Path, d.file(m.ID), b); errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create history: %w", session.Errorf(session.CodeConflict, "session %s already exists", m.ID))
	} else if err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	if err := syncDir(d.Path); err != nil {
		return nil, fmt.Errorf("create history %s: %w", m.ID, err)
	}
	return d.Open(ctx, m.ID)
}

// emptyFile is the bytes of a history with the current schema and no
// metadata, in rollback-journal mode, built in memory once per process by
// the first Create (see newHistory).
var emptyFile struct {
	mu sync.Mutex             // held while building
	b  atomic.Pointer[[]byte] // nil until built
}

// newHistory returns the bytes of a closed history file in WAL mode with the
// current schema, metadata m and no events. It builds them in an in-memory
// database, which cannot be in WAL mode, from a copy of an empty history
// (migrated once per process), and then marks them as WAL mode: bytes 18 and
// 19 of the header, the file format's write and read versions, are 2 for WAL
// and 1 for a rollback journal, and the journal mode is nothing else. A file
// built this way is the database that Open, the migrations and SetMeta on a
// new file would make, without a file and its journals being created,
// synced and deleted.
func newHistory(ctx context.Context, m session.Meta) ([]byte, error) {
	meta, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := emptyHistory(ctx, conn); err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('session', ?)`, meta); err != nil {
		return nil, fmt.Errorf("set metadata: %w", err)
	}
	var b []byte
	err = conn.Raw(func(dc any) error {
		s, ok := dc.(serializer)
		if !ok {
			return fmt.Errorf("driver connection %T cannot serialize", dc)
		}
		b, err = s.Serialize()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("serialize: %w", err)
	}
	if len(b) < 100 {
		return nil, fmt.Errorf("serialize: %d bytes, shorter than a database header", len(b))
	}
	b[18], b[19] = 2, 2 // WAL mode.
	return b, nil
}

// emptyHistory makes the in-memory database of conn an empty history: a
// copy of emptyFile, or, the first time, the migrations run afresh and then
// kept in emptyFile.
func emptyHistory(ctx context.Context, conn *sql.Conn) error {
	deserialize := func(b []byte) error {
		return conn.Raw(func(dc any) error {
			s, ok := dc.(serializer)
			if !ok {
				return fmt.Errorf("driver connection %T cannot deserialize", dc)
			}
			return s.Deserialize(b) // Copies b.
		})
	}
	if b := emptyFile.b.Load(); b != nil {
		return deserialize(*b)
	}
	emptyFile.mu.Lock()
	defer emptyFile.mu.Unlock()
	if b := emptyFile.b.Load(); b != nil {
		return deserialize(*b)
	}
	for v, m := range migrations {
		if _, err := conn.ExecContext(ctx, m); err != nil {
			return fmt.Errorf("migrate to schema version %d: %w", v+1, err)
		}
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, len(migrations))); err != nil {
		return fmt.Errorf("set schema version: %w", err)
	}
	var b []byte
	err := conn.Raw(func(dc any) (err error) {
		s, ok := dc.(serializer)
		if !ok {
			return fmt.Errorf("driver connection %T cannot serialize", dc)
		}
		b, err = s.Serialize()
		return err
	})
	if err != nil {
		return fmt.Errorf("serialize empty history: %w", err)
	}
	emptyFile.b.Store(&b)
	return nil
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

// writeNew makes path, in dir, a new file holding b, synced; it fails with
// an error matching fs.ErrExist if path exists. The file gets its name only
// once it is whole: it is written unnamed (O_TMPFILE) and linked into place
// through /proc/self/fd, or, where either is not available, written under a
// temporary name that is then linked into place and removed.
func writeNew(dir, path string, b []byte) error {
	f, err := os.OpenFile(dir, os.O_RDWR|unix.O_TMPFILE, 0o600)
	if err != nil {
		return writeNewNamed(dir, path, b)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrExist):
		return &fs.PathError{Op: "link", Path: path, Err: err}
	default: // No /proc, or a filesystem that cannot link an unnamed file.
		return writeNewNamed(dir, path, b)
	}
}

// writeNewNamed is writeNew with a temporary name.
func writeNewNamed(dir, path string, b []byte) (err error) {
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // After the link, or after a failure.
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Link(tmp, path)
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
