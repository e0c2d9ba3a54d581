package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/session"
)

// dialCentrifugo connects to a Centrifugo server's WebSocket (JSON
// protocol), subscribes to channel and waits for both replies.
func dialCentrifugo(ctx context.Context, url, channel string) (*wsConn, error) {
	conn, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("dial centrifugo: %w", err)
	}
	conn.SetReadLimit(-1)
	w := &wsConn{conn: conn, buf: make([]byte, 1024)}
	cmd := fmt.Sprintf(`{"id":1,"connect":{}}`+"\n"+`{"id":2,"subscribe":{"channel":%q}}`, channel)
	if err := w.write(ctx, []byte(cmd)); err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("write to centrifugo: %w", err)
	}
	replies := 0
	for replies < 2 {
		frame, err := w.read(ctx)
		if err != nil {
			conn.CloseNow()
			return nil, fmt.Errorf("connect and subscribe: %w", err)
		}
		for _, line := range bytes.Split(frame, []byte("\n")) {
			if bytes.Contains(line, []byte(`"error"`)) {
				conn.CloseNow()
				return nil, fmt.Errorf("centrifugo: %.300s", line)
			}
			if bytes.HasPrefix(line, []byte(`{"id":`)) {
				replies++
			}
		}
	}
	return w, nil
}

// fanoutCentrifugo measures the same fan-out through a peer Centrifugo
// server: cfg.Watchers WebSockets (same library, same receiver process)
// subscribed to one fresh channel, events published over its HTTP API by
// as many connections as Atrium's REST producer uses. The publication's
// offset is the seq; its data, shaped like Atrium's event, holds the
// publish time. The server CPU is the Centrifugo process's when exactly one
// process named centrifugo runs on this machine.
func (r *runner) fanoutCentrifugo(ctx context.Context, peer *centrifugo) (_ fanOutcome, err error) {
	channel := "atrium_bench_fanout_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	set, err := r.newReceiverSet(ctx)
	if err != nil {
		return fanOutcome{}, err
	}
	defer func() { err = errors.Join(err, set.close()) }()
	t0 := time.Now()
	wsURL := "ws" + strings.TrimPrefix(peer.base, "http") + "/connection/websocket"
	if err := set.openCentrifugo(ctx, wsURL, channel, r.cfg.Watchers); err != nil {
		return fanOutcome{}, err
	}
	r.progress("fanout centrifugo: opened %d WebSockets in %s", r.cfg.Watchers, time.Since(t0).Round(time.Millisecond))
	f := &fanSide{name: "centrifugo", set: set, n: r.cfg.Watchers}
	if pid := findProcess("centrifugo"); pid > 0 {
		f.cpu = func() time.Duration { return pidCPU(pid) }
	} else {
		f.cpu = func() time.Duration { return 0 }
		r.progress("fanout centrifugo: no single centrifugo process found; its CPU is not measured")
	}
	prod := newCentrifugoProducer(peer, channel, restProducerConns)
	defer prod.close()
	f.prod = prod
	return r.measureSide(ctx, f, "centrifugo")
}

// centrifugoProducer publishes over Centrifugo's HTTP API from a pool of
// workers, each keeping one connection.
type centrifugoProducer struct {
	peer    *centrifugo
	channel string
	http    *http.Client
	jobs    chan struct{}
	pending atomic.Int64
	seq     atomic.Int64
	errs    atomic.Int64
	wg      sync.WaitGroup
}

func newCentrifugoProducer(peer *centrifugo, channel string, workers int) *centrifugoProducer {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = workers
	p := &centrifugoProducer{peer: peer, channel: channel, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}, jobs: make(chan struct{}, 8192)}
	for range workers {
		p.wg.Go(func() {
			for range p.jobs {
				if off, err := p.publish(); err != nil {
					p.errs.Add(1)
				} else {
					storeMax(&p.seq, off)
				}
				p.pending.Add(-1)
			}
		})
	}
	return p
}

// publish sends one publication stamped with the current time and returns
// its offset.
func (p *centrifugoProducer) publish() (int64, error) {
	body := fmt.Appendf(nil, `{"channel":%q,"data":{"seq":0,"epoch":"benchepoch","time":"%s","kind":"message","by":"bench","data":{"text":"fan-out benchmark event","client_id":""}}}`,
		p.channel, time.Now().UTC().Format(session.TimeLayout))
	req, err := http.NewRequest("POST", p.peer.base+"/api/publish", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-API-Key", p.peer.apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	off, ok := scanInt(b, `"offset":`)
	if resp.StatusCode != 200 || !ok {
		return 0, fmt.Errorf("centrifugo publish: %s %.200s", resp.Status, b)
	}
	return off, nil
}

func (p *centrifugoProducer) fire() bool {
	select {
	case p.jobs <- struct{}{}:
		p.pending.Add(1)
		return true
	default:
		return false
	}
}

func (p *centrifugoProducer) flush(ctx context.Context) error {
	if !pollUntil(ctx, 60*time.Second, time.Millisecond, func() bool { return p.pending.Load() <= 0 }) {
		return fmt.Errorf("publications still in flight after 60s: %d", p.pending.Load())
	}
	return nil
}

func (p *centrifugoProducer) lastSeq() int64 { return p.seq.Load() }
func (p *centrifugoProducer) errors() int64  { return p.errs.Load() }

func (p *centrifugoProducer) close() {
	close(p.jobs)
	p.wg.Wait()
	p.http.CloseIdleConnections()
}

// findProcess returns the pid of the only process whose command name is
// name, or 0 when there is none or more than one.
func findProcess(name string) int {
	stats, _ := filepath.Glob("/proc/[0-9]*/comm")
	pid := 0
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		if pid != 0 {
			return 0
		}
		pid, _ = strconv.Atoi(filepath.Base(filepath.Dir(p)))
	}
	return pid
}

// pidCPU returns the user+system CPU time of process pid (0 if unreadable),
// from /proc/PID/stat in clock ticks of 10 ms.
func pidCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) start at
	// state; utime and stime are fields 14 and 15 of the whole line.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+s) * 10 * time.Millisecond
}
