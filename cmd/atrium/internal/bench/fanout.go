package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// Fan-out targets.
const (
	fanoutP99Target   = 25 * time.Millisecond
	rampP99Limit      = 100 * time.Millisecond
	deliveriesTarget  = 100_000
	dialConcurrency   = 32
	drainTimeout      = 15 * time.Second
	restProducerConns = 32
)

// sink collects what every receiver of a fan-out phase saw.
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

// onFrame records an event frame's commit-to-receive latency.
func (r *receiver) onFrame(s *sink, frame []byte) {
	seq, t, ok := parseEventFrame(frame)
	if !ok {
		return
	}
	now := time.Now()
	s.hist.Load().Record(now.Sub(t))
	s.delivered.Add(1)
	if last := r.last.Load(); last != 0 && seq != last+1 {
		s.gaps.Add(1)
	}
	r.last.Store(seq)
}

// fanSide is one system under fan-out test: Atrium over WebSocket or raw
// NATS.
type fanSide struct {
	name      string
	receivers []*receiver
	sink      *sink
	prod      producer
}

// producer creates events at the pace's command.
type producer interface {
	// fire starts one event without blocking; false if the producer is
	// too far behind to take it.
	fire() bool
	// flush waits until every fired event is committed.
	flush(ctx context.Context) error
	// lastSeq returns the highest seq committed so far.
	lastSeq() int64
	// errors returns how many events failed.
	errors() int64
}

func (f *fanSide) live() int {
	n := 0
	for _, r := range f.receivers {
		if !r.closed.Load() {
			n++
		}
	}
	return n
}

// caughtUp reports whether every live receiver has seq.
func (f *fanSide) caughtUp(seq int64) bool {
	for _, r := range f.receivers {
		if !r.closed.Load() && r.last.Load() < seq {
			return false
		}
	}
	return true
}

// phase is the outcome of one fan-out phase at one rate.
type phase struct {
	rate        int
	hist        *Histogram
	events      int64         // events committed during the phase
	elapsed     time.Duration // send window
	delivered   int64
	expected    int64
	dropped     int  // events the producer could not take
	errs        int64
	lost        int  // receivers that disconnected during the phase
	drained     bool // every live receiver caught up within drainTimeout
	achievedEPS float64
}

func (p phase) deliveriesPerSec() float64 { return float64(p.delivered) / p.elapsed.Seconds() }

// sustained reports whether the phase kept up: latency within limit, every
// event delivered to every receiver, and the producer kept its pace.
func (p phase) sustained(limit time.Duration) (bool, string) {
	switch {
	case p.lost > 0:
		return false, fmt.Sprintf("%d receivers disconnected", p.lost)
	case !p.drained || p.delivered < p.expected:
		return false, fmt.Sprintf("delivered %d of %d", p.delivered, p.expected)
	case p.errs > 0:
		return false, fmt.Sprintf("%d send errors", p.errs)
	case p.achievedEPS < 0.9*float64(p.rate):
		return false, fmt.Sprintf("producer reached only %.0f of %d events/s", p.achievedEPS, p.rate)
	case p.hist.Quantile(0.99) > limit:
		return false, fmt.Sprintf("p99 %s", fmtMS(ms(p.hist.Quantile(0.99))))
	}
	return true, ""
}

// runPhase produces events at rate for d and waits for every receiver to
// catch up.
func (r *runner) runPhase(ctx context.Context, f *fanSide, rate int, d time.Duration) (phase, error) {
	h := NewHistogram()
	f.sink.hist.Store(h)
	live0 := f.live()
	seq0 := f.prod.lastSeq()
	del0 := f.sink.delivered.Load()
	err0 := f.prod.errors()
	start := time.Now()
	fired, dropped, err := pace(ctx, rate, d, f.prod.fire)
	elapsed := time.Since(start)
	if err != nil {
		return phase{}, err
	}
	if err := f.prod.flush(ctx); err != nil {
		return phase{}, err
	}
	seq1 := f.prod.lastSeq()
	drained := pollUntil(ctx, drainTimeout, 5*time.Millisecond, func() bool { return f.caughtUp(seq1) })
	live1 := f.live()
	p := phase{
		rate:      rate,
		hist:      h,
		events:    seq1 - seq0,
		elapsed:   elapsed,
		delivered: f.sink.delivered.Load() - del0,
		expected:  (seq1 - seq0) * int64(live1),
		dropped:   dropped,
		errs:      f.prod.errors() - err0,
		lost:      live0 - live1,
		drained:   drained,
	}
	p.achievedEPS = float64(fired-int(p.errs)) / elapsed.Seconds()
	_ = fired
	return p, ctx.Err()
}

// pace calls fire rate times a second for d, catching up after hiccups. It
// returns how many fires succeeded and how many were refused.
func pace(ctx context.Context, rate int, d time.Duration, fire func() bool) (fired, dropped int, err error) {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := 0; ; i++ {
		at := time.Duration(i) * interval
		if at >= d {
			return fired, dropped, nil
		}
		if wait := at - time.Since(start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return fired, dropped, ctx.Err()
			case <-timer.C:
			}
		}
		if fire() {
			fired++
		} else {
			dropped++
		}
	}
}

// pollUntil calls cond every interval until it is true (true) or timeout
// passes (false).
func pollUntil(ctx context.Context, timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
}

// ramp raises the rate from base, doubling, until a step is not
// sustained, then tries once halfway between the last good and the first
// bad rate. It returns the best sustained phase (ok=false if none) and why
// the ramp stopped.
func (r *runner) ramp(ctx context.Context, f *fanSide, base int) (best phase, ok bool, stop string, err error) {
	stepDur := max(r.cfg.Duration/2, time.Second)
	try := func(rate int) (bool, error) {
		p, err := r.runPhase(ctx, f, rate, stepDur)
		if err != nil {
			return false, err
		}
		good, why := p.sustained(rampP99Limit)
		status := "sustained"
		if !good {
			status = "NOT sustained: " + why
			stop = fmt.Sprintf("%d events/s: %s", rate, why)
		}
		r.progress("fanout %s: %5d events/s → %s deliveries/s, p50 %s p99 %s, %s", f.name, rate,
			fmtCount(p.deliveriesPerSec()), fmtMS(ms(p.hist.Quantile(0.5))), fmtMS(ms(p.hist.Quantile(0.99))), status)
		if good && (!ok || p.deliveriesPerSec() > best.deliveriesPerSec()) {
			best, ok = p, true
		}
		return good, nil
	}
	rate := base
	lastGood := 0
	for step := 0; step < r.cfg.MaxRampSteps; step++ {
		good, err := try(rate)
		if err != nil {
			return best, ok, stop, err
		}
		if !good {
			if lastGood > 0 && f.live() == len(f.receivers) {
				if _, err := try((lastGood + rate) / 2); err != nil {
					return best, ok, stop, err
				}
			}
			return best, ok, stop, nil
		}
		lastGood = rate
		rate *= 2
	}
	stop = fmt.Sprintf("ramp ended at %d events/s without reaching the limit", lastGood)
	return best, ok, stop, nil
}

// fanout measures WebSocket fan-out through Atrium and the same fan-out
// through raw NATS.
func (r *runner) fanout(ctx context.Context) ([]Result, error) {
	ws, wsErr := r.fanoutAtrium(ctx)
	nt, ntErr := r.fanoutNATS(ctx)
	var out []Result
	out = append(out, ws.rows...)
	out = append(out, nt.rows...)
	if ws.base != nil && nt.base != nil {
		out[0].Note = joinNote(out[0].Note, fmt.Sprintf("raw NATS p99 %s: Atrium/NATS = %.1f×",
			fmtMS(ms(nt.base.Quantile(0.99))), float64(ws.base.Quantile(0.99))/float64(max(nt.base.Quantile(0.99), 1))))
	}
	if ws.max > 0 && nt.max > 0 {
		for i := range out {
			if out[i].Measure == maxMeasure("ws") {
				out[i].Note = joinNote(out[i].Note, fmt.Sprintf("raw NATS sustains %s/s: Atrium/NATS = %.2f", fmtCount(nt.max), ws.max/nt.max))
			}
		}
	}
	return out, errors.Join(wsErr, ntErr)
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func maxMeasure(side string) string {
	if side == "ws" {
		return "max sustained fan-out (WebSocket)"
	}
	return "max sustained fan-out (raw NATS)"
}

// fanOutcome is what one side of the fan-out produced.
type fanOutcome struct {
	rows []Result
	base *Histogram // base-rate latencies
	max  float64    // best sustained deliveries/s
}

// measureSide runs the base phase and the ramp on f.
func (r *runner) measureSide(ctx context.Context, f *fanSide, side string) (fanOutcome, error) {
	var out fanOutcome
	n := len(f.receivers)
	// Warm up: connections, buffers, the SQLite file, the JIT-less but
	// lazily grown Go runtime structures.
	if _, err := r.runPhase(ctx, f, r.cfg.Rate, time.Second); err != nil {
		return out, err
	}
	r.progress("fanout %s: %d receivers, %d events/s for %s", f.name, n, r.cfg.Rate, r.cfg.Duration)
	p, err := r.runPhase(ctx, f, r.cfg.Rate, r.cfg.Duration)
	if err != nil {
		return out, err
	}
	out.base = p.hist
	row := latencyRow(Result{
		Scenario: ScenarioFanout,
		Unit:     "ms",
	}, p.hist)
	row.Value = row.P99
	good, why := p.sustained(time.Hour)
	if side == "ws" {
		row.Measure = fmt.Sprintf("commit→receive, %d WebSockets, %d ev/s", n, r.cfg.Rate)
		row.Target = "p99 < 25 ms"
		row.Met = met(good && p.hist.Quantile(0.99) < fanoutP99Target)
	} else {
		row.Measure = fmt.Sprintf("publish→receive, %d raw NATS subs, %d ev/s", n, r.cfg.Rate)
	}
	row.Note = fmt.Sprintf("%d events, %d deliveries, %d gaps", p.events, p.delivered, f.sink.gaps.Load())
	if !good {
		row.Note = joinNote(row.Note, "not all delivered: "+why)
	}
	r.progress("fanout %s: p50 %s p99 %s max %s (%s)", f.name, fmtMS(row.Median), fmtMS(row.P99), fmtMS(ms(p.hist.Max())), row.Note)
	out.rows = append(out.rows, row)

	best, ok, stop, err := r.ramp(ctx, f, r.cfg.Rate*2)
	if err != nil {
		return out, err
	}
	mrow := Result{Scenario: ScenarioFanout, Measure: maxMeasure(side), Unit: "deliveries/s"}
	if ok {
		mrow = latencyRow(mrow, best.hist)
		mrow.Value = best.deliveriesPerSec()
		mrow.Note = fmt.Sprintf("%d ev/s × %d receivers; stopped at %s", best.rate, n, stop)
		out.max = mrow.Value
	} else {
		mrow.Note = "no step sustained: " + stop
	}
	if side == "ws" {
		mrow.Target = "≥ 100,000/s with p99 ≤ 100 ms"
		mrow.Met = met(ok && mrow.Value >= deliveriesTarget)
	}
	if g := f.sink.gaps.Load(); g > 0 {
		mrow.Note = joinNote(mrow.Note, fmt.Sprintf("%d seq gaps seen", g))
	}
	out.rows = append(out.rows, mrow)
	return out, nil
}

// fanoutAtrium measures one session watched by cfg.Watchers WebSockets.
func (r *runner) fanoutAtrium(ctx context.Context) (_ fanOutcome, err error) {
	d, err := r.startServer(ctx, "fanout", time.Hour)
	if err != nil {
		return fanOutcome{}, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()
	s, err := d.c.createSession(ctx, "bench fanout", holdTurn)
	if err != nil {
		return fanOutcome{}, err
	}
	// The first prompt starts the turn that holds the queue; wait until
	// it runs so that the measured prompts make one event each.
	if err := startHold(ctx, d.c, s.ID); err != nil {
		return fanOutcome{}, err
	}
	cur, err := d.c.getSession(ctx, s.ID)
	if err != nil {
		return fanOutcome{}, err
	}

	f := &fanSide{name: "ws", sink: &sink{}}
	f.sink.hist.Store(NewHistogram())
	t0 := time.Now()
	conns, err := r.openWatchers(ctx, d.c, s.ID, cur.LastSeq, r.cfg.Watchers, f)
	defer func() {
		for _, c := range conns {
			c.close()
		}
	}()
	if err != nil {
		return fanOutcome{}, err
	}
	r.progress("fanout ws: opened %d WebSockets in %s", len(conns), time.Since(t0).Round(time.Millisecond))

	prod := newRESTProducer(d.c, s.ID, restProducerConns)
	defer prod.close()
	prod.seq.Store(cur.LastSeq)
	f.prod = prod
	out, err := r.measureSide(ctx, f, "ws")
	return out, err
}

// startHold sends the first prompt of a holdTurn session and waits until
// its turn has started, so later prompts only queue.
func startHold(ctx context.Context, c *client, id session.ID) error {
	w, err := c.dialWS(ctx, id, 0)
	if err != nil {
		return err
	}
	defer w.close()
	if _, err := c.prompt(ctx, id, promptBody("hold")); err != nil {
		return fmt.Errorf("first prompt: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		frame, err := w.read(rctx)
		if err != nil {
			return fmt.Errorf("wait for the holding turn to start: %w", err)
		}
		s := string(frame)
		if strings.Contains(s, `"kind":"turn_finished"`) {
			return fmt.Errorf("the holding turn (%s) ended at once; is the sandbox working? (try --unsafe-no-sandbox): %.300s", strings.Join(holdTurn, " "), s)
		}
		if strings.Contains(s, `"kind":"turn_started"`) {
			return nil
		}
	}
}

// openWatchers dials n WebSockets resuming after seq, adds a receiver per
// connection to f and starts its reader. The readers end when the
// connections are closed.
func (r *runner) openWatchers(ctx context.Context, c *client, id session.ID, after session.Seq, n int, f *fanSide) ([]*wsConn, error) {
	conns := make([]*wsConn, n)
	recvs := make([]*receiver, n)
	sem := make(chan struct{}, dialConcurrency)
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	var opened atomic.Int64
	for i := range n {
		sem <- struct{}{}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			w, err := c.dialWS(dctx, id, after)
			if err != nil {
				errOnce.Do(func() { firstErr = fmt.Errorf("open watcher %d: %w", i, err) })
				return
			}
			conns[i] = w
			recvs[i] = &receiver{}
			recvs[i].last.Store(after)
			if k := opened.Add(1); k%500 == 0 && int(k) < n {
				r.progress("fanout ws: %d/%d WebSockets open", k, n)
			}
		})
	}
	wg.Wait()
	var out []*wsConn
	for i, w := range conns {
		if w == nil {
			continue
		}
		out = append(out, w)
		rc := recvs[i]
		f.receivers = append(f.receivers, rc)
		go func() {
			defer rc.closed.Store(true)
			_ = w.readLoop(func(frame []byte) { rc.onFrame(f.sink, frame) })
		}()
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return out, firstErr
}

// restProducer posts prompts from a pool of workers.
type restProducer struct {
	c       *client
	id      session.ID
	body    []byte
	jobs    chan struct{}
	pending atomic.Int64
	seq     atomic.Int64
	errs    atomic.Int64
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

func newRESTProducer(c *client, id session.ID, workers int) *restProducer {
	ctx, cancel := context.WithCancel(context.Background())
	p := &restProducer{c: c, id: id, body: promptBody("fan-out benchmark event"), jobs: make(chan struct{}, 8192), ctx: ctx, cancel: cancel}
	for range workers {
		p.wg.Go(func() {
			for range p.jobs {
				seq, err := c.prompt(ctx, id, p.body)
				if err != nil {
					p.errs.Add(1)
				} else {
					storeMax(&p.seq, seq)
				}
				p.pending.Add(-1)
			}
		})
	}
	return p
}

func storeMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (p *restProducer) fire() bool {
	select {
	case p.jobs <- struct{}{}:
		p.pending.Add(1)
		return true
	default:
		return false
	}
}

func (p *restProducer) flush(ctx context.Context) error {
	if !pollUntil(ctx, 60*time.Second, time.Millisecond, func() bool { return p.pending.Load() <= 0 }) {
		return fmt.Errorf("prompts still in flight after 60s: %d", p.pending.Load())
	}
	return nil
}

func (p *restProducer) lastSeq() int64 { return p.seq.Load() }
func (p *restProducer) errors() int64  { return p.errs.Load() }

func (p *restProducer) close() {
	close(p.jobs)
	p.cancel()
	p.wg.Wait()
}

// fanoutNATS measures the same fan-out with raw NATS: an embedded
// nats-server on loopback TCP, one connection and subscription per
// receiver, a publisher stamping each message with its publish time.
func (r *runner) fanoutNATS(ctx context.Context) (_ fanOutcome, err error) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		return fanOutcome{}, fmt.Errorf("configure nats-server: %w", err)
	}
	ns.Start()
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	if !ns.ReadyForConnections(10 * time.Second) {
		return fanOutcome{}, errors.New("nats-server did not start within 10s")
	}
	const subject = "bench.fanout"
	f := &fanSide{name: "nats", sink: &sink{}}
	f.sink.hist.Store(NewHistogram())
	t0 := time.Now()
	conns := make([]*nats.Conn, r.cfg.Watchers)
	defer func() {
		for _, nc := range conns {
			if nc != nil {
				nc.Close()
			}
		}
	}()
	sem := make(chan struct{}, dialConcurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rc := &receiver{}
			nc, err := nats.Connect(ns.ClientURL(), nats.NoReconnect(), nats.ClosedHandler(func(*nats.Conn) { rc.closed.Store(true) }))
			if err == nil {
				_, err = nc.Subscribe(subject, func(m *nats.Msg) { rc.onFrame(f.sink, m.Data) })
				if err == nil {
					err = nc.Flush()
				}
			}
			mu.Lock()
			defer mu.Unlock()
			conns[i] = nc
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("nats subscriber %d: %w", i, err)
				}
				return
			}
			f.receivers = append(f.receivers, rc)
		})
	}
	wg.Wait()
	if firstErr != nil {
		return fanOutcome{}, firstErr
	}
	r.progress("fanout nats: opened %d NATS subscribers in %s", len(f.receivers), time.Since(t0).Round(time.Millisecond))
	pub, err := nats.Connect(ns.ClientURL(), nats.NoReconnect())
	if err != nil {
		return fanOutcome{}, fmt.Errorf("nats publisher: %w", err)
	}
	defer pub.Close()
	f.prod = &natsProducer{nc: pub, subject: subject}
	return r.measureSide(ctx, f, "nats")
}

// natsProducer publishes event frames shaped like Atrium's, stamped with
// the publish time.
type natsProducer struct {
	nc      *nats.Conn
	subject string
	seq     atomic.Int64
	errs    atomic.Int64
}

func (p *natsProducer) fire() bool {
	seq := p.seq.Load() + 1
	ev := fmt.Appendf(nil, `{"seq":%d,"epoch":"benchepoch","time":"%s","kind":"message","by":"bench","data":{"text":"fan-out benchmark event","client_id":""}}`,
		seq, time.Now().UTC().Format(session.TimeLayout))
	if err := p.nc.Publish(p.subject, session.AppendEventFrame(nil, ev)); err != nil {
		p.errs.Add(1)
		return true
	}
	p.seq.Store(seq)
	return true
}

func (p *natsProducer) flush(ctx context.Context) error {
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return p.nc.FlushWithContext(fctx)
}

func (p *natsProducer) lastSeq() int64 { return p.seq.Load() }
func (p *natsProducer) errors() int64  { return p.errs.Load() }
