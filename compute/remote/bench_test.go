package remote_test

import (
	"context"
	"io"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/remote"
)

// runTrue runs `true` in sb the way the session actor runs a harness:
// stdin closed, both outputs read to EOF, then Wait.
func runTrue(b *testing.B, sb compute.Sandbox) {
	pr, err := sb.Exec(context.Background(), compute.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		b.Fatal(err)
	}
	pr.Stdin().Close()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(io.Discard, pr.Stderr()) })
	_, _ = io.Copy(io.Discard, pr.Stdout())
	wg.Wait()
	if exit, err := pr.Wait(); err != nil || exit.Code != 0 {
		b.Fatalf("true: %+v, %v", exit, err)
	}
}

// measure runs fn b.N times and reports the median and 90th percentile.
func measure(b *testing.B, fn func()) {
	fn() // warm up
	d := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		fn()
		d = append(d, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(d[len(d)*9/10].Microseconds())/1000, "p90-ms")
}

// BenchmarkExec measures a command's round trip on a warm sandbox: a bare
// fork and exec of `true`, the local provider, and the remote provider
// with its agent across a network namespace (and in this process, on
// loopback), with and without bubblewrap.
//
//	go test -run '^$' -bench Exec -benchtime 200x ./compute/remote/
func BenchmarkExec(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		measure(b, func() {
			if err := exec.Command("true").Run(); err != nil {
				b.Fatal(err)
			}
		})
	})
	for _, mode := range []struct {
		name   string
		unsafe bool
	}{{"unsafe", true}, {"bwrap", false}} {
		b.Run("local-"+mode.name, func(b *testing.B) {
			p, err := local.New(local.Config{Dir: b.TempDir(), Unsafe: mode.unsafe, Logger: discard()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Close(context.Background()) })
			sb := computetest.Open(b, p, compute.Spec{})
			measure(b, func() { runTrue(b, sb) })
		})
		b.Run("remote-loopback-"+mode.name, func(b *testing.B) {
			p := newProvider(b, newInProcessHook(b, mode.unsafe), remote.Config{Logger: discard()})
			sb := computetest.Open(b, p, compute.Spec{})
			measure(b, func() { runTrue(b, sb) })
		})
		b.Run("remote-netns-"+mode.name, func(b *testing.B) {
			var args []string
			if mode.unsafe {
				args = append(args, "--unsafe-no-sandbox")
			}
			hook := newNetnsHook(b, args...)
			hook.hook.(*remote.CommandHook).Logger = discard()
			p := newProvider(b, hook, remote.Config{Logger: discard()})
			sb := computetest.Open(b, p, compute.Spec{})
			measure(b, func() { runTrue(b, sb) })
		})
	}
}
