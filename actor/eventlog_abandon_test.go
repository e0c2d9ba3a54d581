package actor

import (
	"errors"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestEventLog_Abandon: a session that stops without reading its
// committer's reports (teardownNow) fails every event that is not durable,
// queued on the committer or not, and the metadata callbacks, each once,
// with the stop's error; what was reported before keeps its outcome, and
// numbering goes on from the last durable seq.
func TestEventLog_Abandon(t *testing.T) {
	l := newTestLog(t, 10)
	o := outcome{}
	emitN(l, o, 2) // 11, 12: committed below
	first := l.takeBatch()
	emitN(l, o, 2) // 13, 14: queued, never reported
	l.metaNext.Title = "renamed"
	l.metaDirty = true
	var metaErr error = errors.New("unset")
	l.metaAfter = append(l.metaAfter, func(err error) { metaErr = err })
	second := l.takeBatch()
	emitN(l, o, 1) // 15: never handed to the committer
	var lateMetaErr error = errors.New("unset")
	l.metaAfter = append(l.metaAfter, func(err error) { lateMetaErr = err })
	l.metaNext.Title = "renamed again"
	l.metaDirty = true

	l.settle(&committed{batches: []*batch{first}}, time.Now())
	if len(l.inflight) != 1 || l.inflight[0] != second {
		t.Fatalf("inflight after the first report: %d batches, want the second", len(l.inflight))
	}
	stop := session.Errorf(session.CodeUnavailable, "session s1 stopped on this node: disk full; retry")
	if n := l.abandon(stop); n != 5 {
		t.Fatalf("abandon failed %d callbacks, want 5 (13, 14, its metadata, 15, the later metadata)", n)
	}
	for seq := session.Seq(11); seq <= 15; seq++ {
		err, ran := o[seq]
		switch {
		case !ran:
			t.Errorf("seq %d: never answered", seq)
		case seq <= 12 && err != nil:
			t.Errorf("seq %d committed, told %v", seq, err)
		case seq > 12 && err != stop:
			t.Errorf("seq %d told %v, want the stop's error", seq, err)
		}
	}
	if metaErr != stop || lateMetaErr != stop {
		t.Errorf("metadata callbacks told %v and %v, want the stop's error", metaErr, lateMetaErr)
	}
	if l.durable != 12 || l.nextSeq != 13 || l.pending() || len(l.inflight) != 0 || l.metaNext.Title != l.meta.Title {
		t.Errorf("after abandon: durable %d next %d pending %v inflight %d title %q/%q",
			l.durable, l.nextSeq, l.pending(), len(l.inflight), l.metaNext.Title, l.meta.Title)
	}
	if n := l.abandon(stop); n != 0 {
		t.Errorf("a second abandon failed %d callbacks, want 0", n)
	}
}
