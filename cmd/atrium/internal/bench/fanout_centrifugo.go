package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
// publish time. The server CPU is that of the process listening on the
// peer's port on this machine (or else of the only process named
// centrifugo).
func (r *runner) fanoutCentrifugo(ctx context.Context, peer *centrifugo, u turn) (_ fanOutcome, err error) {
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
	f := &fanSide{name: "centrifugo", set: set, n: r.cfg.Watchers, turn: u}
	pid := listenerPID(peer.base)
	if pid == 0 {
		pid = findProcess("centrifugo")
	}
	if pid > 0 {
		f.cpu = func() time.Duration { return pidCPU(pid) }
		f.writes = func() int64 { return syscalls(pid).writes }
	} else {
		f.cpu = func() time.Duration { return 0 }
		f.writes = func() int64 { return 0 }
		r.progress("fanout centrifugo: no process found listening on %s, nor a single one named centrifugo; its CPU is not measured", peer.base)
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

// listenerPID returns the pid of the process listening on base's TCP port
// on this machine (from /proc/net/tcp and tcp6 and the processes' open
// files), or 0.
func listenerPID(base string) int {
	u, err := url.Parse(base)
	if err != nil {
		return 0
	}
	port, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, _ := os.ReadFile(name)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// local_address is HEXIP:HEXPORT, st 0A is LISTEN.
			if len(f) < 10 || f[3] != "0A" {
				continue
			}
			_, hexPort, ok := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && p == port {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
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

// ioCalls is a process's read and write system calls so far.
type ioCalls struct{ reads, writes int64 }

// syscalls returns the read and write system calls of process pid (0: this
// process) so far, from /proc/PID/io (syscr, syscw); zero if unreadable.
func syscalls(pid int) ioCalls {
	name := "/proc/self/io"
	if pid > 0 {
		name = "/proc/" + strconv.Itoa(pid) + "/io"
	}
	var c ioCalls
	b, err := os.ReadFile(name)
	if err != nil {
		return c
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "syscr":
			c.reads = n
		case "syscw":
			c.writes = n
		}
	}
	return c
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
