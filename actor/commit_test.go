package actor

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// memLog is an in-memory commitLog. If gate is set, each Append first
// sends on entered and then receives from gate, so a test can hold the
// committer inside a commit.
type memLog struct {
	gate    chan struct{}
	entered chan struct{}

	mu        sync.Mutex
	seqs      []session.Seq
	appends   int
	metas     []session.Meta
	failNext  error // the next Append fails with it
	failMetas error // every SetMeta fails with it
}

func (l *memLog) Append(_ context.Context, evs []session.Stored) error {
	if l.gate != nil {
		l.entered <- struct{}{}
		<-l.gate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.appends++
	if err := l.failNext; err != nil {
		l.failNext = nil
		return err
	}
	for _, ev := range evs {
		l.seqs = append(l.seqs, ev.Seq)
	}
	return nil
}

func (l *memLog) SetMeta(_ context.Context, m session.Meta) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failMetas != nil {
		return l.failMetas
	}
	l.metas = append(l.metas, m)
	return nil
}

func (l *memLog) written() []session.Seq {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seqs)
}

// committerRig runs a committer over a memLog; it is the committer's
// commitTarget, with a capture that numbers the stream sequence by event.
type committerRig struct {
	c       *committer
	log     *memLog
	reports chan *committed

	mu         sync.Mutex
	stream     uint64
	captured   []session.Seq
	metaSeen   []*session.Meta
	captureErr error
	checkErr   error
}

func (r *committerRig) checkOwner() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checkErr
}

func (r *committerRig) capture(_ context.Context, evs []session.Stored, m *session.Meta) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.captureErr != nil {
		return 0, r.captureErr
	}
	for _, ev := range evs {
		r.captured = append(r.captured, ev.Seq)
	}
	r.metaSeen = append(r.metaSeen, m)
	r.stream += uint64(len(evs))
	return r.stream, nil
}

func (r *committerRig) report(m *committed) { r.reports <- m }

func newCommitterRig(tb testing.TB, log *memLog) *committerRig {
	tb.Helper()
	r := &committerRig{log: log, reports: make(chan *committed, 64)}
	r.c = newCommitter(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.c.run(log, r)
	}()
	tb.Cleanup(func() {
		if log.gate != nil {
			close(log.gate)
		}
		r.c.stop()
		<-done
	})
	return r
}

func (r *committerRig) next(tb testing.TB) *committed {
	tb.Helper()
	select {
	case m := <-r.reports:
		return m
	case <-time.After(10 * time.Second):
		tb.Fatal("no commit report within 10s")
		return nil
	}
}

// testBatch is a batch of events seqs of generation gen.
func testBatch(gen uint64, seqs ...session.Seq) *batch {
	b := &batch{gen: gen}
	for _, seq := range seqs {
		b.pend = append(b.pend, pendingEvent{ev: encodeEvent(seq, "ep", time.Unix(0, 0), session.KindOutput, "x", []byte(`{}`))})
	}
	return b
}

func TestCommitter_GroupCommit(t *testing.T) {
	log := &memLog{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	r := newCommitterRig(t, log)
	b1 := testBatch(0, 1)
	r.c.add(b1)
	// Hold the first commit inside Append while two more batches queue.
	<-log.entered
	b2, b3 := testBatch(0, 2, 3), testBatch(0, 4)
	r.c.add(b2)
	r.c.add(b3)
	log.gate <- struct{}{}
	first := r.next(t)
	if first.err != nil || len(first.batches) != 1 || first.batches[0] != b1 {
		t.Fatalf("first commit %+v", first)
	}
	<-log.entered
	log.gate <- struct{}{}
	second := r.next(t)
	if second.err != nil || len(second.batches) != 2 || second.batches[0] != b2 || second.batches[1] != b3 {
		t.Fatalf("second commit carries %d batches, want b2 and b3 together", len(second.batches))
	}
	if got := log.written(); !slices.Equal(got, []session.Seq{1, 2, 3, 4}) || log.appends != 2 {
		t.Fatalf("written %v in %d appends", got, log.appends)
	}
	if r.c.acked.Load() != 4 || r.c.uncaptured.Load() {
		t.Fatalf("acked %d uncaptured %v", r.c.acked.Load(), r.c.uncaptured.Load())
	}
	r.mu.Lock()
	captured := slices.Clone(r.captured)
	r.mu.Unlock()
	if !slices.Equal(captured, []session.Seq{1, 2, 3, 4}) {
		t.Fatalf("captured %v", captured)
	}
}

func TestCommitter_FailedCommitFailsItsGeneration(t *testing.T) {
	log := &memLog{gate: make(chan struct{}), entered: make(chan struct{}, 16), failNext: errors.New("disk I/O error")}
	werr := log.failNext
	r := newCommitterRig(t, log)
	b1 := testBatch(0, 1, 2)
	r.c.add(b1)
	<-log.entered
	// Queued behind the failing commit: numbered after it, so dropped.
	b2 := testBatch(0, 3)
	// The actor's new generation, numbered again from the last durable.
	b3 := testBatch(1, 1)
	r.c.add(b2)
	r.c.add(b3)
	log.gate <- struct{}{}
	m := r.next(t)
	if !errors.Is(m.err, werr) || m.batches[0] != b1 {
		t.Fatalf("first report %+v", m)
	}
	m = r.next(t)
	if !errors.Is(m.err, errDropped) || len(m.batches) != 1 || m.batches[0] != b2 {
		t.Fatalf("second report: err %v, %d batches; want b2 dropped", m.err, len(m.batches))
	}
	<-log.entered
	log.gate <- struct{}{}
	m = r.next(t)
	if m.err != nil || m.batches[0] != b3 {
		t.Fatalf("new generation: err %v", m.err)
	}
	if got := log.written(); !slices.Equal(got, []session.Seq{1}) || log.appends != 2 {
		t.Fatalf("written %v in %d appends; want only the new generation's event 1 in a second append", got, log.appends)
	}
	if r.c.uncaptured.Load() {
		t.Fatal("a failed write marked the history uncaptured: nothing was written")
	}
}

func TestCommitter_CaptureFailure(t *testing.T) {
	t.Run("capture error", func(t *testing.T) {
		r := newCommitterRig(t, &memLog{})
		cerr := errors.New("stream unreachable")
		r.captureErr = cerr
		r.c.add(testBatch(0, 1))
		m := r.next(t)
		if !errors.Is(m.err, cerr) || !r.c.uncaptured.Load() {
			t.Fatalf("err %v uncaptured %v", m.err, r.c.uncaptured.Load())
		}
		// Durable in the file, not in the stream: the file must not be
		// checkpointed, and the actor stops on this report.
		if got := r.log.written(); !slices.Equal(got, []session.Seq{1}) {
			t.Fatalf("written %v", got)
		}
	})
	t.Run("lease lost: never published", func(t *testing.T) {
		r := newCommitterRig(t, &memLog{})
		r.checkErr = errLeaseLost
		r.c.add(testBatch(0, 1))
		m := r.next(t)
		if !errors.Is(m.err, errLeaseLost) || !r.c.uncaptured.Load() {
			t.Fatalf("err %v uncaptured %v", m.err, r.c.uncaptured.Load())
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.captured) != 0 {
			t.Fatalf("published %v after the lease was lost", r.captured)
		}
	})
}

func TestCommitter_Meta(t *testing.T) {
	t.Run("written after the events and captured with them", func(t *testing.T) {
		r := newCommitterRig(t, &memLog{})
		b := testBatch(0, 1)
		b.meta = &session.Meta{Title: "t2"}
		r.c.add(b)
		if m := r.next(t); m.err != nil || m.metaErr != nil {
			t.Fatalf("report %+v", m)
		}
		if len(r.log.metas) != 1 || r.log.metas[0].Title != "t2" {
			t.Fatalf("metas %+v", r.log.metas)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.metaSeen) != 1 || r.metaSeen[0] == nil || r.metaSeen[0].Title != "t2" {
			t.Fatalf("capture saw meta %+v", r.metaSeen)
		}
	})
	t.Run("a failed metadata write keeps the events", func(t *testing.T) {
		merr := errors.New("meta")
		r := newCommitterRig(t, &memLog{failMetas: merr})
		b := testBatch(0, 1)
		b.meta = &session.Meta{Title: "t2"}
		r.c.add(b)
		m := r.next(t)
		if m.err != nil || !errors.Is(m.metaErr, merr) {
			t.Fatalf("err %v metaErr %v", m.err, m.metaErr)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.metaSeen) != 1 || r.metaSeen[0] != nil {
			t.Fatalf("capture published metadata that is not in the history: %+v", r.metaSeen)
		}
	})
}

func TestCommitter_StopCommitsWhatIsQueued(t *testing.T) {
	log := &memLog{}
	rig := &committerRig{log: log, reports: make(chan *committed, 8)}
	reports := rig.reports
	c := newCommitter(context.Background())
	for i := range 3 {
		c.add(testBatch(0, session.Seq(i+1)))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(log, rig)
	}()
	c.stop()
	<-done
	n := 0
	for len(reports) > 0 {
		m := <-reports
		if m.err != nil {
			t.Fatalf("report err %v", m.err)
		}
		n += len(m.batches)
	}
	if n != 3 || !slices.Equal(log.written(), []session.Seq{1, 2, 3}) {
		t.Fatalf("reported %d batches, written %v", n, log.written())
	}
	c.stop() // safe twice
}
