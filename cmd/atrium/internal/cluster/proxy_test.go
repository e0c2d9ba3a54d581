package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestHarness_NATSAndProxy checks the harness itself: the three servers form
// a JetStream cluster that holds an R3 bucket, a client behind a proxy
// learns of no other server, and a partition cuts it off until healed.
func TestHarness_NATSAndProxy(t *testing.T) {
	servers := startNATSCluster(t, natsServers)
	px := StartProxy(t, servers[0].Addr().String())

	var disconnected, reconnected = make(chan struct{}, 16), make(chan struct{}, 16)
	nc, err := nats.Connect("nats://"+px.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disconnected <- struct{}{} }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	defer nc.Close()
	if d := nc.DiscoveredServers(); len(d) != 0 {
		t.Fatalf("the client discovered servers %v: a partitioned node could reach NATS around its proxy", d)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "harness", Replicas: 3, TTL: time.Minute})
	if err != nil {
		t.Fatalf("create an R3 bucket: %v", err)
	}
	rev, err := kv.Create(ctx, "lease.x", []byte(`{"node":"node-a"}`))
	if err != nil {
		t.Fatalf("create a key: %v", err)
	}

	// The test's own connection to another server sees the write.
	other, err := nats.Connect(servers[2].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ojs, _ := jetstream.New(other)
	okv, err := ojs.KeyValue(ctx, "harness")
	if err != nil {
		t.Fatalf("open the bucket from server 2: %v", err)
	}
	e, err := okv.Get(ctx, "lease.x")
	if err != nil || e.Revision() != rev || parseLease(e).Node != "node-a" {
		t.Fatalf("read from server 2: %v, %v", e, err)
	}

	px.Partition()
	select {
	case <-disconnected:
	case <-time.After(waitBound):
		t.Fatal("the client was not disconnected by the partition")
	}
	// The client buffers while it reconnects: the write can only time out.
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	_, err = kv.Update(pctx, "lease.x", []byte(`{"node":"node-a"}`), rev)
	pcancel()
	if err == nil {
		t.Fatal("a write through a partitioned proxy succeeded")
	}
	// The bucket is writable from the rest of the cluster meanwhile.
	if _, err := okv.Update(ctx, "lease.x", []byte(`{"node":"node-b"}`), rev); err != nil {
		t.Fatalf("write from server 2 during the partition: %v", err)
	}
	px.Heal()
	select {
	case <-reconnected:
	case <-time.After(waitBound):
		t.Fatal("the client did not reconnect after the partition healed")
	}
	_, err = kv.Update(ctx, "lease.x", []byte(`{"node":"node-a"}`), rev)
	if !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("a stale-revision update after the heal: %v, want ErrKeyExists (the fence)", err)
	}
}
