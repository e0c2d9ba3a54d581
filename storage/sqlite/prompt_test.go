package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// message returns message event seq sent by by with clientID, as the session
// actor encodes it.
func message(seq session.Seq, by, clientID string) session.Stored {
	return session.Stored{Seq: seq, Kind: session.KindMessage, JSON: fmt.Appendf(nil,
		`{"seq":%d,"epoch":"e","time":"2026-01-02T03:04:05Z","kind":"message","by":%q,"data":{"text":"hi","client_id":%q}}`,
		seq, by, clientID)}
}

func TestLog_PromptSeq(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	check := func(when, by, clientID string, want session.Seq) {
		t.Helper()
		if got, err := l.PromptSeq(ctx, by, clientID); err != nil || got != want {
			t.Errorf("%s: PromptSeq(%q, %q) = %d, %v; want %d", when, by, clientID, got, err, want)
		}
	}
	check("empty", "ann", "c-1", 0)
	other := session.Stored{Seq: 3, Kind: session.KindOutput, JSON: []byte(`{"seq":3,"kind":"output","by":"ann","data":{"client_id":"c-9"}}`)}
	mustAppend(t, l, message(1, "ann", "c-1"), message(2, "bob", "c-1"), other, message(4, "ann", ""), message(5, "ann", "c-2"))
	for _, c := range []struct {
		by, clientID string
		want         session.Seq
	}{
		{"ann", "c-1", 1},
		{"bob", "c-1", 2}, // the same client_id from another user is another prompt
		{"ann", "c-2", 5},
		{"bob", "c-2", 0},
		{"ann", "c-9", 0}, // only message events count
		{"ann", "c", 0},
	} {
		check("appended", c.by, c.clientID, c.want)
	}
	mustAppend(t, l, message(6, "ann", "c-1"))
	check("sent twice", "ann", "c-1", 6) // the newest wins

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	check("reopened", "bob", "c-1", 2)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.PromptSeq(ctx, "ann", "c-1"); err == nil {
		t.Error("PromptSeq on a closed history succeeded")
	}
}

// TestLog_PromptSeqMigrated opens a history of schema version 1, which has
// no events_prompt index: the migrations build it from the events there.
func TestLog_PromptSeqMigrated(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	mustAppend(t, l, message(1, "ann", "c-1"), ev(2, session.KindOutput, 100), message(3, "ann", "c-2"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d.Path, "s_a.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`DROP INDEX events_prompt; ALTER TABLE events DROP COLUMN prompt_by;
		ALTER TABLE events DROP COLUMN prompt_client_id; PRAGMA user_version = 1`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	l, err = d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got, err := l.PromptSeq(ctx, "ann", "c-2"); err != nil || got != 3 {
		t.Errorf("PromptSeq after migration = %d, %v; want 3", got, err)
	}
	mustAppend(t, l, message(4, "ann", "c-3"))
	if got, err := l.PromptSeq(ctx, "ann", "c-3"); err != nil || got != 4 {
		t.Errorf("PromptSeq of a new prompt = %d, %v; want 4", got, err)
	}
}

// TestLog_PromptSeqMigratedColumns opens a history of schema version 2,
// whose events_prompt index was over json_extract expressions: the
// migration fills the prompt columns of the message events there, so the
// prompts written before are found, and only those a lookup could find
// before (a by and a client_id that are strings).
func TestLog_PromptSeqMigratedColumns(t *testing.T) {
	ctx := context.Background()
	d := newDir(t)
	l := mustCreate(t, d, "s_a")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", filepath.Join(d.Path, "s_a.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`DROP INDEX events_prompt`,
		`ALTER TABLE events DROP COLUMN prompt_by`,
		`ALTER TABLE events DROP COLUMN prompt_client_id`,
		`CREATE INDEX events_prompt ON events (json_extract(json, '$.by'), json_extract(json, '$.data.client_id'), seq) WHERE kind = 'message'`,
		`PRAGMA user_version = 2`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, e := range []session.Stored{
		message(1, "ann", "c-1"),
		{Seq: 2, Kind: session.KindOutput, JSON: []byte(`{"seq":2,"kind":"output","by":"ann","data":{"client_id":"c-9"}}`)},
		{Seq: 3, Kind: session.KindMessage, JSON: []byte(`{"seq":3,"kind":"message","by":"ann","data":{"client_id":7}}`)},
		{Seq: 4, Kind: session.KindMessage, JSON: []byte(`{"seq":4,"kind":"message","data":{"client_id":"c-4"}}`)},
		message(5, "bob", "c-1"),
	} {
		if _, err := db.Exec(`INSERT INTO events (seq, kind, json) VALUES (?, ?, ?)`, e.Seq, string(e.Kind), e.JSON); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	l, err = d.Open(ctx, "s_a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		by, clientID string
		want         session.Seq
	}{
		{"ann", "c-1", 1}, {"bob", "c-1", 5}, {"ann", "c-9", 0}, {"ann", "7", 0}, {"", "c-4", 0},
	} {
		if got, err := l.PromptSeq(ctx, c.by, c.clientID); err != nil || got != c.want {
			t.Errorf("PromptSeq(%q, %q) after migration = %d, %v; want %d", c.by, c.clientID, got, err, c.want)
		}
	}
	mustAppend(t, l, message(6, "ann", "c-6"))
	if got, err := l.PromptSeq(ctx, "ann", "c-6"); err != nil || got != 6 {
		t.Errorf("PromptSeq of a new prompt = %d, %v; want 6", got, err)
	}
}

// BenchmarkPromptSeq looks a prompt up in a history of 1,024 prompts of 2 KB
// each among 5,120 other events, as a session does for a prompt after a wake.
func BenchmarkPromptSeq(b *testing.B) {
	ctx := context.Background()
	l := mustCreate(b, newDir(b), "s_bench")
	text := strings.Repeat("y", 2000)
	var evs []session.Stored
	for i := range 1024 {
		seq := session.Seq(len(evs) + 1)
		evs = append(evs, session.Stored{Seq: seq, Kind: session.KindMessage, JSON: fmt.Appendf(nil,
			`{"seq":%d,"kind":"message","by":"ann","data":{"text":%q,"client_id":"c-%d"}}`, seq, text, i)})
		evs = append(evs, batch(seq+1, 5, 300)...)
	}
	for len(evs) > 0 {
		n := min(len(evs), 128)
		mustAppend(b, l, evs[:n]...)
		evs = evs[n:]
	}
	for b.Loop() {
		if seq, err := l.PromptSeq(ctx, "ann", "c-500"); err != nil || seq != 3001 {
			b.Fatalf("PromptSeq = %d, %v", seq, err)
		}
	}
}

// TestLog_PromptSet asks often enough for the Log to keep its prompts in
// memory: answers stay those of the index, for prompts from before and after
// the set was built, and a message the set cannot read sends lookups back to
// SQL.
func TestLog_PromptSet(t *testing.T) {
	ctx := context.Background()
	l := mustCreate(t, newDir(t), "s_a")
	mustAppend(t, l, message(1, "ann", "c-1"), message(2, "bob", "c-1"), ev(3, session.KindOutput, 10), message(4, "ann", "c-2"))
	check := func(when, by, clientID string, want session.Seq) {
		t.Helper()
		if got, err := l.PromptSeq(ctx, by, clientID); err != nil || got != want {
			t.Fatalf("%s: PromptSeq(%q, %q) = %d, %v; want %d", when, by, clientID, got, err, want)
		}
	}
	for i := range sqlite.PromptSetAfter {
		if sqlite.HasPromptSet(l) {
			t.Fatalf("prompt set built after %d lookups", i)
		}
		check("before the set", "ann", fmt.Sprintf("new-%d", i), 0)
	}
	if !sqlite.HasPromptSet(l) {
		t.Fatalf("no prompt set after %d lookups", sqlite.PromptSetAfter)
	}
	check("loaded", "ann", "c-1", 1)
	check("loaded", "bob", "c-1", 2)
	check("loaded", "ann", "c-2", 4)
	check("never sent", "bob", "c-2", 0)
	check("never sent", "ann", "c-3", 0)

	mustAppend(t, l, message(5, "bob", "c-2"), ev(6, session.KindOutput, 10), message(7, "ann", "c-1"))
	check("appended", "bob", "c-2", 5)
	check("appended", "ann", "c-1", 7)
	check("never sent", "cat", "c-1", 0)

	// A message event whose by is not a string is in the index but not
	// in the set's terms: the set is dropped, not trusted.
	mustAppend(t, l, session.Stored{Seq: 8, Kind: session.KindMessage, JSON: []byte(`{"seq":8,"kind":"message","by":7,"data":{"client_id":"c-9"}}`)})
	if sqlite.HasPromptSet(l) {
		t.Fatal("prompt set kept after a message it cannot read")
	}
	check("after the set", "ann", "c-2", 4)
}
