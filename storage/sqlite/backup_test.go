package sqlite_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestLog_BackupRestore copies a history while it is being appended to and
// restores the copy into another directory: the copy holds exactly the
// events up to the seq Backup returned, and the metadata.
func TestLog_BackupRestore(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s1")
	mustAppend(t, l, batch(1, 100, 200)...)

	var wg sync.WaitGroup
	wg.Go(func() {
		for from := session.Seq(101); from < 1101; from += 50 {
			if err := l.Append(ctx, batch(from, 50, 200)); err != nil {
				t.Errorf("append during backup: %v", err)
				return
			}
		}
	})
	var buf bytes.Buffer
	last, err := l.Backup(ctx, &buf)
	wg.Wait()
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	if last < 100 || last > 1100 {
		t.Fatalf("backup holds up to seq %d", last)
	}

	other := newDir(t)
	if err := other.Restore(ctx, "s1", bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("restore: %v", err)
	}
	r, err := other.Open(ctx, "s1")
	if err != nil {
		t.Fatalf("open restored: %v", err)
	}
	defer r.Close()
	if got, _ := r.LastSeq(ctx); got != last {
		t.Errorf("restored last seq %d, want %d", got, last)
	}
	evs, _, err := r.Range(ctx, 0, 2000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := seqs(t, evs); !slices.Equal(got, seqRange(1, last)) {
		t.Errorf("restored seqs %d..%d (%d), want 1..%d", got[0], got[len(got)-1], len(got), last)
	}
	m, err := r.Meta(ctx)
	if err != nil || m.ID != "s1" || m.Title != meta("s1").Title {
		t.Errorf("restored meta %+v, %v", m, err)
	}
	// The restored history takes appends after its last seq.
	mustAppend(t, r, batch(last+1, 1, 10)...)
	entries, _ := os.ReadDir(other.Path)
	for _, e := range entries {
		if e.Name() != "s1.db" && e.Name() != "s1.db-wal" && e.Name() != "s1.db-shm" {
			t.Errorf("restore left %s behind", e.Name())
		}
	}
}

// TestDir_RestoreBadCopy: a truncated copy, or another session's, is refused
// and the existing history is left as it was.
func TestDir_RestoreBadCopy(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s1")
	mustAppend(t, l, batch(1, 10, 100)...)
	var buf bytes.Buffer
	if _, err := l.Backup(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	l.Close()
	o := newDir(t)
	s2 := mustCreate(t, o, "s2")
	mustAppend(t, s2, batch(1, 3, 100)...)
	mustAppend(t, s2, batch(4, 2000, 100)...)
	var own bytes.Buffer
	if _, err := s2.Backup(ctx, &own); err != nil {
		t.Fatal(err)
	}

	for name, r := range map[string]io.Reader{
		"truncated":         bytes.NewReader(own.Bytes()[:own.Len()/2]),
		"another session's": bytes.NewReader(buf.Bytes()),
		"failing reader":    io.MultiReader(bytes.NewReader(buf.Bytes()[:100]), errReader{}),
	} {
		t.Run(name, func(t *testing.T) {
			if err := o.Restore(ctx, "s2", r); err == nil {
				t.Fatal("restore succeeded")
			}
			if got, _ := s2.LastSeq(ctx); got != 2003 {
				t.Errorf("s2 last seq %d after a refused restore", got)
			}
			evs, _, err := s2.Range(ctx, 0, 3000, 0)
			if err != nil || len(evs) != 2003 {
				t.Errorf("s2 after a refused restore: %d events, %v", len(evs), err)
			}
		})
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("download broke") }

// TestLog_BackupSizes backs up a small history, which is copied through
// memory and creates no file, and one over 2 MiB, which goes through VACUUM
// INTO a temporary file; both restore whole, and neither leaves a file.
func TestLog_BackupSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    int
		eventSize int
	}{
		{"small", 320, 300},
		{"large", 192, 16 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			d := newDir(t)
			l := mustCreate(t, d, "s1")
			for next := session.Seq(1); next <= session.Seq(tc.events); next += 64 {
				mustAppend(t, l, batch(next, 64, tc.eventSize)...)
			}
			before := dirState(t, d.Path)
			changes := watchDir(t, d.Path)
			var buf bytes.Buffer
			last, err := l.Backup(ctx, &buf)
			if err != nil {
				t.Fatal(err)
			}
			if got := changes(); (tc.name == "small") != (len(got) == 0) {
				t.Errorf("Backup changed the directory by %v", got)
			}
			if last != session.Seq(tc.events) {
				t.Errorf("Backup returned last seq %d, want %d", last, tc.events)
			}
			if large := buf.Len() > 2<<20; large != (tc.name == "large") {
				t.Fatalf("the copy is %d bytes: the case does not test what it says", buf.Len())
			}
			if after := dirState(t, d.Path); !maps.Equal(after, before) {
				t.Errorf("the directory changed from %v to %v", before, after)
			}
			other := newDir(t)
			if err := other.Restore(ctx, "s1", &buf); err != nil {
				t.Fatal(err)
			}
			if got := slices.Sorted(maps.Keys(dirState(t, other.Path))); !slices.Equal(got, []string{"s1.db", "s1.db-shm", "s1.db-wal"}) {
				t.Errorf("Restore left %v", got)
			}
			restored := dirState(t, other.Path)
			r, err := other.Open(ctx, "s1")
			if err != nil {
				t.Fatal(err)
			}
			evs, more, err := r.Range(ctx, 0, tc.events+1, 0)
			if err != nil || more || !slices.Equal(seqs(t, evs), seqRange(1, last)) {
				t.Errorf("Range of the restored copy: %d events, more %v, %v; want 1..%d", len(evs), more, err, last)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if after := dirState(t, other.Path); !maps.Equal(after, restored) {
				t.Errorf("opening the restored history changed the directory from %v to %v", restored, after)
			}
		})
	}
}
