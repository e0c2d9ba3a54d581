package actor

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// BenchmarkPrompt measures durable prompt throughput through NATS: many
// concurrent senders, each waiting for the {seq} that means committed.
// With harness "true" every prompt also queues a turn, which runs in a new
// sandbox process (the machine spends much of its time starting them) and
// whose events compete for the same log; with "long-turn" one turn runs for
// the whole benchmark and the prompts queue behind it, which measures the
// append path alone. cpu-us/prompt is the process's CPU time (node, NATS
// server and senders together) per prompt.
func BenchmarkPrompt(b *testing.B) {
	for _, senders := range []int{16, 64} {
		for _, harness := range []string{"true", "long-turn"} {
			b.Run(fmt.Sprintf("senders=%d/harness=%s", senders, harness), func(b *testing.B) {
				benchmarkPrompt(b, senders, harness)
			})
		}
	}
}

func benchmarkPrompt(b *testing.B, senders int, harness string) {
	e := newEnv(b)
	h := command("true")
	if harness == "long-turn" {
		h = command("sleep", "1000")
	}
	id := e.create("alice", h)
	e.prompt(id, "alice", "warm up")
	var n atomic.Int64
	b.SetParallelism(max(1, senders/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpPrompt, Text: fmt.Sprintf("prompt %d", i)})
			if err != nil || rep.Error != nil {
				b.Errorf("prompt: %v %v", err, rep.Error)
				return
			}
		}
	})
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	info := e.cmd(id, "alice", session.Command{Op: session.OpInfo})
	b.ReportMetric(float64(n.Load())/elapsed.Seconds(), "prompts/s")
	b.ReportMetric(float64(info.Session.LastSeq)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n.Load()), "cpu-us/prompt")
}

// cpuTime returns the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHistory measures history reads through NATS (500 events a page).
func BenchmarkHistory(b *testing.B) {
	e := newEnv(b)
	id := e.create("alice", command("true"))
	for range 500 {
		e.prompt(id, "alice", "some prompt text of a realistic length, say a sentence or two long.")
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpHistory, Limit: 500})
			if err != nil || rep.Error != nil || len(rep.Events) != 500 {
				b.Errorf("history: %v %v %d", err, rep.Error, len(rep.Events))
				return
			}
		}
	})
}

// BenchmarkWake measures a prompt to a hibernated session: no responders,
// place (open the history file, subscribe), retry, commit, reply.
func BenchmarkWake(b *testing.B) {
	e := newEnv(b, withHibernate(time.Millisecond))
	id := e.create("alice", command("true"))
	var rev uint64
	waitHibernated := func() {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			ent, err := e.kv.Get(context.Background(), string(id))
			if err == nil && ent.Revision() > rev {
				var c session.CatalogEntry
				json.Unmarshal(ent.Value(), &c)
				if c.State == session.StateHibernated {
					rev = ent.Revision()
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
		b.Fatal("session did not hibernate")
	}
	var total time.Duration
	for i := range b.N {
		b.StopTimer()
		waitHibernated()
		b.StartTimer()
		start := time.Now()
		rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpPrompt, Text: fmt.Sprintf("wake %d", i)})
		total += time.Since(start)
		if err != nil || rep.Error != nil {
			b.Fatalf("prompt: %v %v", err, rep.Error)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/wake")
}
