package actor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atriumhq/atrium/session"
)

const (
	// maxBatch bounds the events of one commit (softly: a batch the actor
	// queued is never split).
	maxBatch = 1024
	// yieldBelow: with fewer batches queued than this, the committer
	// yields once before taking them.
	yieldBelow = 64
)

// pendingEvent is an event that has a seq but is not yet durable. after, if
// set, runs on the actor once the event is committed (err nil) or dropped.
type pendingEvent struct {
	ev    session.Stored
	after func(err error)
}

// batch is what one Receive of the actor queued for commit: events in seq
// order and, optionally, new metadata written after them. gen is the actor's
// commit generation when it was queued (see committer).
type batch struct {
	gen  uint64
	pend []pendingEvent
	meta *session.Meta
	// metaAfter run on the actor once meta is written (err nil) or not.
	metaAfter []func(err error)
}

// committed reports the outcome of one commit (one or more batches, in
// queue order) to the actor. metaErr is set when the events are durable but
// the metadata could not be written.
type committed struct {
	c       *committer
	batches []*batch
	err     error
	metaErr error
}

// committer is the goroutine that writes a session's events. The actor
// queues a batch at the end of every Receive that produced events, without
// waiting for earlier batches to be reported; each commit takes everything
// queued since the previous one began, appends it in one transaction,
// publishes it and reports it. So under load a commit carries all that
// arrived while the previous one ran (group commit), and the committer never
// waits for the actor between commits.
//
// A failed commit drops its events, and everything queued behind it was
// numbered after them, so it must not be written either: the committer fails
// every later batch of the same generation without writing it. The actor,
// told of the first failure, drops what it has not queued yet, numbers on
// from the last durable seq and starts a new generation, whose batches are
// written again.
type committer struct {
	mu     sync.Mutex
	queue  []*batch // guarded by mu
	closed bool     // guarded by mu

	wake chan struct{} // cap 1
	done chan struct{} // closed when the goroutine has ended
	// ctx bounds capture; abort cancels it (the lease is lost), so that
	// stop does not wait for a stream it cannot reach.
	ctx   context.Context
	abort context.CancelFunc
	// acked is the highest events-stream sequence a capture stored: every
	// event committed after it was read has a higher one (checkpoints).
	acked atomic.Uint64
	// uncaptured is set once a capture failed: the file then holds events
	// the stream may lack, and must not be checkpointed.
	uncaptured atomic.Bool

	// Owned by the committer's goroutine.
	failed    bool
	failedGen uint64
}

// commitLog is what a committer writes: the session's history (History has
// more; the committer needs only these).
type commitLog interface {
	Append(ctx context.Context, evs []session.Stored) error
	SetMeta(ctx context.Context, m session.Meta) error
}

// commitTarget is where a committer's goroutine publishes and reports: the
// session (sessionCommits) in production, a fake in tests.
type commitTarget interface {
	// checkOwner returns an error once this node may no longer publish
	// the session's events (its lease may be lost).
	checkOwner() error
	// capture publishes committed events, and the metadata written with
	// them if any, to the events stream; it returns the stream sequence of
	// the last one stored.
	capture(ctx context.Context, evs []session.Stored, m *session.Meta) (uint64, error)
	// report delivers the outcome of a commit to the actor.
	report(*committed)
}

// sessionCommits is the commitTarget of a session actor's committer.
type sessionCommits struct {
	s     *sessionActor
	epoch string
	owner *lease // read on the actor's goroutine; its check is safe from any
}

func (t *sessionCommits) checkOwner() error {
	if t.owner == nil {
		return nil
	}
	return t.owner.check()
}

func (t *sessionCommits) capture(ctx context.Context, evs []session.Stored, m *session.Meta) (uint64, error) {
	return t.s.h.captureEvents(ctx, t.s.id, t.epoch, evs, m)
}

func (t *sessionCommits) report(m *committed) { t.s.send(m) }

// newCommitter returns a committer whose capture runs under a child of
// ctx; run is its goroutine.
func newCommitter(ctx context.Context) *committer {
	c := &committer{wake: make(chan struct{}, 1), done: make(chan struct{})}
	c.ctx, c.abort = context.WithCancel(ctx)
	return c
}

func (s *sessionActor) startCommitter(hist History) *committer {
	c := newCommitter(s.h.ctx)
	t := &sessionCommits{s: s, epoch: s.events.meta.Epoch, owner: s.lease}
	s.spawn(func() { c.run(hist, t) })
	return c
}

// run is the committer's goroutine: it commits what is queued until stop.
func (c *committer) run(hist commitLog, t commitTarget) {
	defer close(c.done)
	defer c.abort()
	evs := make([]session.Stored, 0, maxBatch)
	for {
		c.mu.Lock()
		for len(c.queue) == 0 && !c.closed {
			c.mu.Unlock()
			<-c.wake
			c.mu.Lock()
		}
		if n := len(c.queue); n > 0 && n < yieldBelow {
			// Let the goroutines that are about to queue more (the
			// actor, the subscription) run first: one yield costs
			// far less than a commit, and under load it makes each
			// commit carry several times more events.
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		queue := c.queue
		c.queue = nil // the reports keep slices of it
		c.mu.Unlock()
		if len(queue) == 0 {
			return // closed and nothing left
		}
		for len(queue) > 0 {
			var res *committed
			res, queue = c.take(queue)
			if res.err == nil {
				evs = evs[:0]
				var meta *session.Meta
				for _, b := range res.batches {
					for _, p := range b.pend {
						evs = append(evs, p.ev)
					}
					if b.meta != nil {
						meta = b.meta
					}
				}
				// No deadline or cancellation: under a context that
				// can end, modernc.org/sqlite starts a goroutine for
				// every statement (to interrupt it), which costs more
				// than the insert itself; and SQLite could not
				// interrupt a write stuck in the kernel anyway.
				ctx := context.Background()
				res.err = hist.Append(ctx, evs)
				if res.err == nil && meta != nil {
					res.metaErr = hist.SetMeta(ctx, *meta)
				}
				if res.err == nil {
					// Durable here; reported (and acknowledged) once
					// the stream has it too. If capture fails, the
					// lease is lost or the host is closing: the actor
					// stops, and the next activation re-publishes or
					// drops what is only in this file (takeover.go).
					var top uint64
					var m *session.Meta
					if res.metaErr == nil {
						m = meta
					}
					if res.err = t.checkOwner(); res.err == nil {
						// Never published once the lease may be lost
						// (checked above): the next owner may already
						// be replaying. captureEvents checks again
						// before every attempt.
						top, res.err = t.capture(c.ctx, evs, m)
					}
					if top > c.acked.Load() {
						c.acked.Store(top)
					}
					if res.err != nil {
						c.uncaptured.Store(true)
					}
				}
				if res.err != nil {
					c.failed, c.failedGen = true, res.batches[len(res.batches)-1].gen
				}
			}
			t.report(res)
		}
	}
}

// take removes the next commit's batches from the front of queue: either the
// batches of a failed generation, reported failed without being written, or
// up to maxBatch events of batches to write.
func (c *committer) take(queue []*batch) (*committed, []*batch) {
	res := &committed{c: c}
	n := 0
	if c.failed && queue[0].gen == c.failedGen {
		for n < len(queue) && queue[n].gen == c.failedGen {
			n++
		}
		res.batches, res.err = queue[:n:n], errDropped
		return res, queue[n:]
	}
	c.failed = false
	events := 0
	for n < len(queue) && (n == 0 || events+len(queue[n].pend) <= maxBatch) {
		events += len(queue[n].pend)
		n++
	}
	res.batches = queue[:n:n]
	return res, queue[n:]
}

// errDropped is the error of events queued behind a failed commit.
var errDropped = session.Errorf(session.CodeUnavailable, "an earlier write to the session's history failed; retry")

// add queues b for commit. It never blocks for long: the committer holds the
// lock only to swap the queue.
func (c *committer) add(b *batch) {
	c.mu.Lock()
	c.queue = append(c.queue, b)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// stop commits what is queued, ends the goroutine and waits for it.
func (c *committer) stop() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	<-c.done
}

// flush hands the event log's outbox (and changed metadata) to the
// committer.
func (s *sessionActor) flush() {
	if s.events.committer == nil {
		return
	}
	b := s.events.takeBatch()
	if b == nil {
		return
	}
	if b.meta != nil {
		// Metadata has no seq: the newest checkpoint lacks it now.
		s.ckptSeq = -1
	}
	s.events.committer.add(b)
}

// onCommitted applies a commit's report to the event log.
func (s *sessionActor) onCommitted(m *committed) {
	if m.c != s.events.committer {
		return
	}
	dropped := errors.Is(m.err, errDropped)
	caused := dropped && s.commitErr != nil
	if caused {
		// Queued behind the failed commit: its callers are told that
		// commit's cause (a full disk, say), not only that an earlier
		// write failed.
		m.err = s.commitErr
	}
	if m.err != nil && m.c.uncaptured.Load() {
		// The history has events the stream does not: this node may no
		// longer write the session (another owner wrote those seqs, or
		// the lease is going). Stop; the next activation reconciles the
		// file with the stream. Callers are told to retry.
		if !caused {
			m.err = unavailableFor(m.err, "session %s stopped on this node: %v; retry", s.id, m.err)
		}
		s.send(&leaseLost{why: "its events could not be captured"})
	}
	if m.err != nil && !dropped {
		s.commitErr = m.err
	}
	res := s.events.settle(m, time.Now())
	if m.err != nil {
		if res.firstFailure {
			s.log.Warn("commit events", "err", m.err, "dropped", res.dropped)
		}
		return
	}
	if res.appended > 0 {
		s.h.metrics.appended.Add(float64(res.appended))
	}
	if m.metaErr != nil {
		s.log.Warn("write metadata; will retry", "err", m.metaErr)
	}
	s.catalogChanged()
}

// encodeEvent encodes an event once; these bytes are stored, published and
// served by history. The encoding is encoding/json's (without HTML
// escaping), written directly: this runs for every event.
func encodeEvent(seq session.Seq, epoch string, t time.Time, kind session.Kind, by string, data json.RawMessage) session.Stored {
	b := make([]byte, 0, 96+len(epoch)+len(kind)+len(by)+len(data))
	b = appendEvent(b, seq, epoch, t, kind, by, data)
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
