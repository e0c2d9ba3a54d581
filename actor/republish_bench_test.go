package actor

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// BenchmarkEventsDelivery measures what the events stream's RePublish costs
// a watcher: the time from an owner's publish of one event to its arrival
// at a subscriber of the session's events subject, when the subscriber
// receives the publish itself (the events subject was the stream's own
// subject: "direct", the older configuration) and when it receives the
// stream's republish of the stored message ("republish", eventsStreamConfig).
// The owner waits for the stream's ack in both, as captureEvents does. R1 on
// one server, and R3 on three clustered servers with publisher and
// subscriber on different servers.
//
//	go test -run '^$' -bench EventsDelivery -benchtime 2000x ./actor/
func BenchmarkEventsDelivery(b *testing.B) {
	subj := session.Subjects{}
	const id = session.ID("s_bench")
	for _, r := range []int{1, 3} {
		var pubURL, subURL string
		if r == 1 {
			ns := startJetStream(b)
			pubURL, subURL = ns.ClientURL(), ns.ClientURL()
		} else {
			c := newNATSCluster(b)
			pubURL, subURL = c.url(0), c.url(1)
		}
		for _, mode := range []string{"direct", "republish"} {
			b.Run(mode+"/R"+strconv.Itoa(r), func(b *testing.B) {
				pub := connectURL(b, pubURL, "owner")
				sub := connectURL(b, subURL, "gateway")
				js, err := jetstream.New(pub)
				if err != nil {
					b.Fatal(err)
				}
				cfg := eventsStreamConfig(&Config{Replicas: r, EventsMaxAge: time.Hour})
				to := subj.Capture(id)
				if mode == "direct" {
					cfg.Subjects, cfg.SubjectTransform, cfg.RePublish = []string{subj.AllEvents(), subj.AllMeta()}, nil, nil
					to = subj.Events(id)
				}
				ctx := context.Background()
				js.DeleteStream(ctx, cfg.Name)
				if _, err := js.CreateStream(ctx, cfg); err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				s, err := sub.Subscribe(subj.Events(id), func(*nats.Msg) { got <- time.Now() })
				if err != nil {
					b.Fatal(err)
				}
				defer s.Unsubscribe()
				sub.Flush()
				data := []byte(`{"seq":1,"epoch":"e","time":"2026-11-26T00:00:00Z","kind":"output","by":"system","data":{"turn":1,"stream":"stdout","text":"hello"}}`)
				// Msg-Ids of this run only: a duplicate of an earlier run's
				// (a stream not yet deleted) is not republished.
				run := session.NewEpoch()
				var total time.Duration
				b.ResetTimer()
				for i := range b.N {
					msg := &nats.Msg{Subject: to, Data: data, Header: nats.Header{jetstream.MsgIDHeader: []string{run + "." + strconv.Itoa(i)}}}
					start := time.Now()
					if _, err := js.PublishMsg(ctx, msg); err != nil {
						b.Fatal(err)
					}
					select {
					case at := <-got:
						total += at.Sub(start)
					case <-time.After(10 * time.Second):
						b.Fatal("the subscriber received nothing")
					}
				}
				b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs/delivery")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
