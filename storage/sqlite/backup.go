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

	"github.com/atriumhq/atrium/session"
)

// Backup writes a consistent copy of the history (a complete SQLite
// database, events and metadata) to w and returns the seq of the last event
// in it: SQLite's VACUUM INTO builds the copy in a temporary file beside the
// history, which is then copied to w and removed. Appends wait while the
// copy is built (a few milliseconds for thousands of events), not while it
// is written to w.
func (l *Log) Backup(ctx context.Context, w io.Writer) (session.Seq, error) {
	tmp := filepath.Join(filepath.Dir(l.path), "."+string(l.id)+"."+randHex()+".backup")
	defer removeFiles(tmp)
	last, err := l.vacuumInto(ctx, tmp)
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
// then renamed over the history, so a failed or truncated download leaves
// the history as it was. The check reads the whole copy (PRAGMA
// quick_check).
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
	for _, p := range []string{d.file(id) + "-wal", d.file(id) + "-shm"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
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
