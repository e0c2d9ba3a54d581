package server

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// lockedBuffer is a bytes.Buffer safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestEmbeddedNATS_LogsReachAtrium: the embedded NATS server's own log
// lines (here its start-up notices) reach Atrium's log, tagged
// component=nats-server (issue 21: on a full disk the server's "JetStream
// out of resources" was never seen). Notices are at debug level, so the
// start-up banner does not flood a dev server's output; warnings are not.
func TestEmbeddedNATS_LogsReachAtrium(t *testing.T) {
	var info lockedBuffer
	natsLogger{slog.New(slog.NewTextHandler(&info, &slog.HandlerOptions{Level: slog.LevelInfo}))}.Noticef("banner %d", 1)
	natsLogger{slog.New(slog.NewTextHandler(&info, &slog.HandlerOptions{Level: slog.LevelInfo}))}.Warnf("JetStream out of %s", "resources")
	if got := info.String(); strings.Contains(got, "banner 1") || !strings.Contains(got, "JetStream out of resources") {
		t.Fatalf("at info level, notices should be hidden and warnings shown:\n%s", got)
	}
	var buf lockedBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ns, err := newEmbeddedNATS(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	out := buf.String()
	if !strings.Contains(out, "component=nats-server") || !strings.Contains(out, "Starting JetStream") {
		t.Fatalf("the embedded NATS server's start-up lines are not in Atrium's log:\n%s", out)
	}
}
