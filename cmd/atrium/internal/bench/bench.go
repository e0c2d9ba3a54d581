// Package bench measures a running Atrium deployment against its targets:
// WebSocket fan-out latency and throughput (compared with raw NATS), durable
// append throughput, wake-up latency and activation throughput of hibernated
// sessions, memory per idle watcher and per hibernated session, and resume
// replay time. `atrium bench` runs it against in-process servers (package
// server) and prints the table recorded in docs/benchmarks.md.
//
// Every scenario starts its own server in its own data directory so that
// scenarios do not disturb each other, and talks to it only through the
// client wire contract (REST and WebSocket, DESIGN §7) as real clients do.
package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Scenario names, in the order they run.
const (
	ScenarioFanout     = "fanout"
	ScenarioAppend     = "append"
	ScenarioWake       = "wake"
	ScenarioActivation = "activation"
	ScenarioMemory     = "memory"
	ScenarioResume     = "resume"
	ScenarioAgent      = "agent"
)

// Scenarios returns every scenario name in run order.
func Scenarios() []string {
	return []string{ScenarioFanout, ScenarioAppend, ScenarioWake, ScenarioActivation, ScenarioMemory, ScenarioResume, ScenarioAgent}
}

// Defaults of Config.
const (
	DefaultWatchers           = 1000
	DefaultDuration           = 5 * time.Second
	DefaultRate               = 100
	DefaultSenders            = 64
	DefaultWSConns            = 8
	DefaultWSWindow           = 16
	DefaultWakeSamples        = 200
	DefaultActivationSessions = 1000
	DefaultSessions           = 2000
	DefaultResumeEvents       = 10000
	DefaultResumeRuns         = 20
	DefaultMaxRampSteps       = 7
	DefaultAgentTurns         = 200
)

// Server is a running deployment under test. *server.Server implements it.
type Server interface {
	// URL is the base URL of the gateway, e.g. "http://127.0.0.1:7080".
	URL() string
	// Close stops the deployment; it is safe to call twice.
	Close(ctx context.Context) error
}

// ServerOptions is what a scenario asks of its deployment.
type ServerOptions struct {
	// DataDir is the deployment's own, empty, data directory.
	DataDir string
	// HibernateAfter is the idle time before a session hibernates.
	HibernateAfter time.Duration
	// Logger receives the deployment's logs.
	Logger *slog.Logger
	// AgentBin, when set, is a scripted ACP agent program (the protocol of
	// actor/testdata/acpagent) the deployment offers as the agent
	// AgentName, installed as <AgentsDir>/AgentName/1.0.0/acpagent.
	AgentBin, AgentsDir string
}

// StartFunc starts a fresh deployment listening on loopback with the dev
// identity (Authorization: Bearer dev:<user>).
type StartFunc func(ctx context.Context, o ServerOptions) (Server, error)

// Config selects and sizes the scenarios. Zero fields take the Default*
// values.
type Config struct {
	// Start starts each scenario's deployment. Required.
	Start StartFunc
	// Scenarios to run, from Scenarios(); empty means all.
	Scenarios []string
	// Watchers is the number of WebSocket watchers (and raw NATS
	// subscribers) of the fan-out and memory scenarios.
	Watchers int
	// Duration is the length of each timed phase: the fan-out base rate
	// and each append run; each ramp step of the fan-out lasts half of it.
	Duration time.Duration
	// Rate is the base event rate of the fan-out, events per second.
	Rate int
	// MaxRampSteps bounds the doublings of the fan-out rate; negative
	// skips the ramp.
	MaxRampSteps int
	// Senders is the number of concurrent REST senders of the append
	// scenario.
	Senders int
	// AppendVia lists the append runs: "rest", "ws"; empty means both.
	AppendVia []string
	// WSConns and WSWindow shape the WebSocket append run: that many
	// connections, each keeping WSWindow prompts in flight.
	WSConns, WSWindow int
	// WakeSamples is the number of hibernated sessions woken, one at a time.
	WakeSamples int
	// ActivationSessions is the number of hibernated sessions the
	// activation scenario wakes, many at a time.
	ActivationSessions int
	// Sessions is the number of sessions hibernated by the memory scenario.
	Sessions int
	// ResumeEvents is the length of the history replayed by the resume
	// scenario, and ResumeRuns the number of replays timed.
	ResumeEvents, ResumeRuns int
	// PeerCentrifugo, if set (http://APIKEY@host:port), is a Centrifugo v6
	// server that the resume scenario replays the same history from and
	// the fan-out scenario fans out through, in the same run, for
	// comparison.
	PeerCentrifugo string
	// HeapProfile, if set, is where the memory scenario writes the
	// in-use heap with its hibernated sessions (and, with the suffix
	// .before, before they were created), for go tool pprof -base.
	HeapProfile string
	// DataDir is where each scenario's server keeps its data (one
	// subdirectory per scenario, removed afterwards). Empty means a fresh
	// temporary directory.
	DataDir string
	// Sandboxed says whether Start's deployments run harnesses under
	// bubblewrap; it is recorded in the report.
	Sandboxed bool
	// Child returns the command that runs RunWatchers in a child process.
	// The fan-out and memory scenarios keep their receivers there, so that
	// this process's CPU time and memory are the server's alone. Nil keeps
	// fan-out receivers in this process and skips the per-watcher memory
	// measure.
	Child func(ctx context.Context, args ...string) *exec.Cmd
	// Progress receives a line for each step that takes more than a
	// moment; nil discards them.
	Progress io.Writer
	// Logger receives the servers' logs; nil discards them.
	Logger *slog.Logger
	// AgentBin is the scripted ACP agent of the agent scenario
	// (go build ./actor/testdata/acpagent); without it the scenario is
	// left out of the default run and fails when asked for.
	AgentBin string
	// AgentTurns is the number of warm agent turns timed.
	AgentTurns int
}

func (c *Config) fill() error {
	if c.Start == nil {
		return errors.New("bench: Config.Start is required")
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios()
		if c.AgentBin == "" {
			c.Scenarios = slices.DeleteFunc(c.Scenarios, func(s string) bool { return s == ScenarioAgent })
		}
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios(), s) {
			return fmt.Errorf("unknown scenario %q: choose from %s", s, strings.Join(Scenarios(), ","))
		}
	}
	def := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	if len(c.AppendVia) == 0 {
		c.AppendVia = []string{"rest", "ws"}
	}
	for _, v := range c.AppendVia {
		if v != "rest" && v != "ws" {
			return fmt.Errorf("unknown append mode %q: choose rest or ws", v)
		}
	}
	def(&c.Watchers, DefaultWatchers)
	def(&c.Rate, DefaultRate)
	def(&c.MaxRampSteps, DefaultMaxRampSteps)
	def(&c.Senders, DefaultSenders)
	def(&c.WSConns, DefaultWSConns)
	def(&c.WSWindow, DefaultWSWindow)
	def(&c.WakeSamples, DefaultWakeSamples)
	def(&c.ActivationSessions, DefaultActivationSessions)
	def(&c.Sessions, DefaultSessions)
	def(&c.ResumeEvents, DefaultResumeEvents)
	def(&c.ResumeRuns, DefaultResumeRuns)
	def(&c.AgentTurns, DefaultAgentTurns)
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	for _, v := range []int{c.Watchers, c.Rate, c.Senders, c.WSConns, c.WSWindow, c.WakeSamples, c.ActivationSessions, c.Sessions, c.ResumeEvents, c.ResumeRuns, c.AgentTurns} {
		if v < 0 {
			return errors.New("sizes must be positive")
		}
	}
	if c.Duration < 0 {
		return errors.New("duration must be positive")
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Result is one row of the table.
type Result struct {
	Scenario string `json:"scenario"`
	Measure  string `json:"measure"`
	// Unit of Median, P99 and Value: "ms", "events/s", "deliveries/s",
	// "KiB", "per session".
	Unit string `json:"unit"`
	// Median and P99 of the per-operation latencies, in ms, when the row
	// has a distribution (Samples > 0).
	Median  float64 `json:"median_ms,omitempty"`
	P99     float64 `json:"p99_ms,omitempty"`
	Samples uint64  `json:"samples,omitempty"`
	// Value is the row's headline figure, in Unit, compared with Target.
	Value float64 `json:"value"`
	// Target is the goal in words ("p99 < 25 ms"); Met is whether Value
	// meets it (nil when the row has no target).
	Target string `json:"target,omitempty"`
	Met    *bool  `json:"met,omitempty"`
	Note   string `json:"note,omitempty"`
	// Error is set when the measure could not be taken.
	Error string `json:"error,omitempty"`
}

// Report is the outcome of a run.
type Report struct {
	Date      time.Time `json:"date"`
	Machine   Machine   `json:"machine"`
	Config    RunConfig `json:"config"`
	Results   []Result  `json:"results"`
	ElapsedMS int64     `json:"elapsed_ms"`
}

// RunConfig is the part of Config that shaped the figures.
type RunConfig struct {
	Scenarios          []string `json:"scenarios"`
	Watchers           int      `json:"watchers"`
	DurationMS         int64    `json:"duration_ms"`
	Rate               int      `json:"rate"`
	Senders            int      `json:"senders"`
	WakeSamples        int      `json:"wake_samples"`
	ActivationSessions int      `json:"activation_sessions"`
	Sessions           int      `json:"sessions"`
	ResumeEvents       int      `json:"resume_events"`
	Sandbox            bool     `json:"sandbox"`
}

// Machine describes where the figures were taken.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	OS        string `json:"os"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go_version"`
	// LoadAvg is the 1-minute load average when the run started: figures
	// taken while other work competes for the CPUs are not comparable.
	LoadAvg float64 `json:"load_avg"`
}

// Failed reports whether any measure could not be taken.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Error != "" {
			return true
		}
	}
	return false
}

// Run runs the selected scenarios one after another and returns their
// results. A scenario that fails adds a row with Error set and the run goes
// on; Run itself fails only on a bad Config or a cancelled ctx.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	start := time.Now()
	dir := cfg.DataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "atrium-bench-")
		if err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	r := &runner{cfg: cfg, dir: dir, start: start}
	rep := &Report{
		Date:    start.UTC().Truncate(time.Second),
		Machine: DescribeMachine(),
		Config: RunConfig{
			Scenarios: cfg.Scenarios, Watchers: cfg.Watchers, DurationMS: cfg.Duration.Milliseconds(),
			Rate: cfg.Rate, Senders: cfg.Senders, WakeSamples: cfg.WakeSamples, ActivationSessions: cfg.ActivationSessions, Sessions: cfg.Sessions,
			ResumeEvents: cfg.ResumeEvents, Sandbox: cfg.Sandboxed,
		},
	}
	if l := rep.Machine.LoadAvg; l > 0.5*float64(rep.Machine.CPUs) {
		r.progress("WARNING: load average %.2f on %d CPUs: other work is running and will distort the figures", l, rep.Machine.CPUs)
	}
	for _, name := range Scenarios() {
		if !slices.Contains(cfg.Scenarios, name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		r.progress("%s: starting", name)
		var res []Result
		var err error
		switch name {
		case ScenarioFanout:
			res, err = r.fanout(ctx)
		case ScenarioAppend:
			res, err = r.append(ctx)
		case ScenarioWake:
			res, err = r.wake(ctx)
		case ScenarioActivation:
			res, err = r.activation(ctx)
		case ScenarioMemory:
			res, err = r.memory(ctx)
		case ScenarioResume:
			res, err = r.resume(ctx)
		case ScenarioAgent:
			res, err = r.agent(ctx)
		}
		rep.Results = append(rep.Results, res...)
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			rep.Results = append(rep.Results, Result{Scenario: name, Measure: "(scenario)", Error: err.Error()})
			r.progress("%s: FAILED: %v", name, err)
		}
	}
	rep.ElapsedMS = time.Since(start).Milliseconds()
	return rep, nil
}

// runner carries the state shared by the scenarios of one Run.
type runner struct {
	cfg   Config
	dir   string
	start time.Time
	mu    sync.Mutex // serialises progress lines
}

func (r *runner) progress(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.cfg.Progress, "bench %6.1fs  %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// deployment is one scenario's server and a client of it.
type deployment struct {
	srv Server
	c   *client
	dir string
}

// startServer starts a fresh in-process server for one scenario.
func (r *runner) startServer(ctx context.Context, name string, hibernateAfter time.Duration) (*deployment, error) {
	dir := filepath.Join(r.dir, name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("clean data dir: %w", err)
	}
	o := ServerOptions{
		DataDir:        dir,
		HibernateAfter: hibernateAfter,
		Logger:         r.cfg.Logger.With("scenario", name),
	}
	if name == ScenarioAgent {
		o.AgentBin = r.cfg.AgentBin
		o.AgentsDir = filepath.Join(dir, "agents")
		if err := installAgentBin(r.cfg.AgentBin, filepath.Join(o.AgentsDir, AgentName, "1.0.0", "acpagent")); err != nil {
			return nil, err
		}
	}
	srv, err := r.cfg.Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	return &deployment{srv: srv, c: newClient(srv.URL(), benchUser), dir: dir}, nil
}

// close stops the server; cleanup must finish even when ctx is cancelled.
func (d *deployment) close(ctx context.Context) error {
	d.c.close()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := d.srv.Close(cctx)
	if rmErr := os.RemoveAll(d.dir); err == nil {
		err = rmErr
	}
	if err != nil {
		return fmt.Errorf("stop server: %w", err)
	}
	return nil
}

// benchUser is the dev identity of every benchmark client; it owns the
// sessions it creates, so it may watch and prompt them.
const benchUser = "bench"

// holdTurn is the harness of sessions that take many prompts: its first
// turn never ends, so every later prompt only queues and makes exactly one
// message event, and no process starts per prompt.
func holdTurn() []string { return []string{"sleep", "86400"} }

// quickTurn is the harness of sessions that are prompted once or twice: a
// process that exits at once.
func quickTurn() []string { return []string{"true"} }

// WriteTable writes the results as an aligned text table.
func (r *Report) WriteTable(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "atrium bench — %s, %d CPUs (%s), %s, %s, load average %.2f at start\n\n",
		r.Date.Format("2006-01-02"), r.Machine.CPUs, r.Machine.CPUModel, r.Machine.OS, r.Machine.GoVersion, r.Machine.LoadAvg)
	rows := [][]string{{"SCENARIO", "MEASURE", "MEDIAN", "P99", "RESULT", "TARGET", "MET"}}
	var notes []string
	for _, res := range r.Results {
		med, p99 := "-", "-"
		if res.Samples > 0 {
			med, p99 = fmtMS(res.Median), fmtMS(res.P99)
		}
		result := fmtValue(res.Value, res.Unit)
		met := "-"
		if res.Met != nil {
			met = map[bool]string{true: "yes", false: "NO"}[*res.Met]
		}
		if res.Error != "" {
			result, met = "error", "ERROR"
			notes = append(notes, fmt.Sprintf("%s %s: %s", res.Scenario, res.Measure, res.Error))
		} else if res.Note != "" {
			notes = append(notes, fmt.Sprintf("%s %s: %s", res.Scenario, res.Measure, res.Note))
		}
		target := res.Target
		if target == "" {
			target = "-"
		}
		rows = append(rows, []string{res.Scenario, res.Measure, med, p99, result, target, met})
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len([]rune(cell)))
		}
	}
	for _, row := range rows {
		for i, cell := range row {
			if i == len(row)-1 {
				fmt.Fprintln(bw, cell)
				break
			}
			fmt.Fprint(bw, cell, strings.Repeat(" ", widths[i]-len([]rune(cell))+2))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(bw)
		for _, n := range notes {
			fmt.Fprintln(bw, "  "+n)
		}
	}
	fmt.Fprintf(bw, "\ntotal %.1fs\n", float64(r.ElapsedMS)/1000)
	return bw.Flush()
}

func fmtMS(ms float64) string {
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f ms", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f ms", ms)
	default:
		return fmt.Sprintf("%.2f ms", ms)
	}
}

func fmtValue(v float64, unit string) string {
	switch unit {
	case "ms":
		return fmtMS(v)
	case "events/s", "deliveries/s", "sessions/s":
		return fmt.Sprintf("%s %s", fmtCount(v), unit)
	case "KiB":
		return fmt.Sprintf("%.1f KiB", v)
	case "µs":
		return fmt.Sprintf("%.1f µs", v)
	case "":
		return fmt.Sprintf("%.3g", v)
	default:
		return fmt.Sprintf("%.3g %s", v, unit)
	}
}

// fmtCount writes 123456.7 as "123,457".
func fmtCount(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func met(ok bool) *bool { return &ok }

// latencyRow fills a row's distribution from h.
func latencyRow(res Result, h *Histogram) Result {
	res.Samples = h.Count()
	res.Median = ms(h.Quantile(0.5))
	res.P99 = ms(h.Quantile(0.99))
	return res
}

// DescribeMachine reports the CPU count and model, OS, kernel and Go
// version.
func DescribeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			m.LoadAvg, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		var b strings.Builder
		for _, c := range u.Release {
			if c == 0 {
				break
			}
			b.WriteByte(byte(c))
		}
		m.Kernel = b.String()
	}
	return m
}

// RaiseFileLimit raises this process's open-file soft limit to its hard
// limit (thousands of WebSockets need thousands of descriptors) and returns
// the new limit.
func RaiseFileLimit() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("read open-file limit: %w", err)
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return 0, fmt.Errorf("raise open-file limit to %d: %w", l.Max, err)
		}
	}
	return l.Cur, nil
}
