package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// wsDriver keeps window requests in flight on each of a run's WebSockets and
// times each from its send to its answer: the pacing of appendWS (Atrium's
// prompts, answered by acks) and appendCentrifugo (Centrifugo's publishes,
// answered by replies), which differ only in their frames.
type wsDriver[K comparable] struct {
	window int
	// request appends the n-th request of connection ci to frame and
	// returns it with the key its answer will carry.
	request func(ci, n int, frame []byte) ([]byte, K)
	// read handles a frame connection w received: it calls answered with
	// the key of each request the frame answers, and fail with an error
	// the frame reports.
	read func(w *wsConn, frame []byte, answered func(K), fail func(error))
	// sendErr and closedErr name a failed send and a connection closed
	// before the end in the error returned.
	sendErr, closedErr string
}

// run drives conns for d and returns the answer latencies, the number of
// requests answered, and the first error (or ctx's).
func (dr wsDriver[K]) run(ctx context.Context, conns []*wsConn, d time.Duration) (*Histogram, int64, error) {
	h := NewHistogram()
	var acked atomic.Int64
	var errOnce sync.Once
	var firstErr error
	var failed atomic.Bool
	fail := func(err error) {
		failed.Store(true)
		errOnce.Do(func() { firstErr = err })
	}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for ci, w := range conns {
		slots := make(chan struct{}, dr.window)
		var mu sync.Mutex
		sent := map[K]time.Time{} // guarded by mu
		answered := func(k K) {
			mu.Lock()
			t, ok := sent[k]
			delete(sent, k)
			mu.Unlock()
			if !ok {
				return
			}
			h.Record(time.Since(t))
			acked.Add(1)
			<-slots
		}
		done := make(chan struct{})
		wg.Go(func() { // reader
			defer close(done)
			err := w.readLoop(func(frame []byte) { dr.read(w, frame, answered, fail) })
			if err != nil && time.Now().Before(deadline) {
				fail(fmt.Errorf("%s: %w", dr.closedErr, err))
			}
		})
		wg.Go(func() { // writer
			defer func() {
				// Wait for the outstanding answers, then stop the reader.
				pollUntil(ctx, 30*time.Second, time.Millisecond, func() bool { return len(slots) == 0 })
				w.close()
				<-done
			}()
			var frame []byte
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil && !failed.Load(); n++ {
				select {
				case slots <- struct{}{}:
				case <-done:
					return
				case <-ctx.Done():
					return
				}
				var k K
				frame, k = dr.request(ci, n, frame[:0])
				mu.Lock()
				sent[k] = time.Now()
				mu.Unlock()
				if err := w.write(ctx, frame); err != nil {
					fail(fmt.Errorf("%s: %w", dr.sendErr, err))
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return h, acked.Load(), firstErr
}
