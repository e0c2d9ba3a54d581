package actor

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// openerHistory writes a history of id with session_created and then the
// given kind/data pairs, and reopens it.
func openerHistory(t *testing.T, dir *sqlite.Dir, id session.ID, evs ...any) History {
	t.Helper()
	ctx := t.Context()
	now := time.Now().UTC()
	m := session.Meta{ID: id, Title: "t", Owner: "alice", Epoch: "ep", CreatedAt: session.Time{Time: now},
		Members: session.Members{"alice": session.RoleOwner}}
	l, err := dir.Create(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	stored := []session.Stored{encodeEvent(1, "ep", now, session.KindSessionCreated, "alice", mustMarshal(session.SessionCreatedData{Title: m.Title}))}
	for i := 0; i < len(evs); i += 2 {
		seq := session.Seq(len(stored) + 1)
		stored = append(stored, encodeEvent(seq, "ep", now, evs[i].(session.Kind), "alice", mustMarshal(evs[i+1])))
	}
	if err := l.Append(ctx, stored); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	hist, err := dir.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hist.Close() })
	return hist
}

// TestOpener_Recover: recover reads the last seq and time, the sandbox
// state, the last turn, how it ended and the prompts queued after it from
// a history on disk, without the actor.
func TestOpener_Recover(t *testing.T) {
	dir := &sqlite.Dir{Path: filepath.Join(t.TempDir(), "histories"), Logger: testLogger(t)}
	id := session.NewID()
	hist := openerHistory(t, dir, id,
		session.KindMessage, session.MessageData{Text: "first"},
		session.KindTurnStarted, session.TurnStartedData{Turn: 1, PromptSeq: 2},
		session.KindSandbox, session.SandboxData{State: session.SandboxReady},
		session.KindTurnFinished, session.TurnFinishedData{Turn: 1, Status: session.TurnOK},
		session.KindMessage, session.MessageData{Text: "second"},
		session.KindMessage, session.MessageData{Text: "third"},
	)
	o := &opener{id: id, log: testLogger(t)}
	res, err := o.recover(t.Context(), hist)
	if err != nil {
		t.Fatal(err)
	}
	if res.meta.ID != id || res.last != 7 || res.lastTime == nil || res.sandbox != session.SandboxReady || res.lastTurn != 1 {
		t.Fatalf("recover = meta %s last %d time %v sandbox %q turn %d; want %s, 7, a time, ready, 1",
			res.meta.ID, res.last, res.lastTime, res.sandbox, res.lastTurn, id)
	}
	want := []session.Prompt{{Seq: 6, Text: "second", By: "alice"}, {Seq: 7, Text: "third", By: "alice"}}
	if !slices.Equal(res.queue, want) || !res.prompted {
		t.Fatalf("queue %+v prompted %v, want %+v and prompted", res.queue, res.prompted, want)
	}
	if res.prev == nil || res.prev.Turn != 1 || res.prev.Status != session.TurnOK {
		t.Fatalf("prev = %+v, want turn 1 ok", res.prev)
	}
}
