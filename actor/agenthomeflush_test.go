package actor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/atriumhq/atrium/storage/blob"
)

// TestAwaitHomeFlush: the end of a turn of an agent that writes its
// transcript after it answers waits for that write (and no longer), waits
// at most homeFlushWait when it never comes, and does not wait for other
// agents.
func TestAwaitHomeFlush(t *testing.T) {
	store := &blob.Dir{Path: t.TempDir()}
	setup := func(flush bool) (*Host, *box, string) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "old.jsonl"), []byte("old\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Minute)
		os.Chtimes(filepath.Join(dir, "old.jsonl"), old, old)
		h := &Host{cfg: Config{Store: store}}
		b := &box{id: "s_flush", agent: &agentProc{flush: flush}}
		h.agents.setHome(b.id, &agentHome{dir: dir})
		return h, b, dir
	}

	t.Run("waits for the write after the answer", func(t *testing.T) {
		h, b, dir := setup(true)
		answered := time.Now()
		go func() {
			time.Sleep(200 * time.Millisecond) // The agent's late write, not synchronization.
			os.WriteFile(filepath.Join(dir, "transcript.jsonl"), []byte("answer\n"), 0o644)
		}()
		h.awaitHomeFlush(context.Background(), b, answered)
		if _, err := os.Stat(filepath.Join(dir, "transcript.jsonl")); err != nil {
			t.Fatalf("returned before the agent's write: %v", err)
		}
		if d := time.Since(answered); d >= homeFlushWait {
			t.Errorf("waited %v: the full bound, not until the write", d)
		}
	})
	t.Run("bounded when no write comes", func(t *testing.T) {
		h, b, _ := setup(true)
		answered := time.Now()
		h.awaitHomeFlush(context.Background(), b, answered)
		if d := time.Since(answered); d < homeFlushWait || d > homeFlushWait+time.Second {
			t.Errorf("waited %v, want about %v", d, homeFlushWait)
		}
	})
	t.Run("other agents are not waited for", func(t *testing.T) {
		h, b, _ := setup(false)
		answered := time.Now()
		h.awaitHomeFlush(context.Background(), b, answered)
		if d := time.Since(answered); d > homeFlushWait/2 {
			t.Errorf("waited %v for an agent that does not write after answering", d)
		}
	})
}
