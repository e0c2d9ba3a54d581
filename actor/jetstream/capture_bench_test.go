package jetstream_test

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
)

// BenchmarkCapture measures Events.Capture of one commit's events (48
// message events of ~250 bytes) into a stream configured as the node's
// (subject transform, RePublish, two-minute duplicate window) on an
// embedded server reached in-process, as `atrium dev` runs it. cpu-µs/event
// is the process's CPU (client and server) per captured event: 15–19 µs
// on the 2-vCPU bench machine at load 15–18 (22–24 at load 24), most of it
// the server's (its
// file store writes each message, ~18 %; the stream's per-message work);
// nats.go's async publish and PubAck decoding are ~3 µs of it. Neither the
// stream's async persist mode nor core publishes with hand-parsed acks
// saved more than ~1 µs per event here (docs/benchmarks.md).
//
//	go test -run '^$' -bench Capture -benchtime 400x ./actor/jetstream/
func BenchmarkCapture(b *testing.B) {
	const perCommit = 48
	ns, err := server.NewServer(&server.Options{JetStream: true, StoreDir: b.TempDir(), NoLog: true, NoSigs: true, DontListen: true})
	if err != nil {
		b.Fatal(err)
	}
	ns.Start()
	b.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		b.Fatal("nats server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := njs.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.CreateStream(ctx, njs.StreamConfig{
		Name:             "BENCH_EVENTS",
		Subjects:         []string{"atrium.capture.*.events"},
		SubjectTransform: &njs.SubjectTransformConfig{Source: "atrium.capture.*.events", Destination: "atrium.session.{{wildcard(1)}}.events"},
		RePublish:        &njs.RePublish{Source: "atrium.session.*.events", Destination: "atrium.session.{{wildcard(1)}}.events"},
		Storage:          njs.FileStorage,
		Duplicates:       2 * time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	ev := ajs.NewEvents(nc, js, st, "BENCH_EVENTS", nil)
	pad := make([]byte, 150)
	for i := range pad {
		pad[i] = 'x'
	}
	seq := 0
	msgs := make([]*nats.Msg, perCommit)
	cpu0 := processCPU()
	b.ResetTimer()
	for range b.N {
		for i := range msgs {
			seq++
			data := fmt.Appendf(nil, `{"seq":%d,"epoch":"e1","time":"2026-11-26T05:00:00.000000000Z","kind":"message","by":"bench","data":{"text":"%s","client_id":"c%d"}}`, seq, pad, seq)
			msgs[i] = &nats.Msg{Subject: "atrium.capture.s1.events", Data: data,
				Header: nats.Header{njs.MsgIDHeader: []string{"e1." + strconv.Itoa(seq)}}}
		}
		if _, err := ev.Capture(ctx, msgs, func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N*perCommit), "cpu-µs/event")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
