package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
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
	return wsDriver[int64]{
		window: r.cfg.WSWindow,
		request: func(_, n int, frame []byte) ([]byte, int64) {
			id := int64(100 + n)
			frame = append(frame, `{"id":`...)
			frame = strconv.AppendInt(frame, id, 10)
			frame = append(frame, `,"publish":{"channel":"`...)
			frame = append(frame, channel...)
			frame = append(frame, `","data":{"type":"prompt","text":"append benchmark event","client_id":"c`...)
			frame = strconv.AppendInt(frame, id, 10)
			return append(frame, `"}}}`...), id
		},
		read: func(w *wsConn, frame []byte, answered func(int64), fail func(error)) {
			for _, line := range bytes.Split(frame, []byte("\n")) {
				if string(line) == "{}" {
					pong(w)
					continue
				}
				id, ok := scanInt(line, `{"id":`)
				if !ok || !bytes.HasPrefix(line, []byte(`{"id":`)) {
					continue // a push
				}
				if bytes.Contains(line, []byte(`"error":`)) {
					fail(fmt.Errorf("centrifugo publish: %.300s", line))
				}
				answered(id)
			}
		},
		sendErr: "send publish", closedErr: "centrifugo websocket closed",
	}.run(ctx, conns, d)
}

// pong answers a Centrifugo server's ping ("{}") on w.
func pong(w *wsConn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.write(ctx, []byte("{}"))
}
