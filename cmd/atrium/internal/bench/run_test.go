package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/egress"
)

const childEnv = "ATRIUM_BENCH_TEST_CHILD"

// TestMain doubles as the memory scenario's watcher process: the test
// binary re-executes itself with childEnv set.
func TestMain(m *testing.M) {
	// Sandboxes reaching the model gateway (the agent scenario) run this
	// test binary as their forwarder, as they run the atrium binary.
	if egress.IsForwarder(os.Args) {
		syscall.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
	}
	if os.Getenv(childEnv) == "1" {
		os.Exit(watcherChildMain())
	}
	goleak.VerifyTestMain(m)
}

func watcherChildMain() int {
	if err := RunWatchers(context.Background(), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func startTestServer(ctx context.Context, o ServerOptions) (Server, error) {
	return server.Start(ctx, server.Config{Listen: "127.0.0.1:0", DataDir: o.DataDir, HibernateAfter: o.HibernateAfter,
		DrainGrace: time.Second, Logger: o.Logger})
}

func testChild(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, os.Args[0], args...)
	c.Env = append(os.Environ(), childEnv+"=1")
	c.WaitDelay = 5 * time.Second
	return c
}

// TestRun runs every scenario at a tiny size against real in-process
// servers and checks that each measure was taken and is consistent.
func TestRun(t *testing.T) {
	if _, err := RaiseFileLimit(); err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	rep, err := Run(t.Context(), Config{
		Start:              startTestServer,
		Child:              testChild,
		Sandboxed:          true,
		Watchers:           20,
		Duration:           400 * time.Millisecond,
		Rate:               50,
		MaxRampSteps:       1,
		Senders:            4,
		WSConns:            2,
		WSWindow:           4,
		WakeSamples:        4,
		ActivationSessions: 50,
		Sessions:           8,
		ResumeEvents:       300,
		ResumeRuns:         2,
		DataDir:            t.TempDir(),
		Progress:           &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + progress.String())
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + table.String())
	if rep.Failed() {
		t.Fatalf("a measure failed:\n%s", table.String())
	}
	rows := map[string]Result{}
	for _, r := range rep.Results {
		rows[r.Scenario+"/"+strings.SplitN(r.Measure, ",", 2)[0]] = r
	}
	want := map[string]func(Result) error{
		"fanout/commit→receive": func(r Result) error {
			// 20 watchers × 50 events/s × 0.4 s, every one delivered.
			if r.Samples != 20*20 {
				return fmt.Errorf("samples %d, want 400", r.Samples)
			}
			if !strings.Contains(r.Note, " 0 gaps") {
				return fmt.Errorf("note %q reports gaps", r.Note)
			}
			return nil
		},
		"fanout/publish→receive": func(r Result) error {
			if r.Samples != 20*20 {
				return fmt.Errorf("samples %d, want 400", r.Samples)
			}
			return nil
		},
		"fanout/max sustained fan-out (WebSocket)": positive,
		"fanout/server CPU per delivery at 50 ev/s (WebSocket)": func(r Result) error {
			if r.Value <= 0 || !strings.Contains(r.Note, "raw nats-server") {
				return fmt.Errorf("value %v note %q", r.Value, r.Note)
			}
			return nil
		},
		"fanout/max sustained fan-out (raw NATS)": positive,
		"append/durable append":                   positive,
		"wake/hibernated → prompt ack (REST)": func(r Result) error {
			if r.Samples != 4 {
				return fmt.Errorf("samples %d, want 4", r.Samples)
			}
			return nil
		},
		"activation/hibernated sessions woken by a history read": func(r Result) error {
			if r.Samples != 50 || r.Value <= 0 || r.Met == nil {
				return fmt.Errorf("samples %d value %v met %v", r.Samples, r.Value, r.Met)
			}
			return nil
		},
		"memory/server RSS per idle WebSocket watcher": positive,
		"memory/goroutines per hibernated session": func(r Result) error {
			if r.Met == nil {
				return fmt.Errorf("no verdict")
			}
			return nil
		},
		"resume/replay 300 events to a new WebSocket (after=0) over atrium.v1": func(r Result) error {
			if r.Samples != 2 || r.Median <= 0 {
				return fmt.Errorf("samples %d median %v", r.Samples, r.Median)
			}
			return nil
		},
		"resume/replay 300 events to a new WebSocket (after=0) over atrium.v1+batch": func(r Result) error {
			if r.Samples != 2 || r.Median <= 0 || !strings.Contains(r.Note, "atrium.v1's") {
				return fmt.Errorf("samples %d median %v note %q", r.Samples, r.Median, r.Note)
			}
			return nil
		},
	}
	for key, check := range want {
		r, ok := rows[key]
		if !ok {
			t.Errorf("no row %q", key)
			continue
		}
		if err := check(r); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}
}

func positive(r Result) error {
	if r.Value <= 0 {
		return fmt.Errorf("value %v, want > 0 (%s)", r.Value, r.Note)
	}
	return nil
}

// BenchmarkFanout measures the WebSocket fan-out path end to end: prompts
// committed by the node, published on NATS, dispatched by the gateway's hub
// and written to 100 watchers, as fast as 32 REST senders can go. It
// reports deliveries per second and the commit→receive percentiles.
func BenchmarkFanout(b *testing.B) {
	const watchers = 100
	if _, err := RaiseFileLimit(); err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	r := &runner{cfg: Config{Progress: io.Discard, Start: startTestServer, Logger: slog.New(slog.DiscardHandler)}, dir: b.TempDir(), start: time.Now()}
	d, err := r.startServer(ctx, "fanout", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	defer d.close(ctx)
	s, err := d.c.createSession(ctx, "bench", holdTurn())
	if err != nil {
		b.Fatal(err)
	}
	if err := startHold(ctx, d.c, s.ID); err != nil {
		b.Fatal(err)
	}
	cur, err := d.c.getSession(ctx, s.ID)
	if err != nil {
		b.Fatal(err)
	}
	set := newLocalSet()
	defer set.close()
	if err := set.openWS(ctx, d.srv.URL(), benchUser, s.ID, cur.LastSeq, watchers); err != nil {
		b.Fatal(err)
	}
	prod := newRESTProducer(d.c, s.ID, restProducerConns)
	defer prod.close()
	prod.seq.Store(cur.LastSeq)

	set.startPhase()
	h, _ := set.histogram()
	del0 := set.sink.delivered.Load()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		for !prod.fire() {
			time.Sleep(100 * time.Microsecond)
		}
	}
	if err := prod.flush(ctx); err != nil {
		b.Fatal(err)
	}
	last := prod.lastSeq()
	if !pollUntil(ctx, time.Minute, time.Millisecond, func() bool { st, _ := set.status(); return st.MinLast >= last }) {
		b.Fatalf("watchers did not catch up with seq %d", last)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	delivered := set.sink.delivered.Load() - del0
	if delivered < int64(b.N)*watchers {
		b.Fatalf("delivered %d, want %d", delivered, b.N*watchers)
	}
	b.ReportMetric(float64(delivered)/elapsed.Seconds(), "deliveries/s")
	b.ReportMetric(ms(h.Quantile(0.5)), "p50-ms")
	b.ReportMetric(ms(h.Quantile(0.99)), "p99-ms")
}
