package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// appendCentrifugo is appendWS against a peer Centrifugo: cfg.WSConns
// WebSockets, each subscribed to one fresh channel (so each receives every
// publication, as Atrium's connections receive every event) and keeping
// cfg.WSWindow publish commands in flight for d. A publish is acknowledged
// by its reply, after the publication is in the channel's history (the
// channel needs history and allow_publish_for_client; see
// docs/benchmarks.md). It returns the ack latencies and the number
// acknowledged.
func (r *runner) appendCentrifugo(ctx context.Context, peer *centrifugo, d time.Duration) (*Histogram, int64, error) {
	h := NewHistogram()
	var acked atomic.Int64
	channel := "atrium_bench_append_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	url := "ws" + peer.base[len("http"):] + "/connection/websocket"
	conns := make([]*wsConn, 0, r.cfg.WSConns)
	defer func() {
		for _, w := range conns {
			w.close()
		}
	}()
	for range r.cfg.WSConns {
		w, err := dialCentrifugo(ctx, url, channel)
		if err != nil {
			return nil, 0, err
		}
		conns = append(conns, w)
	}
	var errOnce sync.Once
	var firstErr error
	var failed atomic.Bool
	fail := func(err error) {
		failed.Store(true)
		errOnce.Do(func() { firstErr = err })
	}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, w := range conns {
		slots := make(chan struct{}, r.cfg.WSWindow)
		var mu sync.Mutex
		sent := map[int64]time.Time{} // guarded by mu
		done := make(chan struct{})
		pong := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = w.write(ctx, []byte("{}"))
		}
		wg.Go(func() { // reader
			defer close(done)
			err := w.readLoop(func(frame []byte) {
				for _, line := range bytes.Split(frame, []byte("\n")) {
					if string(line) == "{}" {
						pong()
						continue
					}
					id, ok := scanInt(line, `{"id":`)
					if !ok || !bytes.HasPrefix(line, []byte(`{"id":`)) {
						continue // a push
					}
					if bytes.Contains(line, []byte(`"error":`)) {
						fail(fmt.Errorf("centrifugo publish: %.300s", line))
					}
					mu.Lock()
					t, ok := sent[id]
					delete(sent, id)
					mu.Unlock()
					if !ok {
						continue
					}
					h.Record(time.Since(t))
					acked.Add(1)
					<-slots
				}
			})
			if err != nil && time.Now().Before(deadline) {
				fail(fmt.Errorf("centrifugo websocket closed: %w", err))
			}
		})
		wg.Go(func() { // writer
			defer func() {
				pollUntil(ctx, 30*time.Second, time.Millisecond, func() bool { return len(slots) == 0 })
				w.close()
				<-done
			}()
			var frame []byte
			for id := int64(100); time.Now().Before(deadline) && ctx.Err() == nil && !failed.Load(); id++ {
				select {
				case slots <- struct{}{}:
				case <-done:
					return
				case <-ctx.Done():
					return
				}
				frame = append(frame[:0], `{"id":`...)
				frame = strconv.AppendInt(frame, id, 10)
				frame = append(frame, `,"publish":{"channel":"`...)
				frame = append(frame, channel...)
				frame = append(frame, `","data":{"type":"prompt","text":"append benchmark event","client_id":"c`...)
				frame = strconv.AppendInt(frame, id, 10)
				frame = append(frame, `"}}}`...)
				mu.Lock()
				sent[id] = time.Now()
				mu.Unlock()
				if err := w.write(ctx, frame); err != nil {
					fail(fmt.Errorf("send publish: %w", err))
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
