package actor

import (
	"encoding/json"
	"time"

	"github.com/atriumhq/atrium/session"
)

// eventLog is the session's side of its event log: it numbers events, keeps
// them until they are handed to the committer (commit.go), and applies what
// the committer reports, so that a seq is never reused and nothing is
// acknowledged before it is durable. It also holds the session's metadata,
// which is written with the event batches.
//
// It is a plain value owned by the actor's goroutine; the committer's
// goroutine sees only the batches handed to it. It does no I/O itself, so
// numbering, batching and the failure rules are unit-tested without a
// history or NATS (eventlog_test.go).
type eventLog struct {
	meta      session.Meta  // durable metadata
	metaNext  session.Meta  // metadata including changes not yet committed
	metaDirty bool          // metaNext must be written with the next batch
	metaAfter []func(error) // run once metaNext is written (or not)

	nextSeq     session.Seq // seq of the next event
	durable     session.Seq // seq of the last committed event
	outbox      []pendingEvent
	uncommitted int    // batches queued on the committer and not yet reported
	gen         uint64 // commit generation: incremented by a failed commit
	maxData     int    // the largest event data that publishes

	// inflight are the uncommitted batches, in queue order (the committer
	// reports them in it): a stop that will not read their reports fails
	// them (abandon), so that every caller waiting on them is answered.
	inflight []*batch

	// lastActivity is when the last event was committed; nil if unknown.
	lastActivity *session.Time

	// committer writes this activation's batches; nil while the history
	// is not open. closing is the committer that close stops off the
	// actor; the lease lost meanwhile aborts it.
	committer *committer
	closing   *committer
}

// resume starts numbering after the last event of an opened history.
func (l *eventLog) resume(meta session.Meta, last session.Seq, lastTime *session.Time, maxData int) {
	l.meta, l.metaNext = meta, meta
	l.durable, l.nextSeq = last, last+1
	l.lastActivity = lastTime
	l.maxData = maxData
}

// emit assigns the next seq to an event, encodes it once and queues it for
// commit. It returns the seq. after, if set, runs on the actor once the
// event is committed (nil) or dropped (the error).
func (l *eventLog) emit(kind session.Kind, by string, data json.RawMessage, after func(error)) session.Seq {
	seq := l.nextSeq
	l.nextSeq++
	ev := encodeEvent(seq, l.meta.Epoch, time.Now(), kind, by, data)
	l.outbox = append(l.outbox, pendingEvent{ev: ev, after: after})
	return seq
}

// pending reports whether events or metadata wait for the committer or for
// its report.
func (l *eventLog) pending() bool {
	return l.uncommitted > 0 || len(l.outbox) > 0 || l.metaDirty
}

// takeBatch returns what the next commit must write (the outbox and, if it
// changed, the metadata) and counts it as uncommitted; nil if nothing
// changed.
func (l *eventLog) takeBatch() *batch {
	if len(l.outbox) == 0 && !l.metaDirty {
		return nil
	}
	b := &batch{gen: l.gen, pend: l.outbox}
	l.outbox = nil
	if l.metaDirty {
		m := l.metaNext
		m.Members = cloneMembers(m.Members)
		b.meta = &m
		b.metaAfter, l.metaAfter = l.metaAfter, nil
		l.metaDirty = false
	}
	l.uncommitted++
	l.inflight = append(l.inflight, b)
	return b
}

// abandon fails, with err, everything that is numbered and not yet durable
// (queued batches whose reports will not be read, the outbox, pending
// metadata): the actor stops without settling them. It returns how many
// events and metadata callbacks it failed. Numbering goes on from the last
// durable seq, as after a failed commit.
func (l *eventLog) abandon(err error) int {
	var afters []func(error)
	for _, b := range l.inflight {
		for _, p := range b.pend {
			if p.after != nil {
				afters = append(afters, p.after)
			}
		}
		afters = append(afters, b.metaAfter...)
	}
	for _, p := range l.outbox {
		if p.after != nil {
			afters = append(afters, p.after)
		}
	}
	afters = append(afters, l.metaAfter...)
	l.inflight, l.outbox, l.metaAfter = nil, nil, nil
	l.uncommitted = 0
	l.gen++
	l.nextSeq = l.durable + 1
	l.metaNext, l.metaDirty = l.meta, false
	for _, f := range afters {
		f(err)
	}
	return len(afters)
}

// settled is what applying a commit's report changed.
type settled struct {
	// appended is the number of events that became durable.
	appended int
	// dropped is the number of numbered events dropped by the first failure
	// of a generation (the committed ones and those not yet queued); 0
	// otherwise.
	dropped int
	// firstFailure: the report was the first failure of the current
	// generation, which started a new one.
	firstFailure bool
}

// settle applies a commit's report: on success the events and metadata are
// durable; on the first failure of a generation everything numbered after
// the last durable event is dropped and numbering goes on from it, in a new
// generation (see committer). It then runs the events' and metadata's
// callbacks with the outcome. now is when the report arrived.
func (l *eventLog) settle(m *committed, now time.Time) settled {
	var out settled
	l.uncommitted -= len(m.batches)
	for _, b := range m.batches {
		if len(l.inflight) > 0 && l.inflight[0] == b {
			l.inflight[0] = nil
			l.inflight = l.inflight[1:]
		}
	}
	if m.err != nil {
		var dropped []pendingEvent
		for _, b := range m.batches {
			dropped = append(dropped, b.pend...)
		}
		if m.batches[0].gen == l.gen {
			// The first failure of this generation. Nothing of it is
			// durable, and what is queued behind it was numbered after
			// it: the committer drops that, we drop what we have not
			// queued yet and number on from the last durable seq. None
			// of it was published, so no seq is reused.
			out.firstFailure = true
			out.dropped = int(l.nextSeq - l.durable - 1)
			dropped = append(dropped, l.outbox...)
			l.outbox = nil
			l.gen++
			l.nextSeq = l.durable + 1
			l.metaNext = l.meta
			l.metaDirty = false
			for _, f := range l.metaAfter {
				dropped = append(dropped, pendingEvent{after: f})
			}
			l.metaAfter = nil
		}
		for _, p := range dropped {
			if p.after != nil {
				p.after(m.err)
			}
		}
		for _, b := range m.batches {
			for _, f := range b.metaAfter {
				f(m.err)
			}
		}
		return out
	}
	for _, b := range m.batches {
		if n := len(b.pend); n > 0 {
			out.appended += n
			l.durable = b.pend[n-1].ev.Seq
			t := session.Time{Time: now.UTC()}
			l.lastActivity = &t
		}
		if b.meta != nil {
			l.meta = *b.meta
		}
	}
	if m.metaErr != nil {
		l.metaDirty = true
	}
	for _, b := range m.batches {
		for _, p := range b.pend {
			if p.after != nil {
				p.after(nil)
			}
		}
		for _, f := range b.metaAfter {
			f(m.metaErr)
		}
	}
	return out
}
