package sqlite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"modernc.org/sqlite"

	"github.com/atriumhq/atrium/session"
)

// backupInMemoryMax is the size up to which Backup copies a history through
// memory rather than through a temporary file. The copy is held three times
// over while Backup runs (SQLite's in-memory database, its serialization and
// that in Go's heap), and many sessions may hibernate at once.
const backupInMemoryMax = 2 << 20

// Backup writes a consistent copy of the history (a complete SQLite
// database, events and metadata) to w and returns the seq of the last event
// in it. A history of up to 2 MiB, as most are, is copied into memory by
// SQLite's online backup (in one read transaction of the writer connection),
// which creates no file; a larger one is built by SQLite's VACUUM INTO in a
// temporary file beside the history, which is then copied to w and removed.
// Appends wait while the copy is built (a few milliseconds for thousands of
// events), not while it is written to w.
func (l *Log) Backup(ctx context.Context, w io.Writer) (session.Seq, error) {
	b, last, err := l.serialize(ctx)
	if err != nil {
		return 0, err
	}
	if b != nil {
		if _, err := w.Write(b); err != nil {
			return 0, fmt.Errorf("back up history %s: copy: %w", l.id, err)
		}
		return last, nil
	}
	tmp := filepath.Join(filepath.Dir(l.path), "."+string(l.id)+"."+randHex()+".backup")
	defer removeFiles(tmp)
	last, err = l.vacuumInto(ctx, tmp)
	if err != nil {
		return 0, err
	}
	f, err := os.Open(tmp)
	if err != nil {
		return 0, fmt.Errorf("back up history %s: %w", l.id, err)
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		return 0, fmt.Errorf("back up history %s: copy: %w", l.id, err)
	}
	return last, nil
}

// serializer is the part of modernc.org/sqlite's connection that copies a
// database to and from memory.
type serializer interface {
	Serialize() ([]byte, error)
	Deserialize([]byte) error
}

// serialize returns the copy of a history of up to backupInMemoryMax bytes,
// nil for a larger one, with the last seq in it. It holds mu, so no Append
// runs and the last seq is the copy's. The copy is made by SQLite's online
// backup into an in-memory database, which is then serialized: serializing
// the history directly would be one copy less, but sqlite3_serialize turns a
// page it fails to read into zeros instead of failing.
func (l *Log) serialize(ctx context.Context) (b []byte, _ session.Seq, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, 0, fmt.Errorf("back up history %s: closed", l.id)
	}
	conn, err := l.writer.Conn(ctx)
	if err != nil {
		return nil, 0, l.classify(err, "back up", 0)
	}
	defer conn.Close()
	var pages int64
	if err := conn.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return nil, 0, l.classify(err, "back up", 0)
	}
	if pages*pageSize > backupInMemoryMax {
		return nil, 0, nil
	}
	err = conn.Raw(func(dc any) error {
		src, ok := dc.(interface {
			NewBackup(dst string) (*sqlite.Backup, error)
		})
		if !ok {
			return fmt.Errorf("driver connection %T cannot back up", dc)
		}
		bk, err := src.NewBackup(":memory:")
		if err != nil {
			return err
		}
		for more := true; more && err == nil; {
			more, err = bk.Step(-1)
		}
		if err != nil {
			bk.Finish()
			return err
		}
		mem, err := bk.Commit()
		if err != nil {
			return err
		}
		defer mem.Close()
		s, ok := mem.(serializer)
		if !ok {
			return fmt.Errorf("driver connection %T cannot serialize", mem)
		}
		b, err = s.Serialize()
		return err
	})
	if err != nil {
		return nil, 0, l.classify(err, "back up", 0)
	}
	return b, l.lastSeq.Load(), nil
}

// vacuumInto writes the copy to path while holding mu, so no Append runs
// and the last seq is the copy's.
func (l *Log) vacuumInto(ctx context.Context, path string) (session.Seq, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, fmt.Errorf("back up history %s: closed", l.id)
	}
	if _, err := l.writer.ExecContext(ctx, `VACUUM INTO ?`, path); err != nil {
		return 0, l.classify(err, "back up", 0)
	}
	return l.lastSeq.Load(), nil
}

// Restore replaces the history of id (which must be closed, or missing)
// with the database r holds, a copy Backup wrote. The copy is written to a
// temporary file, checked (it opens, and its metadata is id's) and only
// then renamed over the history, with its empty -wal and -shm files, so a
// failed or truncated download leaves the history as it was. The check
// reads the whole copy (PRAGMA quick_check).
func (d *Dir) Restore(ctx context.Context, id session.ID, r io.Reader) (err error) {
	if err := id.Validate(); err != nil {
		return fmt.Errorf("restore history: %w", err)
	}
	if err := os.MkdirAll(d.Path, 0o750); err != nil {
		return fmt.Errorf("restore history %s: make dir: %w", id, err)
	}
	f, err := os.CreateTemp(d.Path, "."+string(id)+".*.restore")
	if err != nil {
		return fmt.Errorf("restore history %s: %w", id, err)
	}
	tmp := f.Name()
	defer removeFiles(tmp) // Only the temporary name: after the rename it is gone.
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("restore history %s: write copy: %w", id, err)
	}
	l, err := d.open(ctx, tmp, id, true) // WAL mode, like every history.
	if err != nil {
		return fmt.Errorf("restore history %s: the copy does not open: %w", id, err)
	}
	var check string
	err = l.writer.QueryRowContext(ctx, `PRAGMA quick_check`).Scan(&check)
	if err == nil && check != "ok" {
		err = fmt.Errorf("the copy is damaged: %s", check)
	}
	var m session.Meta
	if err == nil {
		m, err = l.Meta(ctx)
	}
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("restore history %s: %w", id, err)
	}
	if m.ID != id {
		return fmt.Errorf("restore history %s: the copy is session %q's", id, m.ID)
	}
	// The copy's WAL files replace the history's, so the next Open creates
	// none (see keepWAL). The WAL goes first: the old one must never be
	// read with the new database file. Close left the copy's WAL empty;
	// any other WAL is removed rather than moved.
	wal, statErr := os.Stat(tmp + "-wal")
	move := statErr == nil && wal.Size() == 0
	for _, suffix := range []string{"-wal", "-shm"} {
		from, to := tmp+suffix, d.file(id)+suffix
		err := fs.ErrNotExist
		if move {
			err = os.Rename(from, to)
		}
		if errors.Is(err, fs.ErrNotExist) {
			if err = os.Remove(to); errors.Is(err, fs.ErrNotExist) {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("restore history %s: %w", id, err)
		}
	}
	if err := os.Rename(tmp, d.file(id)); err != nil {
		return fmt.Errorf("restore history %s: %w", id, err)
	}
	if err := syncDir(d.Path); err != nil {
		return fmt.Errorf("restore history %s: %w", id, err)
	}
	return nil
}

func randHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
