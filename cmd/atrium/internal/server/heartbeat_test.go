package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// syncBuffer collects a server's logs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestHeartbeat_RestartIsNotAnotherProcess is issue 23's spurious WARN: a
// process restarted on the same data dir found its previous run's heartbeat
// still fresh (a crash, or a withdrawal that did not reach NATS) and warned
// that another process used its node id. Its data dir now says which
// instance ran there last; a real second process is still warned about.
func TestHeartbeat_RestartIsNotAnotherProcess(t *testing.T) {
	_, url := startNATSServer(t)
	const warn = "another process heartbeats with this node id"
	dataA := t.TempDir()
	start := func(dataDir string) (*server.Server, *syncBuffer) {
		t.Helper()
		logs := &syncBuffer{}
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		srv, err := server.Start(ctx, server.Config{
			Roles: []string{server.RoleGateway}, NATS: server.NATS{URLs: []string{url}}, NodeID: "gw-same",
			Listen: "127.0.0.1:0", DataDir: dataDir,
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		})
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		return srv, logs
	}
	stop := func(srv *server.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()

	first, _ := start(dataA)
	kv, err := js.KeyValue(ctx, server.NodesBucket(session.Subjects{}))
	if err != nil {
		t.Fatal(err)
	}
	beat, err := kv.Get(ctx, "gw-same")
	if err != nil {
		t.Fatal(err)
	}
	stop(first)
	// The first run "crashed": its heartbeat is still there and fresh.
	if _, err := kv.Put(ctx, "gw-same", beat.Value()); err != nil {
		t.Fatal(err)
	}
	again, logs := start(dataA)
	if strings.Contains(logs.String(), warn) {
		t.Fatalf("a restart on the same data dir warned:\n%s", logs)
	}
	// Another process with the same id (another data dir) is still warned
	// about, while the restarted one's heartbeat is fresh.
	deadline := time.Now().Add(waitLong)
	for {
		e, err := kv.Get(ctx, "gw-same")
		if err == nil && !bytes.Equal(e.Value(), beat.Value()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted process never wrote its heartbeat")
		}
		time.Sleep(20 * time.Millisecond)
	}
	other, otherLogs := start(t.TempDir())
	if !strings.Contains(otherLogs.String(), warn) {
		t.Errorf("a second process with the same node id was not warned about:\n%s", otherLogs)
	}
	stop(other)
	stop(again)
}
