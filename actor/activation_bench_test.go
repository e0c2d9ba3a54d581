package actor

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// BenchmarkActivationCreate measures placement throughput on one node: 64
// concurrent place-create requests over NATS, each waiting for its reply
// (history file created, event captured, catalog entry written, Cmd
// subscribed). It shows whether concurrent activations overlap.
func BenchmarkActivationCreate(b *testing.B) {
	const clients = 64
	e := newEnv(b)
	e.create("alice", command("true")) // warm up
	ids := make(chan session.ID, b.N)
	for range b.N {
		ids <- session.NewID()
	}
	close(ids)
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for id := range ids {
				resp, err := e.request(e.subj.Place(), "alice", session.PlaceRequest{
					Op: session.PlaceCreate, Session: id, Title: "bench", Harness: command("true"),
				}, 30*time.Second)
				if err != nil {
					b.Errorf("create: %v", err)
					return
				}
				var rep session.Reply
				if err := json.Unmarshal(resp.Data, &rep); err != nil || rep.Error != nil {
					b.Errorf("create: %v %v", err, rep.Error)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "sessions/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/session")
}

// BenchmarkActivationWake measures wake throughput on one node: b.N
// hibernated sessions woken by 64 concurrent clients (command, no
// responders, place, retry), as a gateway does.
func BenchmarkActivationWake(b *testing.B) {
	const clients = 64
	e := newEnv(b, withHibernate(300*time.Millisecond))
	all := make([]session.ID, b.N)
	for i := range all {
		all[i] = e.create("alice", command("true"))
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(e.host.Leases()) > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%d sessions did not hibernate", len(e.host.Leases()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	ids := make(chan session.ID, b.N)
	for _, id := range all {
		ids <- id
	}
	close(ids)
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for id := range ids {
				rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpInfo})
				if err != nil || rep.Error != nil {
					b.Errorf("wake: %v %v", err, rep.Error)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "sessions/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/session")
}
