package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

const watcherRSSTarget = 64 // KiB per idle watcher

// memory measures the server's cost of idle watchers and of hibernated
// sessions.
func (r *runner) memory(ctx context.Context) ([]Result, error) {
	var out []Result
	rows, err := r.memoryWatchers(ctx)
	out = append(out, rows...)
	rows, err2 := r.memoryHibernated(ctx)
	out = append(out, rows...)
	return out, errors.Join(err, err2)
}

// usage is a snapshot of this process's resources.
type usage struct {
	rss  int64 // bytes
	heap int64 // Go heap in use + goroutine stacks, bytes
	// mapped is what the Go runtime holds from the OS (Sys less
	// HeapReleased), bytes; RSS beyond it is memory allocated outside the
	// Go runtime (SQLite's, through modernc.org/libc).
	mapped     int64
	goroutines int
	files      int
	// threads are the process's OS threads. The Go runtime never ends
	// one: each blocking system call (an fsync) that runs while the
	// others are busy leaves one more, with its stacks.
	threads int
}

// measureUsage collects garbage, returns freed memory to the OS and takes
// a snapshot.
func measureUsage() (usage, error) {
	runtime.GC()
	debug.FreeOSMemory()
	var u usage
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u.heap = int64(ms.HeapInuse + ms.StackInuse)
	u.mapped = int64(ms.Sys - ms.HeapReleased)
	u.goroutines = runtime.NumGoroutine()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return u, fmt.Errorf("count open files: %w", err)
	}
	u.files = len(fds)
	u.rss, u.threads, err = readStatus()
	return u, err
}

// readStatus returns VmRSS and Threads from /proc/self/status.
func readStatus() (rss int64, threads int, _ error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, fmt.Errorf("read process status: %w", err)
	}
	found := 0
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("parse VmRSS %q: %w", v, err)
			}
			rss = kb << 10
			found++
		} else if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			if threads, err = strconv.Atoi(strings.TrimSpace(v)); err != nil {
				return 0, 0, fmt.Errorf("parse Threads %q: %w", v, err)
			}
			found++
		}
	}
	if found != 2 {
		return 0, 0, errors.New("no VmRSS or Threads in /proc/self/status")
	}
	return rss, threads, nil
}

// settledUsage measures until goroutines and open files stop changing
// (connections closing asynchronously), at most a few seconds.
func settledUsage(ctx context.Context) (usage, error) {
	prev, err := measureUsage()
	if err != nil {
		return prev, err
	}
	stable := 0
	pollUntil(ctx, 5*time.Second, 100*time.Millisecond, func() bool {
		u, err2 := measureUsage()
		if err2 != nil {
			err = err2
			return true
		}
		if u.goroutines == prev.goroutines && u.files == prev.files {
			stable++
		} else {
			stable = 0
		}
		prev = u
		return stable >= 2
	})
	return prev, err
}

// jetStreamCacheRest is how long the memory scenario lets the node rest
// after its sessions hibernated, before it measures: longer than the 10 s
// after which the embedded JetStream server drops a message block's cache
// (its write buffer, up to a block's 4-8 MiB, is kept while the block is
// written to and for that long after). A node whose sessions all hibernated
// holds no such cache; measured sooner, the one of the block being written
// counted for one round and not the other.
const jetStreamCacheRest = 11 * time.Second

// restedUsage waits jetStreamCacheRest, then measures as settledUsage.
func restedUsage(ctx context.Context) (usage, error) {
	sleepCtx(ctx, jetStreamCacheRest)
	return settledUsage(ctx)
}

// memoryWatchers opens cfg.Watchers idle watchers of one session from a
// child process and divides the growth of this (the server's) process by
// their number.
func (r *runner) memoryWatchers(ctx context.Context) (_ []Result, err error) {
	if r.cfg.Child == nil {
		return []Result{{Scenario: ScenarioMemory, Measure: "RSS per idle WebSocket watcher", Error: "no child process command configured"}}, nil
	}
	d, err := r.startServer(ctx, "memory-watchers", time.Hour)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()
	s, err := d.c.createSession(ctx, "bench memory", quickTurn())
	if err != nil {
		return nil, err
	}
	n := r.cfg.Watchers
	set, err := startChild(ctx, r.cfg.Child)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, set.close()) }()
	open := func(k int) error { return set.openWS(ctx, d.srv.URL(), benchUser, s.ID, s.LastSeq, k) }
	// A few watchers first, so one-time costs (buffers, pools, the
	// session's subscription) are in the baseline.
	warm := max(1, min(10, n/10))
	if err := open(warm); err != nil {
		return nil, err
	}
	d.c.close()
	before, err := settledUsage(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := open(n - warm); err != nil {
		return nil, err
	}
	r.progress("memory: %d idle watchers open in a child process (%s)", n, time.Since(t0).Round(time.Millisecond))
	after, err := settledUsage(ctx)
	if err != nil {
		return nil, err
	}
	k := float64(n - warm)
	per := float64(after.rss-before.rss) / k / 1024
	row := Result{
		Scenario: ScenarioMemory, Measure: "server RSS per idle WebSocket watcher", Unit: "KiB", Value: per,
		Target: "≤ 64 KiB", Met: met(per <= watcherRSSTarget),
		Note: fmt.Sprintf("%d watchers in a child process; Go heap+stacks %.1f KiB, %.2f goroutines, %.2f open files per watcher",
			n-warm, float64(after.heap-before.heap)/k/1024, float64(after.goroutines-before.goroutines)/k, float64(after.files-before.files)/k),
	}
	r.progress("memory: %.1f KiB RSS per watcher (%s)", per, row.Note)
	return []Result{row}, nil
}

// hibernatedRSSTarget is issue 22's target for the server's RSS per
// hibernated session, KiB.
const hibernatedRSSTarget = 8

// memoryHibernated creates cfg.Sessions sessions, lets them hibernate and
// reports what each still costs. It does so in two equal rounds and
// measures after each, settled: garbage collected, freed memory returned to
// the OS and the embedded JetStream server's caches expired. The first round
// raises the high-water marks of the sessions' active period, which the
// process keeps whatever number of sessions then hibernates: the goroutine
// structures the Go runtime never frees, the memory modernc's allocator
// keeps for reuse after SQLite frees it (about what the most histories open
// at once used), maps sized for the most actors at once. The second round,
// made the same way, reaches about the same marks, so its growth divided by
// its sessions is what one more hibernated session holds: the headline
// figure. The growth over both rounds, which also carries those one-time
// costs, is reported beside it.
func (r *runner) memoryHibernated(ctx context.Context) (_ []Result, err error) {
	if r.cfg.HeapProfile != "" {
		// Sample finely enough to see a few KiB per session (the default
		// samples one allocation per 512 KiB).
		runtime.MemProfileRate = 4096
	}
	d, err := r.startServer(ctx, "memory-sessions", benchHibernateAfter)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.close(ctx)) }()
	// One session through its whole life first, so lazily started parts
	// of the node are in the baseline.
	warm, err := createSessions(ctx, d.c, 1, "bench warm", quickTurn())
	if err != nil {
		return nil, err
	}
	if err := waitHibernated(ctx, d.c, warm); err != nil {
		return nil, err
	}
	d.c.close()
	before, err := restedUsage(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.heapProfile(".before"); err != nil {
		return nil, err
	}
	n := r.cfg.Sessions
	n1 := n / 2 // 0 for one session: one round
	hibernate := func(k int) (usage, error) {
		t0 := time.Now()
		ids, err := createSessions(ctx, d.c, k, "bench hibernate", quickTurn())
		if err != nil {
			return usage{}, err
		}
		r.progress("memory: created %d sessions in %s; waiting for them to hibernate", k, time.Since(t0).Round(time.Millisecond))
		if err := waitHibernated(ctx, d.c, ids); err != nil {
			return usage{}, err
		}
		d.c.close()
		return restedUsage(ctx)
	}
	mid := before
	if n1 > 0 {
		if mid, err = hibernate(n1); err != nil {
			return nil, err
		}
		if err := r.heapProfile(".mid"); err != nil {
			return nil, err
		}
	}
	after, err := hibernate(n - n1)
	if err != nil {
		return nil, err
	}
	if err := r.heapProfile(""); err != nil {
		return nil, err
	}
	fn, f2 := float64(n), float64(n-n1)
	kib := func(a, b int64, k float64) float64 { return float64(b-a) / k / 1024 }
	dg, df := after.goroutines-before.goroutines, after.files-before.files
	rss, heap := kib(mid.rss, after.rss, f2), kib(mid.heap, after.heap, f2)
	span := fmt.Sprintf("the second round's %d of %d sessions", n-n1, n)
	if n1 == 0 {
		span = fmt.Sprintf("%d session (too few for two rounds)", n)
	}
	rows := []Result{
		{
			Scenario: ScenarioMemory, Measure: "goroutines per hibernated session", Unit: "per session",
			Value: float64(dg) / fn, Target: "0", Met: met(dg*100 < n),
			Note: fmt.Sprintf("%d → %d goroutines after %d sessions hibernated", before.goroutines, after.goroutines, n),
		},
		{
			Scenario: ScenarioMemory, Measure: "open files per hibernated session", Unit: "per session",
			Value: float64(df) / fn, Target: "0", Met: met(df*100 < n),
			Note: fmt.Sprintf("%d → %d open files after %d sessions hibernated", before.files, after.files, n),
		},
		{
			Scenario: ScenarioMemory, Measure: "server RSS per hibernated session", Unit: "KiB",
			Value: rss, Target: fmt.Sprintf("≤ %d KiB", hibernatedRSSTarget), Met: met(rss <= hibernatedRSSTarget),
			Note: fmt.Sprintf("growth over %s; over all %d with the one-time costs: %.1f KiB (Go heap+stacks %.1f KiB); Go runtime's memory %.1f KiB per session, the rest is SQLite's through modernc libc; %d → %d → %d OS threads",
				span, n, kib(before.rss, after.rss, fn), kib(before.heap, after.heap, fn), kib(mid.mapped, after.mapped, f2), before.threads, mid.threads, after.threads),
		},
		{
			Scenario: ScenarioMemory, Measure: "Go heap+stacks per hibernated session", Unit: "KiB", Value: heap,
			Note: fmt.Sprintf("growth over %s (in use after a GC: HeapInuse+StackInuse)", span),
		},
	}
	r.progress("memory: %d hibernated sessions: %+d goroutines, %+d open files, %.1f KiB RSS and %.1f KiB Go heap+stacks each (%s)", n, dg, df, rss, heap, span)
	return rows, nil
}

// heapProfile writes the in-use heap (as of the last GC) to
// cfg.HeapProfile+suffix, if a profile is asked for.
func (r *runner) heapProfile(suffix string) error {
	if r.cfg.HeapProfile == "" {
		return nil
	}
	f, err := os.Create(r.cfg.HeapProfile + suffix)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("heap profile: %w", err)
	}
	return f.Close()
}
