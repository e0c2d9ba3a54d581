package vmhost_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/vmhost"
	"github.com/atriumhq/atrium/session"
)

// BenchmarkVM measures microVM sandboxes, one VM at a time:
//
//	go test -run '^$' -bench VM -benchtime 10x ./compute/vmhost/
//
// start: create to a healthy agent, as a clone of the snapshot template
// (made before the timer); exec-true: `true` through the remote provider
// on a warm VM; wake: restore of a VM saved to disk. Each reports p50 and
// p90; start also the host memory of an idle VM (QEMU's RSS).
func BenchmarkVM(b *testing.B) {
	srv, url := newBenchServer(b, 2)
	ctx := context.Background()
	b.Run("start", func(b *testing.B) {
		// The first VM makes the template.
		if _, err := srv.Create(ctx, remote.HookRequest{Session: "warm", SandboxID: "sb-warm"}); err != nil {
			b.Fatal(err)
		}
		srv.Destroy("sb-warm")
		var rss []int64
		measure(b, func(i int) time.Duration {
			id := fmt.Sprintf("sb-%d", i)
			start := time.Now()
			if _, err := srv.Create(ctx, remote.HookRequest{Session: "s", SandboxID: id}); err != nil {
				b.Fatal(err)
			}
			d := time.Since(start)
			time.Sleep(2 * time.Second) // idle, then measured
			rss = append(rss, srv.Status().VMs[0].RSSBytes)
			srv.Destroy(id)
			return d
		})
		slices.Sort(rss)
		b.ReportMetric(float64(rss[len(rss)/2])/(1<<20), "MiB-rss-p50")
	})
	b.Run("exec-true", func(b *testing.B) {
		p, err := remote.New(remote.Config{
			Hook: &remote.HTTPHook{URL: url, Header: http.Header{"Authorization": {"Bearer " + hostToken}}},
		})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close(ctx)
		sb, err := p.Open(ctx, compute.Spec{Session: "s_benchexectrue0000000000", Fence: 1})
		if err != nil {
			b.Fatal(err)
		}
		defer sb.Destroy(ctx)
		runTrue(b, sb)
		measure(b, func(int) time.Duration {
			start := time.Now()
			runTrue(b, sb)
			return time.Since(start)
		})
	})
	b.Run("wake", func(b *testing.B) {
		if _, err := srv.Create(ctx, remote.HookRequest{Session: "w", SandboxID: "sb-wake"}); err != nil {
			b.Fatal(err)
		}
		defer srv.Destroy("sb-wake")
		measure(b, func(int) time.Duration {
			if err := srv.Sleep(ctx, "sb-wake"); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if err := srv.Wake(ctx, "sb-wake"); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		})
	})
}

// BenchmarkVMCrowded measures the start of a VM (a clone) while n idle VMs
// run on the same VM host, to find how many VMs it takes to double the
// start time:
//
//	go test -run '^$' -bench VMCrowded -benchtime 3x ./compute/vmhost/
func BenchmarkVMCrowded(b *testing.B) {
	srv, _ := newBenchServer(b, 8)
	ctx := context.Background()
	if _, err := srv.Create(ctx, remote.HookRequest{Session: "warm", SandboxID: "sb-warm"}); err != nil {
		b.Fatal(err)
	}
	srv.Destroy("sb-warm")
	for _, idle := range []int{0, 2, 4, 6} {
		for i := len(srv.Status().VMs); i < idle; i++ {
			if _, err := srv.Create(ctx, remote.HookRequest{Session: session.ID(fmt.Sprintf("idle%d", i)), SandboxID: fmt.Sprintf("sb-idle%d", i)}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("idle-%d", idle), func(b *testing.B) {
			measure(b, func(i int) time.Duration {
				id := fmt.Sprintf("sb-m%d", i)
				start := time.Now()
				if _, err := srv.Create(ctx, remote.HookRequest{Session: "m", SandboxID: id}); err != nil {
					b.Fatal(err)
				}
				d := time.Since(start)
				srv.Destroy(id)
				return d
			})
		})
	}
}

func newBenchServer(b *testing.B, maxVMs int) (*vmhost.Server, string) {
	dir, err := buildTestImage()
	if err != nil {
		b.Fatal(err)
	}
	srv, err := vmhost.New(vmhost.Config{Dir: dir, StateDir: b.TempDir(), Token: hostToken, Version: imageVersion, MaxVMs: maxVMs})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	b.Cleanup(func() {
		hs.Close()
		srv.Close()
	})
	return srv, hs.URL
}

// runTrue runs `true` in sb the way the session actor runs a harness.
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

// measure runs fn b.N times and reports the median and 90th percentile
// of the durations it returns.
func measure(b *testing.B, fn func(i int) time.Duration) {
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ds = append(ds, fn(i))
	}
	b.StopTimer()
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds())/1000, "ms-p90")
}
