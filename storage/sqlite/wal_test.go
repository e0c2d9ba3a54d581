package sqlite_test

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// fileState is a directory entry's inode number and size.
type fileState struct{ ino, size int64 }

// dirState returns the entries of dir by name.
func dirState(tb testing.TB, dir string) map[string]fileState {
	tb.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	out := make(map[string]fileState)
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			tb.Fatal(err)
		}
		out[e.Name()] = fileState{int64(fi.Sys().(*syscall.Stat_t).Ino), fi.Size()}
	}
	return out
}

// TestLog_WakeCreatesNoFiles opens, appends to and closes a history again
// and again: after the first Close the directory's entries, their inodes and
// the empty WAL stay the same, and every cycle's events are kept.
func TestLog_WakeCreatesNoFiles(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 10, 300)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	before := dirState(t, d.Path)
	if want := []string{"s_a.db", "s_a.db-shm", "s_a.db-wal"}; !slices.Equal(slices.Sorted(maps.Keys(before)), want) {
		t.Fatalf("closed history is %v, want %v", before, want)
	}
	if before["s_a.db-wal"].size != 0 {
		t.Errorf("WAL after Close holds %d bytes, want 0", before["s_a.db-wal"].size)
	}
	changes := watchDir(t, d.Path)
	next := session.Seq(11)
	for cycle := range 5 {
		l, err := d.Open(ctx, "s_a")
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, l, batch(next, 20, 300)...)
		next += 20
		if _, _, err := l.Range(ctx, 0, 5, 0); err != nil { // Connects a reader too.
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		after := dirState(t, d.Path)
		for _, name := range []string{"s_a.db-shm", "s_a.db-wal"} {
			if after[name] != before[name] {
				t.Errorf("cycle %d: %s is %+v, was %+v", cycle, name, after[name], before[name])
			}
		}
		if after["s_a.db"].ino != before["s_a.db"].ino || len(after) != len(before) {
			t.Errorf("cycle %d: directory is %+v, was %+v", cycle, after, before)
		}
	}
	if got := changes(); len(got) != 0 {
		t.Errorf("wakes changed the directory: %v", got)
	}
	l, err := d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	evs, more, err := l.Range(ctx, 0, 1000, 0)
	if err != nil || more || !slices.Equal(seqs(t, evs), seqRange(1, next-1)) {
		t.Errorf("Range after cycles: %d events, more %v, %v; want 1..%d", len(evs), more, err, next-1)
	}
}

// TestLog_CloseLeavesMainFileWhole copies only the database file of a closed
// history into another directory: the copy holds every event and the
// metadata, with no WAL to help it.
func TestLog_CloseLeavesMainFileWhole(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	for next := session.Seq(1); next <= 2000; next += 100 {
		mustAppend(t, l, batch(next, 100, 300)...) // Past the auto-checkpoint, too.
	}
	m := meta("s_a")
	m.Title = "changed last"
	if err := l.SetMeta(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(d.Path, "s_a.db"))
	if err != nil {
		t.Fatal(err)
	}
	other := newDir(t)
	if err := os.MkdirAll(other.Path, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other.Path, "s_a.db"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if res := integrityCheck(t, filepath.Join(other.Path, "s_a.db")); res != "ok" {
		t.Errorf("integrity_check of the copy: %s", res)
	}
	c, err := other.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	evs, more, err := c.Range(ctx, 0, 3000, 0)
	if err != nil || more || !slices.Equal(seqs(t, evs), seqRange(1, 2000)) {
		t.Errorf("Range of the copy: %d events, more %v, %v; want 1..2000", len(evs), more, err)
	}
	if got, err := c.Meta(ctx); err != nil || got.Title != "changed last" {
		t.Errorf("Meta of the copy = %+v, %v", got, err)
	}
}

// TestDir_OpenOldLayout opens a history closed by an older atrium, which
// left the database file alone, and one whose WAL files were lost.
func TestDir_OpenOldLayout(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 5, 100)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := os.Remove(filepath.Join(d.Path, "s_a.db"+suffix)); err != nil {
			t.Fatal(err)
		}
	}
	changes := watchDir(t, d.Path)
	l, err := d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	if got := changes(); !slices.Equal(got, []string{"create s_a.db-wal", "create s_a.db-shm"}) {
		t.Errorf("the first wake changed the directory by %v, want the WAL files created", got)
	}
	if n, _ := l.LastSeq(ctx); n != 5 {
		t.Errorf("LastSeq = %d, want 5", n)
	}
	mustAppend(t, l, batch(6, 1, 100)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(dirState(t, d.Path))); !slices.Equal(got, []string{"s_a.db", "s_a.db-shm", "s_a.db-wal"}) {
		t.Errorf("after a wake the directory holds %v", got)
	}
}

// TestDir_CreateLeavesNoTemporaryFile: Create links a whole file into place
// and names nothing else, also when the history exists already. (It checks
// the O_TMPFILE path, which every filesystem atrium runs on supports.)
func TestDir_CreateLeavesNoTemporaryFile(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	if err := os.MkdirAll(d.Path, 0o750); err != nil {
		t.Fatal(err)
	}
	changes := watchDir(t, d.Path)
	l := mustCreate(t, d, "s_a")
	if _, err := d.Create(ctx, meta("s_a")); !errors.Is(err, session.ErrConflict) {
		t.Fatalf("second Create: %v, want conflict", err)
	}
	if got, want := changes(), []string{"create s_a.db", "create s_a.db-wal", "create s_a.db-shm"}; !slices.Equal(got, want) {
		t.Errorf("Create changed the directory by %v, want %v", got, want)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(dirState(t, d.Path))); !slices.Equal(got, []string{"s_a.db", "s_a.db-shm", "s_a.db-wal"}) {
		t.Errorf("directory holds %v", got)
	}
	if res := integrityCheck(t, filepath.Join(d.Path, "s_a.db")); res != "ok" {
		t.Errorf("integrity_check: %s", res)
	}
	if mode := journalMode(t, filepath.Join(d.Path, "s_a.db")); mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
	if b, err := os.ReadFile(filepath.Join(d.Path, "s_a.db")); err != nil || len(b) < 100 || int(b[16])<<8|int(b[17]) != 4096 {
		t.Errorf("the file's page size is not 4096 (MaxBytes counts on it): %v", err)
	}
	l, err := (&sqlite.Dir{Path: d.Path}).Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if m, err := l.Meta(ctx); err != nil || m.ID != "s_a" {
		t.Errorf("Meta = %+v, %v", m, err)
	}
}

// watchDir reports the files created in or removed from dir (inotify) from
// now until the returned function is called. The kernel queues the events
// as the files change, so they are all there when it is called.
func watchDir(tb testing.TB, dir string) func() []string {
	tb.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		tb.Fatalf("inotify: %v", err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO); err != nil {
		tb.Fatalf("inotify: %v", err)
	}
	return func() []string {
		var out []string
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				return out
			} else if err != nil {
				tb.Fatalf("inotify: %v", err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				op := "create "
				if ev.Mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0 {
					op = "remove "
				}
				out = append(out, op+name)
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// TestDir_CreateRace creates one history from many goroutines at once: one
// Create wins, the others fail with a conflict, and no file is left over.
func TestDir_CreateRace(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	var wg sync.WaitGroup
	var won atomic.Int32
	for range 8 {
		wg.Go(func() {
			l, err := d.Create(ctx, meta("s_a"))
			if err == nil {
				won.Add(1)
				if err := l.Close(); err != nil {
					t.Error(err)
				}
			} else if !errors.Is(err, session.ErrConflict) {
				t.Errorf("Create: %v, want success or conflict", err)
			}
		})
	}
	wg.Wait()
	if won.Load() != 1 {
		t.Errorf("%d Creates succeeded, want 1", won.Load())
	}
	if got := slices.Sorted(maps.Keys(dirState(t, d.Path))); !slices.Equal(got, []string{"s_a.db", "s_a.db-shm", "s_a.db-wal"}) {
		t.Errorf("directory holds %v", got)
	}
}

// TestWriteNewNamed checks the fallback of Create's file writing for
// filesystems without O_TMPFILE: the file appears whole under its name, an
// existing file is not replaced, and no temporary name is left.
func TestWriteNewNamed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s_a.db")
	if err := sqlite.WriteNewNamed(dir, path, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := sqlite.WriteNewNamed(dir, path, []byte("second")); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second write: %v, want fs.ErrExist", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "first" {
		t.Errorf("file holds %q, %v", b, err)
	}
	if got := slices.Sorted(maps.Keys(dirState(t, dir))); !slices.Equal(got, []string{"s_a.db"}) {
		t.Errorf("directory holds %v", got)
	}
}
