package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// sink collects what every receiver of a set saw.
type sink struct {
	hist      atomic.Pointer[Histogram] // the current phase's latencies
	delivered atomic.Int64
	gaps      atomic.Int64
}

// receiver is one watcher (WebSocket) or subscriber (raw NATS).
type receiver struct {
	last   atomic.Int64 // highest seq received
	closed atomic.Bool  // the connection ended
}

// onFrame records an event frame's commit-to-receive latency. Both clocks
// are this machine's wall clock, whichever process reads them.
func (r *receiver) onFrame(s *sink, frame []byte) {
	if body, ok := bytes.CutPrefix(frame, []byte(session.EventsFrameHead)); ok {
		r.onEvents(s, body)
		return
	}
	seq, t, ok := parseEventFrame(frame)
	if !ok {
		return
	}
	r.record(s, seq, t)
}

// record counts one delivery of event seq committed at t.
func (r *receiver) record(s *sink, seq int64, t time.Time) {
	s.hist.Load().Record(time.Since(t))
	s.delivered.Add(1)
	if last := r.last.Load(); last != 0 && seq != last+1 {
		s.gaps.Add(1)
	}
	r.last.Store(seq)
}

// onEvents records each event of an events frame (atrium.v1+batch; b
// follows session.EventsFrameHead), scanning like parseEventsFrame. A frame
// that does not parse counts as a gap.
func (r *receiver) onEvents(s *sink, b []byte) {
	for len(b) > 0 && b[0] == '{' {
		end := objectEnd(b)
		if end < 0 {
			s.gaps.Add(1)
			return
		}
		seq, ok1 := scanInt(b[:end], `"seq":`)
		t, ok2 := scanTime(b[:end])
		if !ok1 || !ok2 {
			s.gaps.Add(1)
			return
		}
		r.record(s, seq, t)
		b = b[end:]
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		}
	}
}

// onCentrifugo records the publications of a Centrifugo JSON-protocol
// message: newline-separated replies and pushes; a push's publication holds
// its offset (the seq) and, in its data, the publish time. An empty
// command ({}) is the server's ping: pong answers it.
func (r *receiver) onCentrifugo(s *sink, frame []byte, pong func()) {
	for len(frame) > 0 {
		line := frame
		if i := bytes.IndexByte(frame, '\n'); i >= 0 {
			line, frame = frame[:i], frame[i+1:]
		} else {
			frame = nil
		}
		if string(line) == "{}" {
			pong()
			continue
		}
		if !bytes.HasPrefix(line, []byte(`{"push":`)) || !bytes.Contains(line, []byte(`"pub":`)) {
			continue
		}
		seq, ok1 := scanInt(line, `"offset":`)
		t, ok2 := scanTime(line)
		if !ok1 || !ok2 {
			s.gaps.Add(1)
			continue
		}
		r.record(s, seq, t)
	}
}

// recvStatus is what a set of receivers reports.
type recvStatus struct {
	Delivered int64 `json:"delivered"`
	Gaps      int64 `json:"gaps"`
	Total     int   `json:"total"`
	Live      int   `json:"live"`
	// MinLast is the smallest last seq of the live receivers.
	MinLast int64 `json:"min_last"`
	// CPU is the CPU time of the process holding the receivers when they
	// live in a child; zero in this process.
	CPU time.Duration `json:"cpu_ns"`
	// Reads is the read system calls of that process, like CPU.
	Reads int64 `json:"syscr"`
}

// receiverSet is the receivers of a fan-out, in this process (localSet) or
// in a child process (childSet).
type receiverSet interface {
	// openWS opens n WebSocket watchers of a session resuming after seq.
	openWS(ctx context.Context, base, user string, id session.ID, after session.Seq, n int) error
	// openNATS opens n NATS connections subscribed to subject.
	openNATS(ctx context.Context, url, subject string, n int) error
	// openCentrifugo opens n Centrifugo WebSocket connections (url
	// ws://host:port/connection/websocket) subscribed to channel.
	openCentrifugo(ctx context.Context, url, channel string, n int) error
	// startPhase starts a new latency histogram.
	startPhase() error
	status() (recvStatus, error)
	// histogram returns the latencies since startPhase.
	histogram() (*Histogram, error)
	close() error
}

// localSet holds receivers in this process.
type localSet struct {
	sink      sink
	mu        sync.Mutex
	receivers []*receiver // guarded by mu
	closers   []func()    // guarded by mu
	wg        sync.WaitGroup
	inChild   bool // report this process's CPU time in status
}

func newLocalSet() *localSet {
	s := &localSet{}
	s.sink.hist.Store(NewHistogram())
	return s
}

func (s *localSet) add(rc *receiver, closer func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.receivers = append(s.receivers, rc)
	s.closers = append(s.closers, closer)
}

// openParallel runs open for i in [0,n) a few at a time and returns the
// first error.
func openParallel(ctx context.Context, n int, open func(ctx context.Context, i int) error) error {
	sem := make(chan struct{}, dialConcurrency)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i := range n {
		sem <- struct{}{}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := open(dctx, i); err != nil {
				once.Do(func() { first = err })
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

func (s *localSet) openWS(ctx context.Context, base, user string, id session.ID, after session.Seq, n int) error {
	c := newClient(base, user)
	return openParallel(ctx, n, func(ctx context.Context, i int) error {
		w, err := c.dialWSWith(ctx, id, after, session.SubprotocolBatch, session.Subprotocol)
		if err != nil {
			return fmt.Errorf("open watcher %d: %w", i, err)
		}
		rc := &receiver{}
		rc.last.Store(after)
		s.add(rc, w.close)
		s.wg.Go(func() {
			defer rc.closed.Store(true)
			_ = w.readLoop(func(frame []byte) { rc.onFrame(&s.sink, frame) })
		})
		return nil
	})
}

func (s *localSet) openCentrifugo(ctx context.Context, url, channel string, n int) error {
	return openParallel(ctx, n, func(ctx context.Context, i int) error {
		w, err := dialCentrifugo(ctx, url, channel)
		if err != nil {
			return fmt.Errorf("centrifugo subscriber %d: %w", i, err)
		}
		rc := &receiver{}
		s.add(rc, w.close)
		pong := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = w.write(ctx, []byte("{}"))
		}
		s.wg.Go(func() {
			defer rc.closed.Store(true)
			_ = w.readLoop(func(frame []byte) { rc.onCentrifugo(&s.sink, frame, pong) })
		})
		return nil
	})
}

func (s *localSet) openNATS(ctx context.Context, url, subject string, n int) error {
	return openParallel(ctx, n, func(ctx context.Context, i int) error {
		rc := &receiver{}
		nc, err := nats.Connect(url, nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { rc.closed.Store(true) }))
		if err != nil {
			return fmt.Errorf("nats subscriber %d: %w", i, err)
		}
		if _, err := nc.Subscribe(subject, func(m *nats.Msg) { rc.onFrame(&s.sink, m.Data) }); err != nil {
			nc.Close()
			return fmt.Errorf("nats subscriber %d: %w", i, err)
		}
		if err := nc.FlushWithContext(ctx); err != nil {
			nc.Close()
			return fmt.Errorf("nats subscriber %d: %w", i, err)
		}
		s.add(rc, nc.Close)
		return nil
	})
}

func (s *localSet) startPhase() error {
	s.sink.hist.Store(NewHistogram())
	return nil
}

func (s *localSet) status() (recvStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := recvStatus{Delivered: s.sink.delivered.Load(), Gaps: s.sink.gaps.Load(), Total: len(s.receivers), MinLast: -1}
	for _, rc := range s.receivers {
		if rc.closed.Load() {
			continue
		}
		st.Live++
		if l := rc.last.Load(); st.MinLast < 0 || l < st.MinLast {
			st.MinLast = l
		}
	}
	if s.inChild {
		st.CPU = processCPU()
		st.Reads = syscalls(0).reads
	}
	return st, nil
}

func (s *localSet) histogram() (*Histogram, error) { return s.sink.hist.Load(), nil }

func (s *localSet) close() error {
	s.mu.Lock()
	closers := s.closers
	s.closers = nil
	s.mu.Unlock()
	for _, c := range closers {
		c()
	}
	s.wg.Wait()
	return nil
}

// processCPU returns the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childSet holds receivers in a child process running RunWatchers, so that
// this process's CPU time and memory are the server's alone.
type childSet struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
	mu     sync.Mutex // one request at a time
}

func startChild(ctx context.Context, start func(ctx context.Context, args ...string) *exec.Cmd) (*childSet, error) {
	c := &childSet{cmd: start(ctx)}
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("child stdin: %w", err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("child stdout: %w", err)
	}
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start receiver process: %w", err)
	}
	c.out = bufio.NewScanner(stdout)
	c.out.Buffer(make([]byte, 64<<10), 16<<20)
	return c, nil
}

// request sends one command line and returns the answer, which starts with
// "ok" (the rest is returned) or "error".
func (c *childSet) request(line string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		return "", fmt.Errorf("command receiver process: %w: %s", err, bytes.TrimSpace(c.stderr.Bytes()))
	}
	if !c.out.Scan() {
		return "", fmt.Errorf("receiver process ended: %s", bytes.TrimSpace(c.stderr.Bytes()))
	}
	ans := c.out.Text()
	if rest, ok := strings.CutPrefix(ans, "ok"); ok {
		return strings.TrimSpace(rest), nil
	}
	return "", fmt.Errorf("receiver process: %s", ans)
}

func (c *childSet) openWS(_ context.Context, base, user string, id session.ID, after session.Seq, n int) error {
	_, err := c.request(fmt.Sprintf("ws %d %s %s %s %d", n, base, user, id, after))
	return err
}

func (c *childSet) openNATS(_ context.Context, url, subject string, n int) error {
	_, err := c.request(fmt.Sprintf("nats %d %s %s", n, url, subject))
	return err
}

func (c *childSet) openCentrifugo(_ context.Context, url, channel string, n int) error {
	_, err := c.request(fmt.Sprintf("centrifugo %d %s %s", n, url, channel))
	return err
}

func (c *childSet) startPhase() error {
	_, err := c.request("phase")
	return err
}

func (c *childSet) status() (recvStatus, error) {
	var st recvStatus
	ans, err := c.request("status")
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal([]byte(ans), &st)
}

func (c *childSet) histogram() (*Histogram, error) {
	ans, err := c.request("hist")
	if err != nil {
		return nil, err
	}
	var snap histSnapshot
	if err := json.Unmarshal([]byte(ans), &snap); err != nil {
		return nil, fmt.Errorf("decode histogram: %w", err)
	}
	return snap.histogram(), nil
}

// close ends the child (end of input closes its connections) and waits.
func (c *childSet) close() error {
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		return fmt.Errorf("receiver process: %w: %s", err, bytes.TrimSpace(c.stderr.Bytes()))
	}
	return nil
}

// RunWatchers is the child process that holds benchmark receivers, so that
// the parent process measures only the server. It reads one command per line
// from in and answers each with one line on out, "ok …" or "error …":
//
//	ws N URL USER SESSION AFTER   open N WebSocket watchers resuming after AFTER
//	nats N URL SUBJECT            open N NATS connections subscribed to SUBJECT
//	centrifugo N URL CHANNEL      open N Centrifugo WebSockets subscribed to CHANNEL
//	phase                         start a new latency histogram
//	status                        counters as JSON
//	hist                          the latency histogram as JSON
//
// End of input closes every connection and returns.
func RunWatchers(ctx context.Context, in io.Reader, out io.Writer) error {
	set := newLocalSet()
	set.inChild = true
	defer set.close()
	lines := bufio.NewScanner(in)
	reply := func(format string, args ...any) error {
		_, err := fmt.Fprintf(out, format+"\n", args...)
		return err
	}
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) == 0 {
			continue
		}
		var err error
		var ans any
		switch {
		case f[0] == "ws" && len(f) == 6:
			var n int
			var after int64
			n, err = strconv.Atoi(f[1])
			if err == nil {
				after, err = strconv.ParseInt(f[5], 10, 64)
			}
			if err == nil {
				err = set.openWS(ctx, f[2], f[3], session.ID(f[4]), after, n)
			}
		case f[0] == "nats" && len(f) == 4:
			var n int
			if n, err = strconv.Atoi(f[1]); err == nil {
				err = set.openNATS(ctx, f[2], f[3], n)
			}
		case f[0] == "centrifugo" && len(f) == 4:
			var n int
			if n, err = strconv.Atoi(f[1]); err == nil {
				err = set.openCentrifugo(ctx, f[2], f[3], n)
			}
		case f[0] == "phase":
			err = set.startPhase()
		case f[0] == "status":
			ans, err = set.status()
		case f[0] == "hist":
			ans = set.sink.hist.Load().snapshot()
		default:
			err = fmt.Errorf("unknown command %q", lines.Text())
		}
		if err != nil {
			if rerr := reply("error %s", strings.ReplaceAll(err.Error(), "\n", " ")); rerr != nil {
				return rerr
			}
			continue
		}
		if ans == nil {
			err = reply("ok")
		} else {
			b, _ := json.Marshal(ans)
			err = reply("ok %s", b)
		}
		if err != nil {
			return err
		}
	}
	if err := lines.Err(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
