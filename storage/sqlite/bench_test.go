package sqlite_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// BenchmarkAppend appends batches of ~300-byte events; one op is one batch
// (one transaction).
func BenchmarkAppend(b *testing.B) {
	for _, sync := range []string{sqlite.SyncNormal, sqlite.SyncFull} {
		for _, size := range []int{1, 16, 128} {
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
