package actor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// newEnvExternal is newEnv against a NATS server the node does not embed:
// its own JetStream store in storeDir, reached over TCP on 127.0.0.1, with
// no store guard (Config.StoreFull unset), as a production cluster is.
func newEnvExternal(t *testing.T, storeDir string) *env {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: storeDir, NoSigs: true})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.SetLoggerV2(natsTestLogger{t}, false, false, false)
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL(), nats.Name(name))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	e := &env{t: t, ns: ns, nc: connect("node"), gw: connect("gateway")}
	e.dir = &sqlite.Dir{Path: filepath.Join(t.TempDir(), "histories"), Logger: testLogger(t)}
	e.cfg = Config{
		NATS: e.nc, Histories: HistoriesOf(e.dir), SecretKeys: testSecretKeys, Provider: newProvider(t),
		NodeID: "n1", HibernateAfter: time.Minute, CancelGrace: time.Second, DrainGrace: 100 * time.Millisecond,
		Logger: testLogger(t),
	}
	e.start()
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	if e.kv, err = js.KeyValue(context.Background(), e.subj.CatalogBucket()); err != nil {
		t.Fatalf("catalog bucket: %v", err)
	}
	return e
}

// TestHost_ExternalJetStreamFull (issue 21 item 2): a NATS server of its
// own (not embedded: no store guard) whose JetStream store fills up answers
// the node's publishes with an error ack, "insufficient resources"
// (err_code 10023: the server's max_file_store, by default 75% of the free
// space of its store's file system at start, is reached). The prompt gets
// 503 unavailable naming the full store at once, not "capture … timed out"
// after the 30 s capture give-up; so does every prompt while the store is
// full; once the server accepts writes again the session serves by itself,
// with no gap in seq and the stream holding every event of the history.
//
// The store is filled for real: the server's StoreDir is on a 32 MiB
// tmpfs, and another stream is published to until the server refuses.
func TestHost_ExternalJetStreamFull(t *testing.T) {
	storeDir := smallFS(t, "32m")
	e := newEnvExternal(t, storeDir)
	// The capture give-up is left at its default (30 s): each answer
	// below must come well within it.
	const answerWithin = 10 * time.Second

	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo one")
	w.until("turn 1 finished", finished(1))

	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	filler, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatalf("filler stream: %v", err)
	}
	chunk := make([]byte, 256<<10)
	var refusedAck error
	for i := 0; refusedAck == nil; i++ {
		if i > 1000 {
			t.Fatal("the server took 250 MiB on a 32 MiB store without refusing")
		}
		if _, err := js.Publish(ctx, "filler", chunk); err != nil {
			refusedAck = err
		}
	}
	if !errors.Is(ajs.StoreFull(refusedAck), ajs.ErrStoreFull) {
		t.Fatalf("the full server refused a publish with %v, which is not recognised as a full store", refusedAck)
	}
	t.Logf("the server refuses publishes: %v", refusedAck)

	// Prompts while the store is full, for longer than the node's lease
	// TTL (its renewals are refused too): each is refused, at once, naming
	// the full store, with a retry hint; none is acknowledged (its event
	// could not be captured).
	fullFor := 2 * DefaultLeaseTTL
	for i, full := 0, time.Now(); i < 3 || time.Since(full) < fullFor; i++ {
		if i > 0 {
			time.Sleep(250 * time.Millisecond) // paces the prompts over the lease TTL
		}
		start := time.Now()
		rep, err := e.tryCmdWithin(id, "alice", session.Command{Op: session.OpPrompt, Text: "echo full", ClientID: fmt.Sprintf("full-%d", i)}, answerWithin)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("prompt %d on a full store: no answer within %v: %v", i, answerWithin, err)
		}
		if rep.Error == nil {
			t.Fatalf("prompt %d on a full store acknowledged at seq %d", i, rep.Seq)
		}
		t.Logf("prompt %d refused after %v: %v", i, took.Round(time.Millisecond), rep.Error)
		if rep.Error.Code != session.CodeUnavailable || !strings.Contains(rep.Error.Message, "JetStream store is full") ||
			strings.Contains(rep.Error.Message, "timed out") {
			t.Errorf("prompt %d: refused with %v; want unavailable naming the NATS server's full store", i, rep.Error)
		}
		if rep.Error.RetryAfterS <= 0 {
			t.Errorf("prompt %d: refused for the full store without a retry hint (retry_after_s %d)", i, rep.Error.RetryAfterS)
		}
	}

	// The server accepts writes again once the filler is gone.
	if err := filler.Purge(ctx); err != nil {
		t.Fatalf("purge the filler: %v", err)
	}
	var seq session.Seq
	for deadline := time.Now().Add(60 * time.Second); ; {
		rep, err := e.tryCmdWithin(id, "alice", session.Command{Op: session.OpPrompt, Text: "echo back", ClientID: "back"}, answerWithin)
		if err == nil && rep.Error == nil {
			seq = rep.Seq
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 60s after the server had room again: %+v %v", rep.Error, err)
		}
		time.Sleep(200 * time.Millisecond) // nothing to wait on for the node to take the session again
	}
	t.Logf("served again: prompt at seq %d", seq)
	waitTurnFinishedAfter(t, e, id, seq)
	checkHistory(t, e, id)
}
