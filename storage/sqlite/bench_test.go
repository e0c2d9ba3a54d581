package sqlite_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// BenchmarkAppendMessages appends batches of 48 message events (prompts with
// a client_id, as the WebSocket append benchmark sends), which the
// events_prompt index holds; one op is one batch.
func BenchmarkAppendMessages(b *testing.B) {
	const size = 48
	l := mustCreate(b, newDir(b), "s_bench")
	next := session.Seq(1)
	evs := make([]session.Stored, size)
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	for b.Loop() {
		for i := range evs {
			evs[i] = message(next, "bench", fmt.Sprintf("run-c%d-%d", i%8, next))
			next++
		}
		if err := l.Append(context.Background(), evs); err != nil {
			b.Fatal(err)
		}
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
	b.ReportMetric(float64(cpu)/1e3/float64(next-1), "cpu-µs/event")
}

// BenchmarkAppend appends batches of ~300-byte events; one op is one batch
// (one transaction).
func BenchmarkAppend(b *testing.B) {
	for _, sync := range []string{sqlite.SyncNormal, sqlite.SyncFull} {
		for _, size := range []int{1, 3, 16, 64, 100, 128} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", sync, size), func(b *testing.B) {
				d := newDir(b)
				d.Sync = sync
				l := mustCreate(b, d, "s_bench")
				tmpl := batch(1, size, 300)
				next := session.Seq(1)
				for b.Loop() {
					for i := range tmpl {
						tmpl[i].Seq = next + session.Seq(i)
					}
					if err := l.Append(context.Background(), tmpl); err != nil {
						b.Fatal(err)
					}
					next += session.Seq(size)
				}
				b.ReportMetric(float64(next-1)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}

// BenchmarkRange reads a 10,000-event history from the start in pages of 500
// events or 1 MiB; one op is the whole history.
func BenchmarkRange(b *testing.B) {
	const total = 10000
	l := mustCreate(b, newDir(b), "s_bench")
	for next := session.Seq(1); next <= total; next += 500 {
		mustAppend(b, l, batch(next, 500, 300)...)
	}
	ctx := context.Background()
	n, ops := 0, 0
	for b.Loop() {
		ops++
		for after, more := session.Seq(0), true; more; {
			evs, m, err := l.Range(ctx, after, 500, 1<<20)
			if err != nil {
				b.Fatal(err)
			}
			after, more = after+session.Seq(len(evs)), m
			n += len(evs)
		}
	}
	if n != ops*total {
		b.Fatalf("read %d events in %d ops", n, ops)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
}

// wakeHistory creates a closed history of 1,000 events with a sandbox event
// and one finished turn, as a hibernated session leaves it.
func wakeHistory(b *testing.B) *sqlite.Dir {
	d := newDir(b)
	l, err := d.Create(context.Background(), meta("s_bench"))
	if err != nil {
		b.Fatal(err)
	}
	evs := batch(1, 1000, 300)
	evs[0].Kind, evs[1].Kind, evs[999].Kind = session.KindSandbox, session.KindTurnStarted, session.KindTurnFinished
	mustAppend(b, l, evs...)
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkOpen wakes a hibernated session's history the way the session
// actor does: open, read Meta, LastSeq and two LastOfKind, close. One op is
// the whole cycle.
func BenchmarkOpen(b *testing.B) {
	d := wakeHistory(b)
	ctx := context.Background()
	for b.Loop() {
		l, err := d.Open(ctx, "s_bench")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := l.Meta(ctx); err != nil {
			b.Fatal(err)
		}
		if n, _ := l.LastSeq(ctx); n != 1000 {
			b.Fatalf("LastSeq = %d", n)
		}
		for _, k := range []session.Kind{session.KindSandbox, session.KindTurnStarted} {
			if ev, err := l.LastOfKind(ctx, k); err != nil || ev == nil {
				b.Fatalf("LastOfKind(%s) = %s, %v", k, ev, err)
			}
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWakeAppend opens a closed history, appends one event and closes
// it; one op is the cycle, and first-append-ns is the Append alone (the
// first commit after a wake).
func BenchmarkWakeAppend(b *testing.B) {
	for _, sync := range []string{sqlite.SyncNormal, sqlite.SyncFull} {
		b.Run("sync="+sync, func(b *testing.B) {
			d := wakeHistory(b)
			d.Sync = sync
			ctx := context.Background()
			next := session.Seq(1001)
			var appendTime time.Duration
			for b.Loop() {
				l, err := d.Open(ctx, "s_bench")
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if err := l.Append(ctx, batch(next, 1, 300)); err != nil {
					b.Fatal(err)
				}
				appendTime += time.Since(start)
				next++
				if err := l.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(appendTime.Nanoseconds())/float64(next-1001), "first-append-ns")
		})
	}
}

// BenchmarkOpenParallel wakes 2,000 hibernated histories in one directory
// from 64 goroutines, as a node does when many sessions wake at once; one op
// is one BenchmarkOpen cycle on one history, and no two goroutines share a
// history. Every history is woken once before the timer starts, so the
// figures are those of histories that have been woken before. cpu-us/open is
// the process's user and system CPU time (getrusage) per op.
func BenchmarkOpenParallel(b *testing.B) {
	const histories, workers = 2000, 64
	d := newDir(b)
	ctx := context.Background()
	src := wakeHistory(b)
	tmpl, err := os.ReadFile(filepath.Join(src.Path, "s_bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(d.Path, 0o750); err != nil {
		b.Fatal(err)
	}
	ids := make([]session.ID, histories)
	for i := range ids {
		ids[i] = session.ID(fmt.Sprintf("s_%04d", i))
		if err := os.WriteFile(filepath.Join(d.Path, string(ids[i])+".db"), tmpl, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	wake := func(id session.ID) error {
		l, err := d.Open(ctx, id)
		if err != nil {
			return err
		}
		defer l.Close()
		if _, err := l.Meta(ctx); err != nil {
			return err
		}
		for _, k := range []session.Kind{session.KindSandbox, session.KindTurnStarted} {
			if ev, err := l.LastOfKind(ctx, k); err != nil || ev == nil {
				return fmt.Errorf("LastOfKind(%s) = %s, %v", k, ev, err)
			}
		}
		return l.Close()
	}
	// run wakes histories from the workers until n wakes have started (all
	// of them at least once if n < 0); worker w owns histories w, w+workers,
	// and so on, and wakes them in turn.
	run := func(n int) {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				var mine []session.ID
				for i := w; i < histories; i += workers {
					mine = append(mine, ids[i])
				}
				for k := 0; (n < 0 && k < len(mine)) || (n >= 0 && next.Add(1) <= int64(n)); k++ {
					if err := wake(mine[k%len(mine)]); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	run(-1)
	before := cpuTime(b)
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-us/open")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "opens/s")
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCreate creates and closes new histories in one directory; one op
// is one Create and Close, and cpu-us/op the process's CPU time per op.
func BenchmarkCreate(b *testing.B) {
	d := newDir(b)
	ctx := context.Background()
	mustCreate(b, d, "s_first") // Builds the empty history once.
	before := cpuTime(b)
	n := 0
	for b.Loop() {
		l, err := d.Create(ctx, meta(session.ID(fmt.Sprintf("s_%d", n))))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(n), "cpu-us/op")
}

// BenchmarkBackup backs up a history of 1,000 events of ~300 bytes (about
// 400 KiB) to io.Discard, as every hibernation does; cpu-us/op is the
// process's CPU time per op.
func BenchmarkBackup(b *testing.B) {
	l := mustCreate(b, newDir(b), "s_bench")
	mustAppend(b, l, batch(1, 1000, 300)...)
	ctx := context.Background()
	before := cpuTime(b)
	n := 0
	for b.Loop() {
		if last, err := l.Backup(ctx, io.Discard); err != nil || last != 1000 {
			b.Fatalf("Backup = %d, %v", last, err)
		}
		n++
	}
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(n), "cpu-us/op")
}
