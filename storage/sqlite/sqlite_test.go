package sqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		os.Exit(m.Run()) // The crash child is killed, never checked for leaks.
	}
	goleak.VerifyTestMain(m)
}

// newDir returns a Dir in a fresh temporary directory.
func newDir(tb testing.TB) *sqlite.Dir {
	tb.Helper()
	return &sqlite.Dir{Path: filepath.Join(tb.TempDir(), "histories")}
}

func meta(id session.ID) session.Meta {
	return session.Meta{
		ID: id, Title: "t " + string(id), Owner: "ann", Epoch: session.NewEpoch(),
		CreatedAt: session.Time{Time: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)},
		Members:   session.Members{"ann": session.RoleOwner},
	}
}

// mustCreate creates the history of id in d and closes it at the end of the test.
func mustCreate(tb testing.TB, d *sqlite.Dir, id session.ID) *sqlite.Log {
	tb.Helper()
	l, err := d.Create(context.Background(), meta(id))
	if err != nil {
		tb.Fatalf("create %s: %v", id, err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// ev returns event seq of kind whose JSON is about size bytes.
func ev(seq session.Seq, kind session.Kind, size int) session.Stored {
	b := fmt.Appendf(nil, `{"seq":%d,"kind":%q,"data":{"text":""}}`, seq, kind)
	pad := strings.Repeat("x", max(size-len(b), 0))
	return session.Stored{Seq: seq, Kind: kind, JSON: fmt.Appendf(nil, `{"seq":%d,"kind":%q,"data":{"text":%q}}`, seq, kind, pad)}
}

func batch(from session.Seq, n, size int) []session.Stored {
	evs := make([]session.Stored, n)
	for i := range evs {
		evs[i] = ev(from+session.Seq(i), session.KindOutput, size)
	}
	return evs
}

func mustAppend(tb testing.TB, l *sqlite.Log, evs ...session.Stored) {
	tb.Helper()
	if err := l.Append(context.Background(), evs); err != nil {
		tb.Fatalf("append: %v", err)
	}
}

// seqs decodes the seq of each event.
func seqs(tb testing.TB, evs []json.RawMessage) []session.Seq {
	tb.Helper()
	out := []session.Seq{}
	for _, b := range evs {
		var e struct{ Seq session.Seq }
		if err := json.Unmarshal(b, &e); err != nil {
			tb.Fatalf("decode %s: %v", b, err)
		}
		out = append(out, e.Seq)
	}
	return out
}

func seqRange(from, to session.Seq) []session.Seq {
	out := []session.Seq{}
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

// TestDir_CreateFromEmptyCopy checks the histories Create makes by copying
// the process's empty history file (every Create after the first): WAL mode,
// their own metadata, appendable, reopened intact, and nothing left behind
// but their kept WAL files.
func TestDir_CreateFromEmptyCopy(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	for _, id := range []session.ID{"s_a", "s_b", "s_c"} {
		l := mustCreate(t, d, id)
		if got, err := l.Meta(ctx); err != nil || got.Title != "t "+string(id) {
			t.Errorf("%s: Meta = %+v, %v", id, got, err)
		}
		if err := l.Append(ctx, batch(1, 3, 50)); err != nil {
			t.Fatalf("%s: Append: %v", id, err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("%s: Close: %v", id, err)
		}
		if mode := journalMode(t, filepath.Join(d.Path, string(id)+".db")); mode != "wal" {
			t.Errorf("%s: journal_mode = %q, want wal", id, mode)
		}
		l, err := d.Open(ctx, id)
		if err != nil {
			t.Fatalf("%s: Open: %v", id, err)
		}
		if n, err := l.LastSeq(ctx); err != nil || n != 3 {
			t.Errorf("%s: LastSeq after reopen = %d, %v; want 3", id, n, err)
		}
		if got, err := l.Meta(ctx); err != nil || got.ID != id || got.Title != "t "+string(id) {
			t.Errorf("%s: Meta after reopen = %+v, %v", id, got, err)
		}
		l.Close()
	}
	ents, err := os.ReadDir(d.Path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"s_a.db", "s_a.db-shm", "s_a.db-wal", "s_b.db", "s_b.db-shm", "s_b.db-wal", "s_c.db", "s_c.db-shm", "s_c.db-wal"}; !slices.Equal(names, want) {
		t.Errorf("directory holds %v, want %v", names, want)
	}
}

func TestDir_CreateOpen(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	if got, _ := l.Meta(ctx); got.Title != "t s_a" || got.Members["ann"] != session.RoleOwner || !got.CreatedAt.Equal(meta("s_a").CreatedAt.Time) {
		t.Errorf("Meta = %+v", got)
	}
	if n, _ := l.LastSeq(ctx); n != 0 {
		t.Errorf("LastSeq of new history = %d", n)
	}
	// Open does not set the journal mode: Create leaves it in the file.
	if mode := journalMode(t, filepath.Join(d.Path, "s_a.db")); mode != "wal" {
		t.Errorf("journal_mode = %q, want wal", mode)
	}
	if _, err := d.Create(ctx, meta("s_a")); !errors.Is(err, session.ErrConflict) {
		t.Errorf("Create of existing: %v, want conflict", err)
	}
	if _, err := d.Open(ctx, "s_b"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Open of missing: %v, want not found", err)
	}
	mustCreate(t, d, "s_b")
	// A temporary file left by a crash during Create is not a history.
	if err := os.WriteFile(filepath.Join(d.Path, ".s_c.123.tmp"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ids, err := d.List(); err != nil || !slices.Equal(ids, []session.ID{"s_a", "s_b"}) {
		t.Errorf("List = %v, %v", ids, err)
	}
	if !d.Exists("s_a") || d.Exists("s_c") {
		t.Error("Exists is wrong")
	}
	mustCreate(t, d, "s_c")
	if ids, _ := (&sqlite.Dir{Path: filepath.Join(t.TempDir(), "none")}).List(); len(ids) != 0 {
		t.Errorf("List of missing dir = %v", ids)
	}
}

func TestDir_InvalidID(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	for _, id := range []session.ID{"", "../x", "a/b", "x.db", session.ID(strings.Repeat("a", 65))} {
		t.Run(string(id), func(t *testing.T) {
			if _, err := d.Create(ctx, meta(id)); !errors.Is(err, session.ErrBadRequest) {
				t.Errorf("Create: %v", err)
			}
			if _, err := d.Open(ctx, id); !errors.Is(err, session.ErrBadRequest) {
				t.Errorf("Open: %v", err)
			}
			if err := d.Remove(ctx, id); !errors.Is(err, session.ErrBadRequest) {
				t.Errorf("Remove: %v", err)
			}
			if d.Exists(id) {
				t.Error("Exists")
			}
		})
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(d.Path), "x.db")); err == nil {
		t.Error("a file was created outside the directory")
	}
}

func TestDir_Remove(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 3, 100)...)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := dirState(t, d.Path); len(got) != 3 {
		t.Fatalf("closed history is %v, want the file, its WAL and shared memory", got)
	}
	if err := d.Remove(ctx, "s_a"); err != nil {
		t.Fatal(err)
	}
	if d.Exists("s_a") {
		t.Error("exists after Remove")
	}
	if left, _ := os.ReadDir(d.Path); len(left) != 0 {
		t.Errorf("files left: %v", left)
	}
	if err := d.Remove(ctx, "s_a"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	// The id can be used again, with an empty history.
	l = mustCreate(t, d, "s_a")
	if n, _ := l.LastSeq(ctx); n != 0 {
		t.Errorf("LastSeq = %d after re-create", n)
	}
}

func TestDir_Config(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	d.Sync = "sometimes"
	if _, err := d.Create(ctx, meta("s_a")); err == nil || !strings.Contains(err.Error(), "sync mode") {
		t.Errorf("Create with bad sync mode: %v", err)
	}
	d.Sync = sqlite.SyncFull
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 2, 100)...)
}

func TestDir_SchemaTooNew(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	l.Close()
	setUserVersion(t, filepath.Join(d.Path, "s_a.db"), 99)
	if _, err := d.Open(ctx, "s_a"); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("Open of a newer schema: %v", err)
	}
}

func TestLog_Append(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		evs  []session.Stored
		want error
	}{
		{"next", batch(4, 3, 50), nil},
		{"empty", nil, nil},
		{"gap at start", batch(5, 2, 50), session.ErrConflict},
		{"repeat", batch(3, 2, 50), session.ErrConflict},
		{"gap inside", []session.Stored{ev(4, "message", 50), ev(6, "message", 50)}, session.ErrConflict},
		{"no json", []session.Stored{{Seq: 4, Kind: "message"}}, session.ErrBadRequest},
		{"no kind", []session.Stored{{Seq: 4, JSON: []byte("{}")}}, session.ErrBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := mustCreate(t, newDir(t), "s_a")
			mustAppend(t, l, batch(1, 3, 50)...)
			err := l.Append(ctx, tc.evs)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Append: %v, want %v", err, tc.want)
			}
			want := session.Seq(3)
			if err == nil {
				want += session.Seq(len(tc.evs))
			}
			if n, _ := l.LastSeq(ctx); n != want {
				t.Errorf("LastSeq = %d, want %d", n, want)
			}
			evs, _, err := l.Range(ctx, 0, 100, 0)
			if err != nil || !slices.Equal(seqs(t, evs), seqRange(1, want)) {
				t.Errorf("Range = %v, %v", seqs(t, evs), err)
			}
		})
	}
}

// TestLog_AppendChunks appends batches that take one or several INSERT
// statements and checks every event landed once, in order, with its own kind
// and JSON.
func TestLog_AppendChunks(t *testing.T) {
	ctx := context.Background()
	l := mustCreate(t, newDir(t), "s_a")
	kinds := []session.Kind{session.KindOutput, session.KindMessage, session.KindAgent}
	next := session.Seq(1)
	var want []string
	for _, n := range []int{1, 2, 3, 5, 7, 16, 17, 127, 128, 129, 255, 300, 1000} {
		evs := make([]session.Stored, n)
		for i := range evs {
			evs[i] = ev(next+session.Seq(i), kinds[int(next+session.Seq(i))%len(kinds)], 50+i%7)
			want = append(want, string(evs[i].JSON))
		}
		mustAppend(t, l, evs...)
		next += session.Seq(n)
		if last, _ := l.LastSeq(ctx); last != next-1 {
			t.Fatalf("LastSeq = %d after a batch of %d, want %d", last, n, next-1)
		}
	}
	evs, more, err := l.Range(ctx, 0, len(want)+1, 0)
	if err != nil || more || len(evs) != len(want) {
		t.Fatalf("Range = %d events, %v, %v; want %d", len(evs), more, err, len(want))
	}
	for i, b := range evs {
		if string(b) != want[i] {
			t.Fatalf("event %d = %s, want %s", i+1, b, want[i])
		}
	}
	for i, k := range kinds {
		// The last seq s of kind k is the largest with s%3 == i.
		s := next - 1 - (next-1-session.Seq(i)+3)%3
		if b, err := l.LastOfKind(ctx, k); err != nil || string(b) != want[s-1] {
			t.Errorf("LastOfKind(%s) = %s, %v; want seq %d", k, b, err, s)
		}
	}
}

// TestLog_AppendAllOrNothing fails a batch of several statements in a late
// one (the history fills up) and checks that none of it was written.
func TestLog_AppendAllOrNothing(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	d.MaxBytes = 256 << 10
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 10, 300)...)
	err := l.Append(ctx, batch(11, 1000, 300)) // ~300 KiB: chunks of 128, ..., then full.
	if !errors.Is(err, session.ErrUnavailable) {
		t.Fatalf("Append past the cap: %v", err)
	}
	if n, _ := l.LastSeq(ctx); n != 10 {
		t.Errorf("LastSeq = %d after a failed batch, want 10", n)
	}
	if evs, more, err := l.Range(ctx, 0, 2000, 0); err != nil || more || !slices.Equal(seqs(t, evs), seqRange(1, 10)) {
		t.Errorf("Range after a failed batch = %v, %v, %v", seqs(t, evs), more, err)
	}
	mustAppend(t, l, batch(11, 200, 300)...)
	if n, _ := l.LastSeq(ctx); n != 210 {
		t.Errorf("LastSeq = %d after a good batch, want 210", n)
	}
}

func TestLog_Range(t *testing.T) {
	ctx := context.Background()
	l := mustCreate(t, newDir(t), "s_a")
	mustAppend(t, l, batch(1, 5, 100)...)
	mustAppend(t, l, ev(6, session.KindOutput, 1000))
	mustAppend(t, l, batch(7, 4, 100)...)
	for _, tc := range []struct {
		name            string
		after           session.Seq
		limit, maxBytes int
		want            []session.Seq
		more            bool
	}{
		{"all", 0, 100, 0, seqRange(1, 10), false},
		{"after", 7, 100, 0, seqRange(8, 10), false},
		{"at end", 10, 100, 0, nil, false},
		{"past end", 11, 100, 0, nil, false},
		{"limit", 2, 3, 0, seqRange(3, 5), true},
		{"limit exactly reaches end", 7, 3, 0, seqRange(8, 10), false},
		{"zero limit gives one", 0, 0, 0, []session.Seq{1}, true},
		{"bytes", 0, 100, 350, seqRange(1, 3), true},
		{"first is bigger than bytes", 5, 100, 200, []session.Seq{6}, true},
		{"big one stops at", 3, 100, 500, seqRange(4, 5), true},
		{"bytes exactly enough", 6, 100, 400, seqRange(7, 10), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs, more, err := l.Range(ctx, tc.after, tc.limit, tc.maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			if got := seqs(t, evs); !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) || more != tc.more {
				t.Errorf("Range(%d, %d, %d) = %v, %v; want %v, %v", tc.after, tc.limit, tc.maxBytes, got, more, tc.want, tc.more)
			}
		})
	}
}

func TestLog_LastOfKind(t *testing.T) {
	ctx := context.Background()
	l := mustCreate(t, newDir(t), "s_a")
	if b, err := l.LastOfKind(ctx, session.KindTurnStarted); b != nil || err != nil {
		t.Errorf("LastOfKind of empty = %s, %v", b, err)
	}
	mustAppend(t, l, ev(1, session.KindTurnStarted, 10), ev(2, session.KindOutput, 10), ev(3, session.KindTurnStarted, 10), ev(4, session.KindOutput, 10))
	for kind, want := range map[session.Kind][]session.Seq{
		session.KindTurnStarted: {3},
		session.KindOutput:      {4},
		session.KindError:       {},
	} {
		b, err := l.LastOfKind(ctx, kind)
		var got []json.RawMessage
		if b != nil {
			got = append(got, b)
		}
		if err != nil || !slices.Equal(seqs(t, got), want) {
			t.Errorf("LastOfKind(%s) = %s, %v; want seq %v", kind, b, err, want)
		}
	}
}

func TestLog_Reopen(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 7, 100)...)
	m := meta("s_a")
	m.Title, m.Members = "renamed", session.Members{"ann": session.RoleOwner, "bob": session.RoleViewer}
	if err := l.SetMeta(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := l.SetMeta(ctx, meta("s_other")); !errors.Is(err, session.ErrBadRequest) {
		t.Errorf("SetMeta of another session: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := l.Append(ctx, batch(8, 1, 10)); err == nil {
		t.Error("Append after Close succeeded")
	}

	l, err := d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if n, _ := l.LastSeq(ctx); n != 7 {
		t.Errorf("LastSeq after reopen = %d", n)
	}
	if got, err := l.Meta(ctx); err != nil || got.Title != "renamed" || got.Members["bob"] != session.RoleViewer || got.Epoch != m.Epoch {
		t.Errorf("Meta after reopen = %+v, %v", got, err)
	}
	mustAppend(t, l, batch(8, 2, 100)...)
	if evs, _, _ := l.Range(ctx, 0, 100, 0); !slices.Equal(seqs(t, evs), seqRange(1, 9)) {
		t.Errorf("Range after reopen = %v", seqs(t, evs))
	}
}

func TestLog_Full(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	d.MaxBytes = 256 << 10
	l := mustCreate(t, d, "s_a")
	var err error
	next := session.Seq(1)
	for ; next < 10000 && err == nil; next += 16 {
		err = l.Append(ctx, batch(next, 16, 300))
	}
	next -= 16
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "session history is full (limit 256 KiB)") {
		t.Fatalf("Append past the cap: %v", err)
	}
	if n, _ := l.LastSeq(ctx); n != next-1 || n < 100 {
		t.Fatalf("LastSeq = %d after failed append of %d", n, next)
	}
	// Reads still work and see every committed event.
	evs, more, err := l.Range(ctx, 0, 100000, 0)
	if err != nil || more || !slices.Equal(seqs(t, evs), seqRange(1, next-1)) {
		t.Fatalf("Range after full = %d events, %v, %v", len(evs), more, err)
	}
	if err := l.Append(ctx, batch(next, 16, 300)); !errors.Is(err, session.ErrUnavailable) {
		t.Errorf("second Append past the cap: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// With room made (a larger cap), appends resume where they stopped.
	d.MaxBytes = 1 << 20
	l, err = d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mustAppend(t, l, batch(next, 16, 300)...)
	if n, _ := l.LastSeq(ctx); n != next+15 {
		t.Errorf("LastSeq = %d after the cap was raised", n)
	}
}

// openFiles returns the files under dir that this process holds open.
func openFiles(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	var open []string
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, dir) {
			open = append(open, target)
		}
	}
	return open
}

func TestLog_CloseReleasesFiles(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, batch(1, 10, 300)...)
	if _, _, err := l.Range(ctx, 0, 5, 0); err != nil {
		t.Fatal(err)
	}
	if open := openFiles(t, d.Path); len(open) == 0 {
		t.Fatal("an open history holds no file: the check below would prove nothing")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if open := openFiles(t, d.Path); len(open) != 0 {
		t.Errorf("files still open after Close: %v", open)
	}
	if fi, err := os.Stat(filepath.Join(d.Path, "s_a.db-wal")); err != nil || fi.Size() != 0 {
		t.Errorf("WAL after Close: %v, %v; want an empty file", fi, err)
	}
}

// TestLog_ConcurrentReads reads while one goroutine appends; every read must
// see a contiguous prefix of the log.
func TestLog_ConcurrentReads(t *testing.T) {
	ctx := context.Background()
	l := mustCreate(t, newDir(t), "s_a")
	const total = 600
	var wg sync.WaitGroup
	wg.Go(func() {
		for next := session.Seq(1); next <= total; next += 8 {
			if err := l.Append(ctx, batch(next, 8, 200)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 4 {
		wg.Go(func() {
			for after := session.Seq(0); after < total; {
				evs, _, err := l.Range(ctx, after, 50, 4096)
				if err != nil {
					t.Error(err)
					return
				}
				got := seqs(t, evs)
				if len(got) > 0 && !slices.Equal(got, seqRange(after+1, after+session.Seq(len(got)))) {
					t.Errorf("Range(%d) = %v", after, got)
					return
				}
				after += session.Seq(len(got))
				if _, err := l.LastOfKind(ctx, session.KindOutput); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
