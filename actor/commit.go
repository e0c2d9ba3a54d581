package actor

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/atriumhq/atrium/session"
)

const (
	// maxBatch bounds the events of one commit.
	maxBatch = 512
	// commitTimeout bounds one commit.
	commitTimeout = 30 * time.Second
)

// pendingEvent is an event that has a seq but is not yet durable. after, if
// set, runs on the actor once the event is committed (err nil) or dropped.
type pendingEvent struct {
	ev    session.Stored
	after func(err error)
}

// batch is one group commit: events in seq order and, optionally, new
// metadata written after them.
type batch struct {
	pend []pendingEvent
	meta *session.Meta
}

// committed reports a batch's outcome to the actor. metaErr is set when the
// events are durable but the metadata could not be written.
type committed struct {
	c       *committer
	b       *batch
	err     error
	metaErr error
}

// committer is the goroutine that writes a session's batches: one Append
// per batch, then publish, then report. The actor sends the next batch only
// after the previous one is reported, so events pile up in the outbox while a
// commit runs and go out together (group commit).
type committer struct {
	in   chan *batch // cap 1; closed by stop
	done chan struct{}
}

func (s *sessionActor) startCommitter(hist History) *committer {
	c := &committer{in: make(chan *batch, 1), done: make(chan struct{})}
	subject := s.h.cfg.Subjects.Events(s.id)
	nc := s.h.cfg.NATS
	s.spawn(func() {
		defer close(c.done)
		evs := make([]session.Stored, 0, maxBatch)
		for b := range c.in {
			evs = evs[:0]
			for _, p := range b.pend {
				evs = append(evs, p.ev)
			}
			ctx, cancel := context.WithTimeout(s.h.ctx, commitTimeout)
			res := &committed{c: c, b: b}
			res.err = hist.Append(ctx, evs)
			if res.err == nil && b.meta != nil {
				res.metaErr = hist.SetMeta(ctx, *b.meta)
			}
			cancel()
			if res.err == nil {
				for _, ev := range evs {
					if err := nc.Publish(subject, ev.JSON); err != nil {
						s.log.Warn("publish event", "seq", ev.Seq, "err", err)
					}
				}
			}
			s.send(res)
		}
	})
	return c
}

// stop closes the queue and waits for the batch in progress.
func (c *committer) stop() {
	if c == nil {
		return
	}
	close(c.in)
	<-c.done
}

// emit assigns the next seq to an event, encodes it once and queues it for
// commit. It returns the seq.
func (s *sessionActor) emit(kind session.Kind, by string, data json.RawMessage, after func(error)) session.Seq {
	seq := s.nextSeq
	s.nextSeq++
	ev := encodeEvent(seq, s.meta.Epoch, time.Now().UTC(), kind, by, data)
	s.outbox = append(s.outbox, pendingEvent{ev: ev, after: after})
	return seq
}

// flush sends the outbox to the committer if none is in progress.
func (s *sessionActor) flush() {
	if s.committer == nil || s.inflight || (len(s.outbox) == 0 && !s.metaDirty) {
		return
	}
	n := min(len(s.outbox), maxBatch)
	b := &batch{pend: make([]pendingEvent, n)}
	copy(b.pend, s.outbox)
	s.outbox = append(s.outbox[:0], s.outbox[n:]...)
	if s.metaDirty {
		m := s.metaNext
		m.Members = cloneMembers(m.Members)
		b.meta = &m
		s.metaDirty = false
	}
	s.inflight = true
	s.committer.in <- b // Never blocks: one batch at most is in flight.
}

func (s *sessionActor) onCommitted(m *committed) {
	if m.c != s.committer {
		return
	}
	s.inflight = false
	if m.err != nil {
		// Nothing of this batch is durable, and what queued behind it was
		// numbered after it: drop it all and number on from the last
		// durable seq. None of it was published, so no seq is reused.
		s.log.Warn("commit events", "err", m.err, "dropped", len(m.b.pend)+len(s.outbox))
		dropped := append(m.b.pend, s.outbox...)
		s.outbox = nil
		s.nextSeq = s.durable + 1
		s.metaNext = s.meta
		s.metaDirty = false
		for _, p := range dropped {
			if p.after != nil {
				p.after(m.err)
			}
		}
		return
	}
	if n := len(m.b.pend); n > 0 {
		s.durable = m.b.pend[n-1].ev.Seq
	}
	if m.b.meta != nil {
		s.meta = *m.b.meta
		if m.metaErr != nil {
			s.log.Warn("write metadata; will retry", "err", m.metaErr)
			s.metaDirty = true
		}
	}
	for _, p := range m.b.pend {
		if p.after != nil {
			p.after(nil)
		}
	}
}

// encodeEvent encodes an event once; these bytes are stored, published and
// served by history.
func encodeEvent(seq session.Seq, epoch string, t time.Time, kind session.Kind, by string, data json.RawMessage) session.Stored {
	b := mustMarshal(session.Event{Seq: seq, Epoch: epoch, Time: session.Time{Time: t}, Kind: kind, By: by, Data: data})
	return session.Stored{Seq: seq, Kind: kind, JSON: b}
}

// decodeEvent decodes an encoded event and its data into data.
func decodeEvent(raw []byte, data any) (session.Event, error) {
	var ev session.Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		return ev, err
	}
	return ev, json.Unmarshal(ev.Data, data)
}

// mustMarshal encodes v without HTML escaping. v is always one of our own
// types, which always encode.
func mustMarshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("actor: encode " + err.Error())
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
}
