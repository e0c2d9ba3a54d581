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

// fanSide is one system under fan-out test: Atrium over WebSocket or raw
// NATS.
type fanSide struct {
	name string
	set  receiverSet
	n    int // receivers opened
	prod producer
	// cpu is the server's CPU time so far; nil means this process's.
	cpu func() time.Duration
	// writes is the server's write system calls so far; nil means this
	// process's.
	writes func() int64
	// turn interleaves this side's phases with the other sides' (turns).
	turn turn
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

// phase is the outcome of one fan-out phase at one rate.
type phase struct {
	rate        int
	hist        *Histogram
	events      int64         // events committed during the phase
	nominal     time.Duration // the phase length asked for
	elapsed     time.Duration // send window
	delivering  time.Duration // from the start until every receiver caught up
	delivered   int64
	expected    int64
	dropped     int // events the producer could not take
	errs        int64
	gaps        int64
	lost        int  // receivers that disconnected during the phase
	drained     bool // every live receiver caught up within drainTimeout
	achievedEPS float64
	// serverCPU is this process's CPU time during the phase; clientCPU the
	// receiver process's (zero when the receivers live in this process).
	serverCPU, clientCPU time.Duration
	// serverWrites and clientReads count the write system calls of the
	// server and the read system calls of the receiver process (zero when
	// the receivers live in this process) during the phase.
	serverWrites, clientReads int64
}

// cpuNote describes the CPU cost per delivery.
func (p phase) cpuNote() string {
	if p.delivered == 0 {
		return ""
	}
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(p.delivered) }
	calls := func(n int64) float64 { return float64(n) / float64(p.delivered) }
	if p.clientCPU == 0 {
		return fmt.Sprintf("CPU %.1f µs/delivery (server and receivers in one process), %.2f writes/delivery", per(p.serverCPU), calls(p.serverWrites))
	}
	return fmt.Sprintf("server CPU %.1f µs/delivery, receivers %.1f µs/delivery; server %.2f writes/delivery, receivers %.2f reads/delivery",
		per(p.serverCPU), per(p.clientCPU), calls(p.serverWrites), calls(p.clientReads))
}

// deliveriesPerSec is the delivery rate: over the nominal phase length
// when every delivery arrived in time (the phase is sustained), else over
// the time it took to deliver everything, backlog included.
func (p phase) deliveriesPerSec() float64 {
	if ok, _ := p.sustained(rampP99Limit); ok {
		return float64(p.delivered) / p.nominal.Seconds()
	}
	return float64(p.delivered) / max(p.elapsed, p.delivering).Seconds()
}

// sustained reports whether the phase kept up: latency within limit, every
// event delivered to every receiver, and the producer kept its pace.
func (p phase) sustained(limit time.Duration) (bool, string) {
	switch {
	case p.lost > 0:
		return false, fmt.Sprintf("%d receivers disconnected", p.lost)
	case p.gaps > 0:
		return false, fmt.Sprintf("%d seq gaps", p.gaps)
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
	if err := f.set.startPhase(); err != nil {
		return phase{}, err
	}
	st0, err := f.set.status()
	if err != nil {
		return phase{}, err
	}
	cpuOf := processCPU
	if f.cpu != nil {
		cpuOf = f.cpu
	}
	writesOf := func() int64 { return syscalls(0).writes }
	if f.writes != nil {
		writesOf = f.writes
	}
	cpu0, w0 := cpuOf(), writesOf()
	seq0 := f.prod.lastSeq()
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
	var stErr error
	drained := pollUntil(ctx, drainTimeout, 2*time.Millisecond, func() bool {
		st, err := f.set.status()
		if err != nil {
			stErr = err
			return true
		}
		return st.Live == 0 || st.MinLast >= seq1
	})
	delivering := time.Since(start)
	cpu1, w1 := cpuOf(), writesOf()
	st1, err := f.set.status()
	if err = errors.Join(stErr, err); err != nil {
		return phase{}, err
	}
	h, err := f.set.histogram()
	if err != nil {
		return phase{}, err
	}
	p := phase{
		rate:       rate,
		hist:       h,
		events:     seq1 - seq0,
		nominal:    d,
		elapsed:    elapsed,
		delivering: delivering,
		delivered:  st1.Delivered - st0.Delivered,
		expected:   (seq1 - seq0) * int64(st1.Live),
		dropped:    dropped,
		errs:       f.prod.errors() - err0,
		gaps:       st1.Gaps - st0.Gaps,
		lost:       st0.Live - st1.Live,
		drained:    drained,
		serverCPU:  cpu1 - cpu0,
		clientCPU:  st1.CPU - st0.CPU,
		// The status requests themselves are a few reads and writes
		// of the receiver process's pipes.
		serverWrites: w1 - w0,
		clientReads:  st1.Reads - st0.Reads,
	}
	p.achievedEPS = float64(fired-int(p.errs)) / elapsed.Seconds()
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

// ramp finds the highest sustained rate. Starting from the base phase, it
// doubles the rate until a step is not sustained and then tries once halfway
// between the last good and the first bad rate; if the base rate itself is
// not sustained it halves instead, down to a few steps. It returns the best
// sustained phase (ok=false if none) and why the ramp stopped.
func (r *runner) ramp(ctx context.Context, f *fanSide, base phase) (best phase, ok bool, stop string, err error) {
	stepDur := max(r.cfg.Duration/2, 250*time.Millisecond)
	consider := func(p phase) bool {
		good, why := p.sustained(rampP99Limit)
		status := "sustained"
		if !good {
			status = "NOT sustained: " + why
			stop = fmt.Sprintf("%d events/s: %s", p.rate, why)
		}
		r.progress("fanout %s: %5d events/s → %s deliveries/s, p50 %s p99 %s, %s", f.name, p.rate,
			fmtCount(p.deliveriesPerSec()), fmtMS(ms(p.hist.Quantile(0.5))), fmtMS(ms(p.hist.Quantile(0.99))), status)
		if good && (!ok || p.deliveriesPerSec() > best.deliveriesPerSec()) {
			best, ok = p, true
		}
		return good
	}
	try := func(rate int) (bool, error) {
		var p phase
		var err error
		f.turn.run(func() { p, err = r.runPhase(ctx, f, rate, stepDur) })
		if err != nil {
			return false, err
		}
		return consider(p), nil
	}
	intact := func() bool {
		st, err := f.set.status()
		return err == nil && st.Live == f.n
	}
	if r.cfg.MaxRampSteps < 0 {
		return best, false, "ramp skipped", nil
	}
	if !consider(base) {
		// Below the base rate, halving.
		for rate, step := base.rate/2, 0; rate > 0 && step < 3 && intact(); rate, step = rate/2, step+1 {
			good, err := try(rate)
			if err != nil || good {
				return best, ok, stop, err
			}
		}
		return best, ok, stop, nil
	}
	lastGood, rate := base.rate, base.rate*2
	for step := 0; step < r.cfg.MaxRampSteps && intact(); step++ {
		good, err := try(rate)
		if err != nil {
			return best, ok, stop, err
		}
		if !good {
			// Two steps of bisection between the last good and the
			// first bad rate.
			lo, hi := lastGood, rate
			for range 2 {
				mid := (lo + hi) / 2
				if mid <= lo || !intact() {
					break
				}
				good, err := try(mid)
				if err != nil {
					return best, ok, stop, err
				}
				if good {
					lo = mid
				} else {
					hi = mid
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

// fanout measures WebSocket fan-out through Atrium, the same fan-out
// through raw NATS and, with a peer, through Centrifugo. The sides are
// opened together and take turns phase by phase (turns), so that each step
// of their ramps is measured under the same background load.
func (r *runner) fanout(ctx context.Context) ([]Result, error) {
	var (
		ws, nt, cf          fanOutcome
		wsErr, ntErr, cfErr error
		peer                *centrifugo
	)
	sides := 2
	if r.cfg.PeerCentrifugo != "" {
		if peer, cfErr = newCentrifugo(r.cfg.PeerCentrifugo); cfErr == nil {
			sides++
		}
	}
	tr := newTurns(sides)
	var wg sync.WaitGroup
	wg.Go(func() {
		u := turn{t: tr, i: 0}
		defer u.quit()
		ws, wsErr = r.fanoutAtrium(ctx, u)
	})
	wg.Go(func() {
		u := turn{t: tr, i: 1}
		defer u.quit()
		nt, ntErr = r.fanoutNATS(ctx, u)
	})
	if peer != nil {
		wg.Go(func() {
			u := turn{t: tr, i: 2}
			defer u.quit()
			cf, cfErr = r.fanoutCentrifugo(ctx, peer, u)
		})
	}
	wg.Wait()
	var out []Result
	out = append(out, ws.rows...)
	out = append(out, nt.rows...)
	out = append(out, cf.rows...)
	if ws.base != nil && cf.base != nil && ws.base.delivered > 0 && cf.base.delivered > 0 && cf.base.serverCPU > 0 {
		w := float64(ws.base.serverCPU) / float64(time.Microsecond) / float64(ws.base.delivered)
		c := float64(cf.base.serverCPU) / float64(time.Microsecond) / float64(cf.base.delivered)
		out = append(out, Result{Scenario: ScenarioFanout, Measure: fmt.Sprintf("Centrifugo server CPU per delivery at %d ev/s", r.cfg.Rate), Unit: "µs", Value: c,
			Note: fmt.Sprintf("Atrium %.1f µs: Atrium/Centrifugo = %.2f×", w, w/c)})
	}
	if ws.max > 0 && cf.max > 0 {
		for i := range out {
			if out[i].Measure == maxMeasure("ws") {
				out[i].Note = joinNote(out[i].Note, fmt.Sprintf("Centrifugo sustains %s/s: Atrium/Centrifugo = %.2f (target ≥ 1.5)", fmtCount(cf.max), ws.max/cf.max))
			}
		}
	}
	if ws.base != nil && nt.base != nil {
		wp, np := ws.base.hist.Quantile(0.99), nt.base.hist.Quantile(0.99)
		out[0].Note = joinNote(out[0].Note, fmt.Sprintf("raw NATS p99 %s: Atrium/NATS = %.1f×", fmtMS(ms(np)), float64(wp)/float64(max(np, 1))))
		cpu := Result{Scenario: ScenarioFanout, Measure: fmt.Sprintf("server CPU per delivery at %d ev/s (WebSocket)", r.cfg.Rate), Unit: "µs"}
		if ws.base.delivered > 0 && nt.base.delivered > 0 {
			w := float64(ws.base.serverCPU) / float64(time.Microsecond) / float64(ws.base.delivered)
			n := float64(nt.base.serverCPU) / float64(time.Microsecond) / float64(nt.base.delivered)
			cpu.Value = w
			cpu.Note = fmt.Sprintf("raw nats-server (with the publisher) %.1f µs: Atrium/NATS = %.1f×", n, w/n)
			if ws.base.clientCPU == 0 {
				cpu.Note = joinNote(cpu.Note, "receivers in the same process: server and receiver CPU are not separated")
			}
			out = append(out, cpu)
		}
	}
	if ws.max > 0 && nt.max > 0 {
		for i := range out {
			if out[i].Measure == maxMeasure("ws") {
				out[i].Note = joinNote(out[i].Note, fmt.Sprintf("raw NATS sustains %s/s: Atrium/NATS = %.2f", fmtCount(nt.max), ws.max/nt.max))
			}
		}
	}
	return out, errors.Join(wsErr, ntErr, cfErr)
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func maxMeasure(side string) string {
	switch side {
	case "ws":
		return "max sustained fan-out (WebSocket)"
	case "centrifugo":
		return "max sustained fan-out (Centrifugo WebSocket)"
	}
	return "max sustained fan-out (raw NATS)"
}

// fanOutcome is what one side of the fan-out produced.
type fanOutcome struct {
	rows []Result
	base *phase  // the base-rate phase
	max  float64 // best sustained deliveries/s
}

// measureSide runs the base phase and the ramp on f, in f's turns, and
// returns when every side is done.
func (r *runner) measureSide(ctx context.Context, f *fanSide, side string) (fanOutcome, error) {
	var out fanOutcome
	n := f.n
	f.turn.join()
	defer f.turn.finish()
	// Warm up connections, buffers and lazily grown structures.
	var err error
	f.turn.run(func() { _, err = r.runPhase(ctx, f, r.cfg.Rate, min(time.Second, r.cfg.Duration)) })
	if err != nil {
		return out, err
	}
	var p phase
	f.turn.run(func() {
		r.progress("fanout %s: %d receivers, %d events/s for %s", f.name, n, r.cfg.Rate, r.cfg.Duration)
		p, err = r.runPhase(ctx, f, r.cfg.Rate, r.cfg.Duration)
	})
	if err != nil {
		return out, err
	}
	out.base = &p
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
	} else if side == "centrifugo" {
		row.Measure = fmt.Sprintf("publish→receive, %d Centrifugo WebSockets, %d ev/s", n, r.cfg.Rate)
	} else {
		row.Measure = fmt.Sprintf("publish→receive, %d raw NATS subs, %d ev/s", n, r.cfg.Rate)
	}
	row.Note = joinNote(fmt.Sprintf("%d events, %d deliveries, %d gaps", p.events, p.delivered, p.gaps), p.cpuNote())
	if !good {
		row.Note = joinNote(row.Note, "not all delivered: "+why)
	}
	r.progress("fanout %s: p50 %s p99 %s max %s (%s)", f.name, fmtMS(row.Median), fmtMS(row.P99), fmtMS(ms(p.hist.Max())), row.Note)
	out.rows = append(out.rows, row)

	best, ok, stop, err := r.ramp(ctx, f, p)
	if err != nil {
		return out, err
	}
	mrow := Result{Scenario: ScenarioFanout, Measure: maxMeasure(side), Unit: "deliveries/s"}
	if ok {
		mrow = latencyRow(mrow, best.hist)
		mrow.Value = best.deliveriesPerSec()
		mrow.Note = joinNote(fmt.Sprintf("%d ev/s × %d receivers; ramp stopped: %s", best.rate, n, stop), best.cpuNote())
		out.max = mrow.Value
	} else {
		mrow.Note = "no step sustained: " + stop
	}
	if side == "ws" {
		mrow.Target = "≥ 100,000/s with p99 ≤ 100 ms"
		mrow.Met = met(ok && mrow.Value >= deliveriesTarget)
	}
	out.rows = append(out.rows, mrow)
	return out, nil
}

// fanoutAtrium measures one session watched by cfg.Watchers WebSockets.
func (r *runner) fanoutAtrium(ctx context.Context, u turn) (_ fanOutcome, err error) {
	d, err := r.startServer(ctx, "fanout", time.Hour)
	if err != nil {
		return fanOutcome{}, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()
	s, err := d.c.createSession(ctx, "bench fanout", holdTurn())
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

	set, err := r.newReceiverSet(ctx)
	if err != nil {
		return fanOutcome{}, err
	}
	defer func() { err = errors.Join(err, set.close()) }()
	t0 := time.Now()
	if err := set.openWS(ctx, d.srv.URL(), benchUser, s.ID, cur.LastSeq, r.cfg.Watchers); err != nil {
		return fanOutcome{}, err
	}
	r.progress("fanout ws: opened %d WebSockets in %s", r.cfg.Watchers, time.Since(t0).Round(time.Millisecond))
	f := &fanSide{name: "ws", set: set, n: r.cfg.Watchers, turn: u}

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
			return fmt.Errorf("the holding turn (%s) ended at once; is the sandbox working? (try --unsafe-no-sandbox): %.300s", strings.Join(holdTurn(), " "), s)
		}
		if strings.Contains(s, `"kind":"turn_started"`) {
			return nil
		}
	}
}

// newReceiverSet holds the receivers in a child process when one is
// configured, so that this process's CPU time is the server's alone.
func (r *runner) newReceiverSet(ctx context.Context) (receiverSet, error) {
	if r.cfg.Child == nil {
		return newLocalSet(), nil
	}
	return startChild(ctx, r.cfg.Child)
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
func (r *runner) fanoutNATS(ctx context.Context, u turn) (_ fanOutcome, err error) {
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
	set, err := r.newReceiverSet(ctx)
	if err != nil {
		return fanOutcome{}, err
	}
	defer func() { err = errors.Join(err, set.close()) }()
	t0 := time.Now()
	if err := set.openNATS(ctx, ns.ClientURL(), subject, r.cfg.Watchers); err != nil {
		return fanOutcome{}, err
	}
	r.progress("fanout nats: opened %d NATS subscribers in %s", r.cfg.Watchers, time.Since(t0).Round(time.Millisecond))
	f := &fanSide{name: "nats", set: set, n: r.cfg.Watchers, turn: u}
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
