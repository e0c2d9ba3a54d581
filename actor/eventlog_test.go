package actor

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// newTestLog is an event log restored after last events of an epoch.
func newTestLog(tb testing.TB, last session.Seq) *eventLog {
	tb.Helper()
	l := &eventLog{}
	l.resume(session.Meta{ID: "s1", Epoch: "ep1", Title: "t"}, last, nil, 1<<20)
	return l
}

// outcome records what the callbacks of events were told.
type outcome map[session.Seq]error

func (o outcome) after(seq session.Seq) func(error) {
	return func(err error) {
		if _, dup := o[seq]; dup {
			panic("callback ran twice")
		}
		o[seq] = err
	}
}

func emitN(l *eventLog, o outcome, n int) []session.Seq {
	var seqs []session.Seq
	for range n {
		seq := l.nextSeq
		got := l.emit(session.KindOutput, "alice", json.RawMessage(`{"text":"x"}`), o.after(seq))
		seqs = append(seqs, got)
	}
	return seqs
}

func TestEventLog_EmitNumbersAfterRestore(t *testing.T) {
	l := newTestLog(t, 41)
	o := outcome{}
	seqs := emitN(l, o, 3)
	if seqs[0] != 42 || seqs[1] != 43 || seqs[2] != 44 {
		t.Fatalf("seqs %v, want 42 43 44", seqs)
	}
	if len(l.outbox) != 3 || l.durable != 41 || l.nextSeq != 45 {
		t.Fatalf("outbox %d durable %d next %d", len(l.outbox), l.durable, l.nextSeq)
	}
	var ev session.Event
	if err := json.Unmarshal(l.outbox[1].ev.JSON, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Seq != 43 || ev.Epoch != "ep1" || ev.Kind != session.KindOutput || ev.By != "alice" {
		t.Fatalf("encoded event %+v", ev)
	}
	if !l.pending() {
		t.Fatal("pending() = false with an outbox")
	}
}

func TestEventLog_TakeBatch(t *testing.T) {
	l := newTestLog(t, 1)
	if b := l.takeBatch(); b != nil || l.uncommitted != 0 {
		t.Fatalf("takeBatch of nothing = %+v, uncommitted %d", b, l.uncommitted)
	}
	o := outcome{}
	emitN(l, o, 2)
	l.metaNext.Title = "new title"
	l.metaNext.Members = session.Members{"alice": session.RoleOwner}
	l.metaDirty = true
	var metaErr = errors.New("unset")
	l.metaAfter = append(l.metaAfter, func(err error) { metaErr = err })

	b := l.takeBatch()
	if b == nil || len(b.pend) != 2 || b.meta == nil || b.meta.Title != "new title" || len(b.metaAfter) != 1 {
		t.Fatalf("batch %+v", b)
	}
	// The batch's members are its own: the actor may change metaNext's.
	l.metaNext.Members["bob"] = session.RoleDriver
	if _, ok := b.meta.Members["bob"]; ok {
		t.Fatal("the batch shares its members map with metaNext")
	}
	if len(l.outbox) != 0 || l.metaDirty || l.metaAfter != nil || l.uncommitted != 1 || !l.pending() {
		t.Fatalf("after takeBatch: outbox %d dirty %v after %d uncommitted %d", len(l.outbox), l.metaDirty, len(l.metaAfter), l.uncommitted)
	}

	now := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	res := l.settle(&committed{batches: []*batch{b}}, now)
	if res.appended != 2 || res.firstFailure {
		t.Fatalf("settled %+v", res)
	}
	if l.durable != 3 || l.meta.Title != "new title" || l.uncommitted != 0 || l.pending() {
		t.Fatalf("durable %d title %q uncommitted %d pending %v", l.durable, l.meta.Title, l.uncommitted, l.pending())
	}
	if l.lastActivity == nil || !l.lastActivity.Equal(now) {
		t.Fatalf("lastActivity %v, want %v", l.lastActivity, now)
	}
	if len(o) != 2 || o[2] != nil || o[3] != nil || metaErr != nil {
		t.Fatalf("callbacks %v, meta %v", o, metaErr)
	}
}

func TestEventLog_MetaWriteFailureRetries(t *testing.T) {
	l := newTestLog(t, 5)
	o := outcome{}
	emitN(l, o, 1)
	l.metaNext.Title = "x"
	l.metaDirty = true
	var got error
	l.metaAfter = []func(error){func(err error) { got = err }}
	b := l.takeBatch()
	werr := errors.New("disk")
	l.settle(&committed{batches: []*batch{b}, metaErr: werr}, time.Now())
	if l.durable != 6 || o[6] != nil {
		t.Fatalf("events not durable: durable %d, outcome %v", l.durable, o)
	}
	if !errors.Is(got, werr) {
		t.Fatalf("metadata callback got %v", got)
	}
	if !l.metaDirty {
		t.Fatal("metadata that failed to write is not written with the next batch")
	}
}

func TestEventLog_FailedCommitDropsItsGeneration(t *testing.T) {
	l := newTestLog(t, 10)
	o := outcome{}
	emitN(l, o, 2) // 11, 12
	b1 := l.takeBatch()
	emitN(l, o, 1) // 13
	b2 := l.takeBatch()
	emitN(l, o, 2) // 14, 15: numbered, not yet handed to the committer
	l.metaNext.Title = "lost"
	l.metaDirty = true
	var metaGot error
	l.metaAfter = []func(error){func(err error) { metaGot = err }}
	if l.uncommitted != 2 {
		t.Fatalf("uncommitted %d", l.uncommitted)
	}

	werr := errors.New("write failed")
	res := l.settle(&committed{batches: []*batch{b1}, err: werr}, time.Now())
	if !res.firstFailure || res.dropped != 5 || res.appended != 0 {
		t.Fatalf("settled %+v, want first failure dropping 5", res)
	}
	// Numbering goes on from the last durable event, in a new generation.
	if l.gen != 1 || l.nextSeq != 11 || l.durable != 10 || len(l.outbox) != 0 {
		t.Fatalf("gen %d next %d durable %d outbox %d", l.gen, l.nextSeq, l.durable, len(l.outbox))
	}
	if l.metaDirty || l.metaNext.Title != "t" || !errors.Is(metaGot, werr) {
		t.Fatalf("metadata not rolled back: dirty %v title %q cb %v", l.metaDirty, l.metaNext.Title, metaGot)
	}
	for _, seq := range []session.Seq{11, 12, 14, 15} {
		if !errors.Is(o[seq], werr) {
			t.Errorf("event %d told %v, want the failure", seq, o[seq])
		}
	}
	if _, told := o[13]; told {
		t.Fatal("event 13 (queued on the committer) told before its report")
	}

	// The new generation numbers from 11 again; the committer then reports
	// the old generation's queued batch as dropped, which must not reset
	// the new one.
	seqs := emitN(l, o, 1)
	if seqs[0] != 11 {
		t.Fatalf("first seq of the new generation %d, want 11", seqs[0])
	}
	b3 := l.takeBatch()
	res = l.settle(&committed{batches: []*batch{b2}, err: errDropped}, time.Now())
	if res.firstFailure || l.gen != 1 || l.nextSeq != 12 {
		t.Fatalf("an old generation's failure reset the new one: %+v gen %d next %d", res, l.gen, l.nextSeq)
	}
	if !errors.Is(o[13], errDropped) {
		t.Fatalf("event 13 told %v", o[13])
	}
	if b3.gen != 1 {
		t.Fatalf("new batch gen %d", b3.gen)
	}
	delete(o, 11) // told of the first failure; the new event 11 reports again
	l.settle(&committed{batches: []*batch{b3}}, time.Now())
	if l.durable != 11 || o[11] != nil || l.pending() {
		t.Fatalf("durable %d outcome %v pending %v", l.durable, o[11], l.pending())
	}
}
