package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Targets of acknowledged events per second into one session (issue 22):
// over WebSocket, where a connection keeps prompts in flight, and over
// REST, one request per prompt.
const (
	appendTarget     = 20_000
	appendRESTTarget = 10_000
)

// append measures durable appends into one session: every prompt is
// acknowledged only after its event is committed.
func (r *runner) append(ctx context.Context) (_ []Result, err error) {
	d, err := r.startServer(ctx, "append", time.Hour)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()

	var out []Result
	for _, mode := range r.cfg.AppendVia {
		s, err := d.c.createSession(ctx, "bench append "+mode, holdTurn())
		if err != nil {
			return out, err
		}
		if err := startHold(ctx, d.c, s.ID); err != nil {
			return out, err
		}
		run := r.appendREST
		measure := fmt.Sprintf("durable append, REST, %d senders", r.cfg.Senders)
		target := float64(appendRESTTarget)
		if mode == "ws" {
			run = r.appendWS
			measure = fmt.Sprintf("durable append, WebSocket, %d conns × %d in flight", r.cfg.WSConns, r.cfg.WSWindow)
			target = appendTarget
		}
		if _, _, err := run(ctx, d.c, s.ID, min(time.Second, r.cfg.Duration)); err != nil { // warm-up
			return out, err
		}
		r.progress("append %s: sending for %s", mode, r.cfg.Duration)
		cpu0 := processCPU()
		h, n, err := run(ctx, d.c, s.ID, r.cfg.Duration)
		if err != nil {
			return out, err
		}
		cpu := processCPU() - cpu0
		rate := float64(n) / r.cfg.Duration.Seconds()
		row := latencyRow(Result{Scenario: ScenarioAppend, Measure: measure, Unit: "events/s", Target: "≥ " + fmtCount(target) + " events/s", Value: rate}, h)
		row.Met = met(rate >= target)
		row.Note = "median/p99: prompt → ack (durable)"
		if n > 0 {
			row.Note = joinNote(row.Note, fmt.Sprintf("process CPU %.1f µs/event (server and clients)", perEvent(cpu, n)))
		}
		r.progress("append %s: %s acknowledged events/s, ack p50 %s p99 %s", mode, fmtCount(rate), fmtMS(row.Median), fmtMS(row.P99))
		if mode == "ws" && r.cfg.PeerCentrifugo != "" {
			prow, ratio, err := r.appendPeer(ctx, cpu, n)
			if err != nil {
				return out, err
			}
			row.Note = joinNote(row.Note, ratio)
			out = append(out, row, prow)
			continue
		}
		out = append(out, row)
	}
	return out, nil
}

func perEvent(cpu time.Duration, n int64) float64 {
	return float64(cpu) / float64(time.Microsecond) / float64(n)
}

// appendPeer runs appendCentrifugo right after Atrium's WebSocket run
// (whose process CPU was atriumCPU for n events) and compares: Centrifugo's
// server CPU per event, and Atrium's server CPU estimated as its process
// CPU less this process's CPU per event during the Centrifugo run (the
// same client work: frames written and read).
func (r *runner) appendPeer(ctx context.Context, atriumCPU time.Duration, n int64) (_ Result, ratio string, _ error) {
	peer, err := newCentrifugo(r.cfg.PeerCentrifugo)
	if err != nil {
		return Result{}, "", err
	}
	pid := listenerPID(peer.base) // the peer itself, when other Centrifugos run here too
	if pid == 0 {
		pid = findProcess("centrifugo")
	}
	if _, _, err := r.appendCentrifugo(ctx, peer, min(time.Second, r.cfg.Duration)); err != nil { // warm-up
		return Result{}, "", err
	}
	r.progress("append centrifugo: publishing for %s", r.cfg.Duration)
	c0, s0 := processCPU(), pidCPU(pid)
	h, cn, err := r.appendCentrifugo(ctx, peer, r.cfg.Duration)
	if err != nil {
		return Result{}, "", err
	}
	clientCPU, serverCPU := processCPU()-c0, pidCPU(pid)-s0
	rate := float64(cn) / r.cfg.Duration.Seconds()
	row := latencyRow(Result{Scenario: ScenarioAppend, Measure: fmt.Sprintf("Centrifugo publish, WebSocket, %d conns × %d in flight", r.cfg.WSConns, r.cfg.WSWindow), Unit: "events/s", Value: rate}, h)
	row.Note = "median/p99: publish → reply (history in memory)"
	r.progress("append centrifugo: %s acknowledged publications/s, p50 %s p99 %s", fmtCount(rate), fmtMS(row.Median), fmtMS(row.P99))
	if cn == 0 || n == 0 {
		return row, "", nil
	}
	client := perEvent(clientCPU, cn)
	row.Note = joinNote(row.Note, fmt.Sprintf("clients %.1f µs/event", client))
	if pid > 0 {
		srv := perEvent(serverCPU, cn)
		atrium := perEvent(atriumCPU, n) - client
		row.Note = joinNote(row.Note, fmt.Sprintf("server CPU %.1f µs/event", srv))
		ratio = fmt.Sprintf("server ≈ %.1f µs/event (process less the clients' %.1f of the Centrifugo run) = %.2f× Centrifugo's %.1f (target ≤ 2); rate %.2f× Centrifugo's",
			atrium, client, atrium/srv, srv, float64(n)/float64(cn))
	}
	return row, ratio, nil
}

// appendREST posts prompts from cfg.Senders goroutines for d and returns
// the ack latencies and the number acknowledged.
func (r *runner) appendREST(ctx context.Context, c *client, id session.ID, d time.Duration) (*Histogram, int64, error) {
	h := NewHistogram()
	var acked atomic.Int64
	var errOnce sync.Once
	var firstErr error
	body := promptBody("append benchmark event")
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range r.cfg.Senders {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t := time.Now()
				if _, err := c.prompt(ctx, id, body); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				h.Record(time.Since(t))
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return h, acked.Load(), firstErr
}

// appendWS keeps cfg.WSWindow prompts in flight on each of cfg.WSConns
// WebSockets for d and returns the ack latencies and the number
// acknowledged. Each connection also receives every event, as any client
// of the session does (in events frames when several come together).
func (r *runner) appendWS(ctx context.Context, c *client, id session.ID, d time.Duration) (*Histogram, int64, error) {
	cur, err := c.getSession(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	conns := make([]*wsConn, 0, r.cfg.WSConns)
	defer func() {
		for _, w := range conns {
			w.close()
		}
	}()
	for range r.cfg.WSConns {
		// Offering atrium.v1+batch as the Go client does (gateway/client):
		// events that reach a connection together come in one events
		// frame, as Centrifugo's pushes do in one WebSocket message.
		w, err := c.dialWSWith(ctx, id, cur.LastSeq, session.SubprotocolBatch, session.Subprotocol)
		if err != nil {
			return nil, 0, err
		}
		conns = append(conns, w)
	}
	// Each run's client_ids are its own: a run reusing the warm-up's would
	// have those prompts acknowledged as retries, never appended.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	return wsDriver[string]{
		window: r.cfg.WSWindow,
		request: func(ci, n int, frame []byte) ([]byte, string) {
			cid := run + "-c" + strconv.Itoa(ci) + "-" + strconv.Itoa(n)
			frame = append(frame, `{"type":"prompt","text":"append benchmark event","client_id":"`...)
			frame = append(frame, cid...)
			return append(frame, `"}`...), cid
		},
		read: func(_ *wsConn, frame []byte, answered func(string), fail func(error)) {
			cid, _, isAck := parseAckFrame(frame)
			switch {
			case isAck:
			case bytes.HasPrefix(frame, []byte(`{"type":"error"`)):
				var ef session.ErrorFrame
				_ = json.Unmarshal(frame, &ef)
				fail(fmt.Errorf("prompt over WebSocket: %s: %s", ef.Code, ef.Message))
				cid = ef.ClientID
			default:
				return
			}
			answered(cid)
		},
		sendErr: "send prompt", closedErr: "websocket closed",
	}.run(ctx, conns, d)
}
