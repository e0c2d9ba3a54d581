package sqlite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

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
