package actor

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// BenchmarkPrompts is BenchmarkPrompt's long-turn append path with the
// prompts sent batch at a time in one OpPrompts request (batch=1: one
// OpPrompt each), as a gateway sends a busy connection's prompt frames:
// cpu-us/prompt is the process's CPU time (node, NATS server and senders)
// per prompt.
func BenchmarkPrompts(b *testing.B) {
	for _, batch := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("senders=8/batch=%d", batch), func(b *testing.B) {
			e := newEnv(b)
			id := e.create("alice", command("sleep", "1000"))
			e.prompt(id, "alice", "warm up")
			var n atomic.Int64
			b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			cpu0 := cpuTime()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(int64(batch))
					c := session.Command{Op: session.OpPrompt, Text: "prompt", ClientID: fmt.Sprint("c", i)}
					if batch > 1 {
						c = session.Command{Op: session.OpPrompts, Prompts: make([]session.PromptItem, batch)}
						for j := range batch {
							c.Prompts[j] = session.PromptItem{Text: "prompt", ClientID: fmt.Sprint("c", i, "-", j)}
						}
					}
					rep, err := e.tryCmd(id, "alice", c)
					if err != nil || rep.Error != nil {
						b.Errorf("prompt: %v %v", err, rep.Error)
						return
					}
				}
			})
			elapsed := time.Since(start)
			cpu := cpuTime() - cpu0
			b.StopTimer()
			b.ReportMetric(float64(n.Load())/elapsed.Seconds(), "prompts/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(n.Load()), "cpu-us/prompt")
		})
	}
}
