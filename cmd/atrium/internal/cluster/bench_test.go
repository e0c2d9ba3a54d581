package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/cmd/atrium/internal/bench"
	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// The benchmarks print figures (b.ReportMetric and b.Logf); they are not
// pass/fail timing tests. docs/benchmarks.md ("Scale-out (issue 5)") records
// them with the command that produced them.

// BenchmarkTakeover measures the time from kill -9 of a session's owner to
// the first prompt acknowledged by the other node, with the server's default
// lease TTL: lease expiry, placement, checkpoint restore and stream replay,
// and the commit. Each iteration kills one node and starts it again.
func BenchmarkTakeover(b *testing.B) {
	c := StartCluster(b, Options{LeaseTTL: -1})
	var total, toLease, maxTotal time.Duration
	for i := 0; i < b.N; i++ {
		s := c.CreateSession(i%2, fmt.Sprintf("takeover %d", i), shellHarness)
		// A history worth replaying: a turn of 500 output lines.
		c.SendUntilAcked(0, s.ID, streamLines(500, ""))
		w := c.Watch(0, s.ID, 0)
		w.WaitFor(b, "turn_finished", turnFinished)
		w.Close()
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		lease, ok, err := c.LeaseOf(ctx, s.ID)
		cancel()
		if err != nil || !ok {
			b.Fatalf("lease of %s: held %v, %v", s.ID, ok, err)
		}
		owner := c.Node(lease.Node)

		t0 := time.Now()
		owner.Kill()
		_, _, ackAt := c.SendUntilAcked(1, s.ID, "echo taken over")
		d := ackAt.Sub(t0)
		next := c.WaitOwner(s.ID, owner.Name)
		if created := next.Acquired; !created.IsZero() {
			toLease += created.Sub(t0)
			b.Logf("takeover %d: %v (new lease after %v, then restore, replay and commit %v)", i, d.Round(time.Millisecond),
				created.Sub(t0).Round(time.Millisecond), ackAt.Sub(created).Round(time.Millisecond))
		} else {
			b.Logf("takeover %d: %v", i, d.Round(time.Millisecond))
		}
		total += d
		maxTotal = max(maxTotal, d)
		owner.Restart()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/takeover")
	b.ReportMetric(maxTotal.Seconds(), "max-s")
	b.ReportMetric(toLease.Seconds()/float64(b.N), "s-to-new-lease")
	b.ReportMetric(0, "ns/op")
}

// Fan-out benchmark sizes, as in `atrium bench` (package bench).
const (
	fanWatchers = bench.DefaultWatchers
	fanRate     = bench.DefaultRate
	fanDuration = bench.DefaultDuration
	fanDrain    = 15 * time.Second
)

// BenchmarkCrossGatewayFanout measures commit→receive latency of one
// session's events at 1,000 WebSocket watchers, all on one gateway and then
// split across two, while prompts arrive at 100/s — the measure of `atrium
// bench`'s fan-out scenario, across processes and NATS servers.
func BenchmarkCrossGatewayFanout(b *testing.B) {
	if _, err := bench.RaiseFileLimit(); err != nil {
		b.Logf("raise the open-file limit: %v", err)
	}
	c := StartCluster(b, Options{})
	for i := 0; i < b.N; i++ {
		var p99 [3]float64
		for _, gws := range []int{1, 2} {
			h := c.fanout(b, gws)
			p99[gws] = float64(h.Quantile(0.99)) / 1e6
			b.ReportMetric(float64(h.Quantile(0.5))/1e6, fmt.Sprintf("p50-ms-%dgw", gws))
			b.ReportMetric(p99[gws], fmt.Sprintf("p99-ms-%dgw", gws))
		}
		b.ReportMetric(p99[2]/p99[1], "p99-2gw/1gw")
		b.ReportMetric(0, "ns/op")
	}
}

// fanout runs one fan-out measure with the watchers split across gws
// gateways and returns the latencies.
func (c *Cluster) fanout(b *testing.B, gws int) *bench.Histogram {
	b.Helper()
	// A turn that never ends holds the queue: each prompt then makes
	// exactly one event.
	s := c.CreateSession(0, "fan-out bench", session.Harness{Command: []string{"sleep", "86400"}})
	w := c.Watch(0, s.ID, 0)
	c.SendUntilAcked(0, s.ID, "hold")
	w.WaitFor(b, "turn_started", func(evs []recorded) bool { return countKind(evs, session.KindTurnStarted) > 0 })
	w.Close()
	after := c.History(0, s.ID)
	from := after[len(after)-1].Seq

	set := &receivers{}
	set.hist.Store(bench.NewHistogram())
	defer set.close()
	t0 := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var dialErr atomic.Value
	for i := range fanWatchers {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := set.open(c.Gateways[i%gws].URL, s.ID, from); err != nil {
				dialErr.CompareAndSwap(nil, err)
			}
		})
	}
	wg.Wait()
	if err, _ := dialErr.Load().(error); err != nil {
		b.Fatalf("open watchers: %v", err)
	}
	b.Logf("opened %d watchers on %d gateway(s) in %v", fanWatchers, gws, time.Since(t0).Round(time.Millisecond))

	// Warm up, then measure.
	last := c.produce(b, s.ID, fanRate, time.Second)
	set.waitAll(b, last)
	set.hist.Store(bench.NewHistogram())
	set.delivered.Store(0)
	last = c.produce(b, s.ID, fanRate, fanDuration)
	set.waitAll(b, last)
	h := set.hist.Load()
	b.Logf("gateways=%d: %d deliveries, p50 %.1f ms, p99 %.1f ms, max %.1f ms, %d gaps", gws, set.delivered.Load(),
		float64(h.Quantile(0.5))/1e6, float64(h.Quantile(0.99))/1e6, float64(h.Max())/1e6, set.gaps.Load())
	if g := set.gaps.Load(); g > 0 {
		b.Errorf("%d seq gaps seen by watchers", g)
	}
	return h
}

// produce sends prompts at rate for d through both gateways and returns the
// highest acknowledged seq.
func (c *Cluster) produce(b *testing.B, id session.ID, rate int, d time.Duration) session.Seq {
	b.Helper()
	clients := make([]*client.Client, len(c.Gateways))
	for i := range clients {
		clients[i] = c.Client(i)
	}
	jobs := make(chan int, 1024)
	var maxSeq atomic.Int64
	var errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range jobs {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				seq, err := clients[i%len(clients)].Send(ctx, id, "fan-out benchmark event", "")
				cancel()
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				for {
					cur := maxSeq.Load()
					if seq <= cur || maxSeq.CompareAndSwap(cur, seq) {
						break
					}
				}
			}
		})
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; time.Duration(i)*interval < d; i++ {
		if wait := time.Duration(i)*interval - time.Since(start); wait > 0 {
			time.Sleep(wait) // Pacing the producer, not synchronising.
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if n := errs.Load(); n > 0 {
		// A figure, not a failure: the machine could not keep up.
		b.Logf("%d prompts failed; first: %v", n, firstErr.Load())
	}
	return maxSeq.Load()
}

// receivers are raw WebSocket watchers recording commit→receive latency.
type receivers struct {
	hist      atomic.Pointer[bench.Histogram] // the current phase's
	delivered atomic.Int64
	gaps      atomic.Int64

	mu    sync.Mutex
	conns []*websocket.Conn // guarded by mu
	lasts []*atomic.Int64   // guarded by mu
	wg    sync.WaitGroup
}

func (r *receivers) open(base string, id session.ID, after session.Seq) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(base, "http") + "/v1/sessions/" + url.PathEscape(string(id)) + "/ws?after=" + strconv.FormatInt(after, 10)
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPHeader:   http.Header{"Authorization": {"Bearer dev:" + testUser}},
		Subprotocols: []string{session.Subprotocol},
	})
	if err != nil {
		return fmt.Errorf("dial %s: %w", u, err)
	}
	conn.SetReadLimit(-1)
	last := new(atomic.Int64)
	last.Store(after)
	r.mu.Lock()
	r.conns = append(r.conns, conn)
	r.lasts = append(r.lasts, last)
	r.mu.Unlock()
	r.wg.Go(func() {
		for {
			_, msg, err := conn.Read(context.Background())
			if err != nil {
				return
			}
			var f struct {
				Type  string `json:"type"`
				Event struct {
					Seq  session.Seq  `json:"seq"`
					Time session.Time `json:"time"`
				} `json:"event"`
			}
			if json.Unmarshal(msg, &f) != nil || f.Type != session.FrameEvent {
				continue
			}
			r.hist.Load().Record(time.Since(f.Event.Time.Time))
			r.delivered.Add(1)
			if f.Event.Seq != last.Load()+1 {
				r.gaps.Add(1)
			}
			last.Store(f.Event.Seq)
		}
	})
	return nil
}

// waitAll waits until every watcher has seen seq.
func (r *receivers) waitAll(b *testing.B, seq session.Seq) {
	b.Helper()
	deadline := time.Now().Add(fanDrain)
	for {
		behind := 0
		r.mu.Lock()
		for _, l := range r.lasts {
			if l.Load() < seq {
				behind++
			}
		}
		r.mu.Unlock()
		if behind == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d watchers have not seen seq %d after %v", behind, seq, fanDrain)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *receivers) close() {
	r.mu.Lock()
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	for _, c := range conns {
		c.CloseNow()
	}
	r.wg.Wait()
}

// createMany creates n sessions through both gateways, 64 at a time, and
// returns their ids and the time it took.
func (c *Cluster) createMany(b testing.TB, n int, h session.Harness) ([]session.ID, time.Duration) {
	b.Helper()
	clients := []*client.Client{c.Client(0), c.Client(1)}
	ids := make([]session.ID, n)
	var wg sync.WaitGroup
	var first atomic.Value
	var retries atomic.Int64
	sem := make(chan struct{}, 64)
	t0 := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			req := client.CreateRequest{Title: "bench", Harness: h}
			s, err := clients[i%2].CreateSession(ctx, req)
			for try := 0; err != nil && !client.Terminal(err) && try < 3; try++ {
				// unavailable says retry; a client does.
				retries.Add(1)
				s, err = clients[i%2].CreateSession(ctx, req)
			}
			if err != nil {
				first.CompareAndSwap(nil, fmt.Errorf("create session %d: %w", i, err))
				return
			}
			ids[i] = s.ID
		})
	}
	wg.Wait()
	d := time.Since(t0)
	if err, _ := first.Load().(error); err != nil {
		b.Fatal(err)
	}
	if r := retries.Load(); r > 0 {
		b.Logf("%d creations were retried after a retryable error", r)
	}
	return ids, d
}

// waitHibernated waits until none of ids holds a lease.
func (c *Cluster) waitHibernated(b testing.TB, ids []session.ID) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		leases, err := c.Leases(ctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		held := 0
		for _, id := range ids {
			if _, ok := leases[string(id)]; ok {
				held++
			}
		}
		if held == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d sessions still hold a lease after 5m: they did not hibernate", held, len(ids))
		}
		time.Sleep(250 * time.Millisecond) // Polling interval.
	}
}

// perNode counts ids' leases per node.
func (c *Cluster) perNode(b testing.TB, ids []session.ID) map[string]int {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	leases, err := c.Leases(ctx)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int{}
	for _, id := range ids {
		if l, ok := leases[string(id)]; ok {
			out[l.Node]++
		}
	}
	return out
}

// cpuTimes returns the CPU time (user + system) each atrium process and
// this test process (the NATS servers, the proxies in front of the nodes,
// the clients) have used so far.
func (c *Cluster) cpuTimes(b testing.TB) map[string]time.Duration {
	b.Helper()
	out := map[string]time.Duration{}
	for _, p := range append(append([]*Proc{}, c.Gateways...), c.Nodes...) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
		if err != nil {
			b.Fatalf("cpu time of %s: %v", p.Name, err)
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th, in clock ticks (100 per second here).
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[p.Name] = time.Duration(ut+st) * 10 * time.Millisecond
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		out["test (nats, proxies, clients)"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return out
}

// cpuPer formats the CPU each process used between two cpuTimes, per op.
func cpuPer(before, after map[string]time.Duration, ops int) string {
	names := make([]string, 0, len(after))
	for name := range after {
		names = append(names, name)
	}
	sort.Strings(names)
	var parts []string
	var total time.Duration
	for _, name := range names {
		d := after[name] - before[name]
		total += d
		parts = append(parts, fmt.Sprintf("%s %.2f", name, float64(d.Microseconds())/1000/float64(ops)))
	}
	return fmt.Sprintf("%.2f ms CPU each (%s)", float64(total.Microseconds())/1000/float64(ops), strings.Join(parts, ", "))
}

// BenchmarkActivation measures placement throughput across 2 nodes: new
// sessions created through both gateways, and hibernated sessions woken by
// a history read (the command goes to the place queue group, a node takes
// the lease, restores the checkpoint and answers).
func BenchmarkActivation(b *testing.B) {
	const n = 1000
	c := StartCluster(b, Options{LeaseTTL: -1, HibernateAfter: 2 * time.Second, Direct: true})
	quick := session.Harness{Command: []string{"true"}}
	for i := 0; i < b.N; i++ {
		// One at a time first: the latency of one placement, unloaded.
		seq := bench.NewHistogram()
		cl0 := c.Client(0)
		var seqIDs []session.ID
		for range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			t0 := time.Now()
			s, err := cl0.CreateSession(ctx, client.CreateRequest{Title: "bench", Harness: quick})
			seq.Record(time.Since(t0))
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			seqIDs = append(seqIDs, s.ID)
		}
		c.waitHibernated(b, seqIDs)
		wakeSeq := bench.NewHistogram()
		for _, id := range seqIDs {
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			t0 := time.Now()
			_, err := cl0.Events(ctx, id, 0, 1)
			wakeSeq.Record(time.Since(t0))
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
		b.Logf("one at a time: create p50 %.1f ms (max %.1f ms); wake p50 %.1f ms (max %.1f ms)",
			float64(seq.Quantile(0.5))/1e6, float64(seq.Max())/1e6, float64(wakeSeq.Quantile(0.5))/1e6, float64(wakeSeq.Max())/1e6)
		b.ReportMetric(float64(seq.Quantile(0.5))/1e6, "create-p50-ms")
		b.ReportMetric(float64(wakeSeq.Quantile(0.5))/1e6, "wake-p50-ms")

		cpu0 := c.cpuTimes(b)
		ids, d := c.createMany(b, n, quick)
		cpu1 := c.cpuTimes(b)
		b.Logf("created %d sessions in %v: %.0f/s, per node %v; %s", n, d.Round(time.Millisecond), float64(n)/d.Seconds(), c.perNode(b, ids), cpuPer(cpu0, cpu1, n))
		b.ReportMetric(float64(n)/d.Seconds(), "created/s")
		c.waitHibernated(b, ids)

		cl := []*client.Client{c.Client(0), c.Client(1)}
		var wg sync.WaitGroup
		var failed atomic.Int64
		sem := make(chan struct{}, 64)
		cpu0 = c.cpuTimes(b)
		t0 := time.Now()
		for j, id := range ids {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(context.Background(), waitBound)
				defer cancel()
				if _, err := cl[j%2].Events(ctx, id, 0, 1); err != nil {
					failed.Add(1)
				}
			})
		}
		wg.Wait()
		d = time.Since(t0)
		if f := failed.Load(); f > 0 {
			b.Fatalf("%d of %d wake-ups failed", f, n)
		}
		cpu1 = c.cpuTimes(b)
		b.Logf("woke %d hibernated sessions in %v: %.0f/s, per node %v; %s", n, d.Round(time.Millisecond), float64(n)/d.Seconds(), c.perNode(b, ids), cpuPer(cpu0, cpu1, n))
		b.ReportMetric(float64(n)/d.Seconds(), "woken/s")
		b.ReportMetric(0, "ns/op")
	}
}

// BenchmarkHibernatedMemory measures the node processes' RSS before and
// after 10,000 sessions were created across 2 nodes and hibernated.
func BenchmarkHibernatedMemory(b *testing.B) {
	const n = 10000
	c := StartCluster(b, Options{LeaseTTL: -1, HibernateAfter: 2 * time.Second})
	quick := session.Harness{Command: []string{"true"}}
	rss := func() (total int64, each []string) {
		for _, p := range c.Nodes {
			r, err := p.RSS()
			if err != nil {
				b.Fatal(err)
			}
			total += r
			each = append(each, fmt.Sprintf("%s %.1f MiB", p.Name, float64(r)/(1<<20)))
		}
		return total, each
	}
	for i := 0; i < b.N; i++ {
		before, eachBefore := rss()
		ids, d := c.createMany(b, n, quick)
		// Sessions hibernate HibernateAfter after their creation: only
		// the last ones are still active here.
		b.Logf("created %d sessions in %v (%.0f/s); still active, per node: %v", n, d.Round(time.Millisecond), float64(n)/d.Seconds(), c.perNode(b, ids))
		_, eachCreated := rss()
		c.waitHibernated(b, ids)
		after, eachAfter := rss()
		b.Logf("node RSS: before %v; after creating %v; all hibernated %v", eachBefore, eachCreated, eachAfter)
		b.ReportMetric(float64(after-before)/float64(n)/1024, "KiB/hibernated")
		// Disk: the nodes' history directories (each history's file, its
		// empty WAL and its WAL index, kept between wakes), in allocated
		// blocks.
		var disk int64
		for _, p := range c.Nodes {
			err := filepath.WalkDir(filepath.Join(p.dataDir, "history"), func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					disk += st.Blocks * 512
				}
				return nil
			})
			if err != nil {
				b.Fatalf("disk usage of %s: %v", p.Name, err)
			}
		}
		b.Logf("history files on disk: %.1f MiB, %.1f KiB per session", float64(disk)/(1<<20), float64(disk)/float64(n)/1024)
		b.ReportMetric(float64(disk)/float64(n)/1024, "disk-KiB/session")
		b.ReportMetric(0, "ns/op")
	}
}
