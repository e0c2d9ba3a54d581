package server_test

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newTestLogger logs to logs and to the test log.
func newTestLogger(logs *lockedBuffer, tw *testWriter) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(logs, tw), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// waitLog polls logs until it holds want.
func waitLog(t *testing.T, logs *lockedBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the log never said %q within %v", want, waitLong)
		}
		time.Sleep(50 * time.Millisecond) // Polling interval, not synchronization.
	}
}

// TestServer_StoreDownAtStart: with S3 storage and the object store down,
// the server starts, says what waits for the store, serves sessions and
// history, fails a turn that needs its workspace with an error naming the
// object store, and once the store is back (versitygw started again) says
// so and runs turns, with nothing restarted (issue 21 item 6).
func TestServer_StoreDownAtStart(t *testing.T) {
	t.Parallel()
	s3 := blobtest.StartS3(t)
	s3.Stop()
	logs := &lockedBuffer{}
	tw := &testWriter{t: t}
	t.Cleanup(tw.stop) // Runs after the stack's Close.
	s := startStack(t, func(c *server.Config) {
		c.Storage = server.Storage{Type: server.StorageS3, S3: s3.Config("atrium/")}
		c.Logger = newTestLogger(logs, tw)
	})
	if !strings.Contains(logs.String(), "OBJECT STORE UNAVAILABLE") || !strings.Contains(logs.String(), "sandboxes cannot restore or save") {
		t.Errorf("start-up did not say the object store is unavailable and what waits for it")
	}

	alice := s.as("alice")
	sess := alice.create("while the store is down", nil)
	alice.prompt(sess.ID, "echo first")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status == session.TurnOK {
		t.Errorf("a turn ran while its workspace could not be restored: %+v", fin)
	}
	said := false
	for _, ev := range alice.events(sess.ID, 0) {
		if (ev.Kind == session.KindError || ev.Kind == session.KindSandbox) && strings.Contains(string(ev.Data), "object store unavailable") {
			said = true
		}
	}
	if !said {
		t.Errorf("no event of the session names the unavailable object store")
	}
	if got := alice.get(sess.ID); got.ID != sess.ID {
		t.Errorf("the session is not served while the store is down: %+v", got)
	}

	s3.Start()
	waitLog(t, logs, "object store available again")
	alice.prompt(sess.ID, "echo second > f.txt && cat f.txt")
	if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
		t.Fatalf("turn 2 after the store came back: %+v", fin)
	}
	if out := outputOf(alice.events(sess.ID, 0), 2, "stdout"); out != "second\n" {
		t.Errorf("turn 2 printed %q", out)
	}
}
