package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
)

// TestCapture_StoreFull (issue 21): a real nats-server that refuses a
// publish for lack of room answers with an error ack; Capture recognises
// it as ErrStoreFull and fails the batch at once instead of retrying it
// until GiveUp, and captures again once the server has room. Two limits
// give two different acks: the server's max_file_store ("insufficient
// resources", err_code 10023) and the account's JetStream max_storage
// ("resource limits exceeded for account", err_code 10002).
func TestCapture_StoreFull(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   func(*server.Options)
		account bool // set the limit on the account instead
		code    string
	}{
		{"server max_file_store", func(o *server.Options) { o.JetStreamMaxStore = 1 << 20 }, false, "10023"},
		{"account max_storage", nil, true, "10002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
			if tc.limit != nil {
				tc.limit(opts)
			}
			ns, err := server.NewServer(opts)
			if err != nil {
				t.Fatal(err)
			}
			ns.Start()
			t.Cleanup(func() {
				ns.Shutdown()
				ns.WaitForShutdown()
			})
			if !ns.ReadyForConnections(10 * time.Second) {
				t.Fatal("nats server not ready")
			}
			if tc.account {
				err := ns.GlobalAccount().UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{
					"": {MaxMemory: -1, MaxStore: 1 << 20, MaxStreams: -1, MaxConsumers: -1},
				})
				if err != nil {
					t.Fatalf("account limits: %v", err)
				}
			}
			nc, err := nats.Connect(ns.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, err := njs.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			stream, err := js.CreateStream(ctx, njs.StreamConfig{Name: "EVENTS", Subjects: []string{"ev.>"}, Storage: njs.FileStorage})
			if err != nil {
				t.Fatal(err)
			}
			filler, err := js.CreateStream(ctx, njs.StreamConfig{Name: "FILLER", Subjects: []string{"filler"}, Storage: njs.FileStorage})
			if err != nil {
				t.Fatal(err)
			}
			// Smaller and smaller messages, until not even one byte fits.
			for _, size := range []int{64 << 10, 1 << 10, 1} {
				for i := 0; ; i++ {
					if i == 2000 {
						t.Fatalf("2000 × %d bytes stored under a 1 MiB limit", size)
					}
					if _, err := js.Publish(ctx, "filler", make([]byte, size)); err != nil {
						t.Logf("the full server refuses %d bytes: %v", size, err)
						break
					}
				}
			}

			ev := ajs.NewEvents(nc, js, stream, "EVENTS", nil)
			ev.GiveUp = time.Hour // Capture must not wait for it.
			msg := func(n int) *nats.Msg {
				m := nats.NewMsg("ev.s1")
				m.Header.Set(njs.MsgIDHeader, fmt.Sprintf("s1:%d", n))
				m.Data = []byte(fmt.Sprintf(`{"seq":%d}`, n))
				return m
			}
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			_, err = ev.Capture(cctx, []*nats.Msg{msg(1)}, func() error { return nil })
			cancel()
			switch {
			case err == nil:
				t.Fatal("a capture into a full store succeeded")
			case !errors.Is(err, ajs.ErrStoreFull) || errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("capture into a full store: %v; want ErrStoreFull, without waiting for the context", err)
			case !strings.Contains(err.Error(), "the NATS server's JetStream store is full") || !strings.Contains(err.Error(), tc.code):
				t.Errorf("capture error %q does not name the NATS server's full store and its err_code %s", err, tc.code)
			}
			t.Logf("capture: %v", err)

			if err := filler.Purge(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := ev.Capture(ctx, []*nats.Msg{msg(1)}, func() error { return nil }); err != nil {
				t.Fatalf("capture once the server has room: %v", err)
			}
		})
	}
}

// TestStoreFull_Classify: errors that do not say the store is full are
// left alone.
func TestStoreFull_Classify(t *testing.T) {
	for _, err := range []error{nil, nats.ErrTimeout, context.DeadlineExceeded, &njs.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence: 3"}} {
		if got := ajs.StoreFull(err); errors.Is(got, ajs.ErrStoreFull) || got != err {
			t.Errorf("StoreFull(%v) = %v; want it unchanged", err, got)
		}
	}
}
