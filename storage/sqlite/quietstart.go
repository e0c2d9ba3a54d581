package sqlite

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// quietStartMax bounds the batch a quiet start commits: far below the WAL's
// auto-checkpoint threshold (walAutoCheckpoint pages), so no checkpoint,
// which must sync, can run inside it.
const quietStartMax = 256 << 10

// The first commit after an Open starts the WAL afresh, and with
// SyncNormal SQLite then fsyncs the WAL's header and its directory (see
// the package doc); later commits do no fsync at all. On a busy machine
// those fsyncs are most of a wake: 3–30 ms of a 5–40 ms prompt-to-ack
// (atrium bench --scenarios wake, load 13–20), against 0.2 ms for the
// commit itself. The sync protects a WAL being reused over older frames
// (sqlite.org/src/info/ff5be73dee): new frames written before the new
// header could be read back with the old one after a power loss. A WAL
// that Close truncated to nothing has no older frames, and the database
// file was synced by that checkpoint, so when the WAL is empty at Open the
// first commit runs with synchronous OFF: what a power loss can cost is
// then what SyncNormal already allows (the commits since the last
// checkpoint), and nothing older. With SyncFull, or a WAL that still holds
// frames (an unclean stop), nothing changes.

// walEmpty reports whether the -wal file of the database at path is empty or
// missing.
func walEmpty(path string) bool {
	fi, err := os.Stat(path + "-wal")
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && fi.Size() == 0
}

// beginQuietStart turns synchronous off for the first commit after an Open
// if that is safe (see above) and returns the function that turns it back
// on, nil if it stayed on. l.mu must be held.
func (l *Log) beginQuietStart(ctx context.Context, size int64) (end func() error, err error) {
	if !l.quietStart {
		return nil, nil
	}
	l.quietStart = false
	if size > quietStartMax {
		return nil, nil
	}
	if _, err := l.writer.ExecContext(ctx, `PRAGMA synchronous = OFF`); err != nil {
		return nil, fmt.Errorf("quiet start: %w", err)
	}
	return func() error {
		if _, err := l.writer.ExecContext(context.WithoutCancel(ctx), `PRAGMA synchronous = NORMAL`); err != nil {
			return fmt.Errorf("quiet start: restore synchronous: %w", err)
		}
		return nil
	}, nil
}
