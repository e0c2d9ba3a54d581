package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// TestLog_QuietStart checks when the first commit after an Open runs without
// syncs (quietstart.go): only with SyncNormal and an empty WAL, only for a
// small batch, and synchronous is NORMAL again once it is committed; every
// event stays.
func TestLog_QuietStart(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, l *sqlite.Log, wantMode int, wantQuiet bool) {
		t.Helper()
		mode, quiet, err := sqlite.Synchronous(l)
		if err != nil {
			t.Fatal(err)
		}
		if mode != wantMode || quiet != wantQuiet {
			t.Errorf("synchronous %d, quiet start %v; want %d, %v", mode, quiet, wantMode, wantQuiet)
		}
	}
	wantEvents := func(t *testing.T, l *sqlite.Log, last session.Seq) {
		t.Helper()
		evs, more, err := l.Range(ctx, 0, 1000, 0)
		if err != nil || more || !slices.Equal(seqs(t, evs), seqRange(1, last)) {
			t.Errorf("Range: %d events, more %v, %v; want 1..%d", len(evs), more, err, last)
		}
	}
	// closed returns d holding a closed history s_a of events 1..10.
	closed := func(t *testing.T, sync string) *sqlite.Dir {
		d := newDir(t)
		d.Sync = sync
		l := mustCreate(t, d, "s_a")
		mustAppend(t, l, batch(1, 10, 300)...)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return d
	}
	open := func(t *testing.T, d *sqlite.Dir) *sqlite.Log {
		l, err := d.Open(ctx, "s_a")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}

	t.Run("empty WAL", func(t *testing.T) {
		d := closed(t, sqlite.SyncNormal)
		l := open(t, d)
		check(t, l, 1, true)
		mustAppend(t, l, batch(11, 1, 300)...)
		check(t, l, 1, false)
		mustAppend(t, l, batch(12, 1, 300)...)
		check(t, l, 1, false)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if res := integrityCheck(t, filepath.Join(d.Path, "s_a.db")); res != "ok" {
			t.Errorf("integrity_check: %s", res)
		}
		wantEvents(t, open(t, d), 12)
	})
	t.Run("new history", func(t *testing.T) {
		l := mustCreate(t, newDir(t), "s_a")
		check(t, l, 1, true)
		mustAppend(t, l, batch(1, 3, 300)...)
		check(t, l, 1, false)
		wantEvents(t, l, 3)
	})
	t.Run("sync full", func(t *testing.T) {
		l := open(t, closed(t, sqlite.SyncFull))
		check(t, l, 2, false)
		mustAppend(t, l, batch(11, 1, 300)...)
		check(t, l, 2, false)
		wantEvents(t, l, 11)
	})
	t.Run("large first batch", func(t *testing.T) {
		l := open(t, closed(t, sqlite.SyncNormal))
		mustAppend(t, l, batch(11, 100, 4000)...) // 400 KB, beyond quietStartMax
		check(t, l, 1, false)
		wantEvents(t, l, 110)
	})
	t.Run("WAL holding frames", func(t *testing.T) {
		// The files of a history whose process stopped without closing it.
		d := newDir(t)
		l := mustCreate(t, d, "s_a")
		mustAppend(t, l, batch(1, 10, 300)...)
		other := newDir(t)
		if err := os.MkdirAll(other.Path, 0o750); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"s_a.db", "s_a.db-wal"} {
			b, err := os.ReadFile(filepath.Join(d.Path, name))
			if err != nil {
				t.Fatal(err)
			}
			if name == "s_a.db-wal" && len(b) == 0 {
				t.Fatal("the open history's WAL is empty")
			}
			if err := os.WriteFile(filepath.Join(other.Path, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		c := open(t, other)
		check(t, c, 1, false)
		mustAppend(t, c, batch(11, 1, 300)...)
		check(t, c, 1, false)
		wantEvents(t, c, 11)
	})
}

// TestLog_RangeOne reads one event at a time, as a waking session reads its
// last event: the right event and more, and no read connection opened.
func TestLog_RangeOne(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 10, 300)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for after := session.Seq(0); after <= 10; after++ {
		evs, more, err := l.Range(ctx, after, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := []session.Seq{}
		if after < 10 {
			want = []session.Seq{after + 1}
		}
		if got := seqs(t, evs); !slices.Equal(got, want) || more != (after < 9) {
			t.Errorf("Range(%d, 1) = %v, more %v; want %v, more %v", after, got, more, want, after < 9)
		}
	}
	if n := sqlite.ReaderConns(l); n != 0 {
		t.Errorf("%d read connections open after one-event reads, want 0", n)
	}
	if evs, more, err := l.Range(ctx, 0, 3, 0); err != nil || more != true || !slices.Equal(seqs(t, evs), seqRange(1, 3)) {
		t.Errorf("Range(0, 3) = %d events, more %v, %v", len(evs), more, err)
	}
}
