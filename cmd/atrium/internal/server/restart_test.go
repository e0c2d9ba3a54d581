package server_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestServer_RestartMidTurn stops a server (draining: the running turn is
// cancelled after the grace) while a watcher streams, starts a new one on
// the same data dir, and checks that every event the watcher saw live is in
// the new server's history at the same seq, byte for byte, and that a
// watcher resuming from its cursor gets what came after.
func TestServer_RestartMidTurn(t *testing.T) {
	t.Parallel()
	logs := &testWriter{t: t}
	t.Cleanup(logs.stop)
	cfg := server.Config{
		Listen:         "127.0.0.1:0",
		DataDir:        t.TempDir(),
		HibernateAfter: time.Hour,
		CancelGrace:    time.Second,
		DrainGrace:     20 * time.Second,
		Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
	start := func() *server.Server {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		srv, err := server.Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start server: %v", err)
		}
		return srv
	}
	stop := func(srv *server.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("close server: %v", err)
		}
	}
	srv := start()
	s := &stack{t: t, srv: srv, url: srv.URL()}
	alice := s.as("alice")
	sess := alice.create("restart", map[string]any{"command": []string{bash, "-c", `
read -r input
case "$input" in
*'"prompt":"ticks'*) for i in $(seq 1 3000); do echo "tick $i"; sleep 0.02; done ;;
*) echo "ran turn $ATRIUM_TURN" ;;
esac
`}})
	w := alice.watch(sess.ID, 0)
	alice.prompt(sess.ID, "ticks")
	var seen []event
	for !strings.Contains(outputOf(seen, 1, "stdout"), "tick 50\n") {
		seen = append(seen, w.eventsUntil(0)...)
	}
	stop(srv)
	// Whatever else reached the watcher before the server went away.
	for {
		f, ok := <-w.frames
		if !ok {
			break
		}
		if f.Type == session.FrameEvent {
			seen = append(seen, parseEvent(t, f.Event))
		}
	}
	srv = start()
	t.Cleanup(func() { stop(srv) })
	s = &stack{t: t, srv: srv, url: srv.URL()}
	alice = s.as("alice")
	alice.prompt(sess.ID, "after the restart")
	alice.waitTurn(sess.ID, 2)
	rest := alice.events(sess.ID, 0)
	checkContiguous(t, "history after the restart", rest, 1, rest[len(rest)-1].Seq)
	if len(rest) < len(seen) {
		t.Fatalf("history after the restart has %d events, the watcher saw %d live", len(rest), len(seen))
	}
	sameBytes(t, "seen live vs history after the restart", seen, rest[:len(seen)])
	w2 := alice.watch(sess.ID, seen[len(seen)-1].Seq)
	got := w2.eventsUntil(rest[len(rest)-1].Seq)
	if got[0].Seq != seen[len(seen)-1].Seq+1 {
		t.Fatalf("resumed at seq %d, want %d", got[0].Seq, seen[len(seen)-1].Seq+1)
	}
}
