package actor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// TestHost_AgentHomeRestore: an agent home is saved to the object store and
// restored on a node that does not hold it; a node that restarts with its
// own newer copy (written after the last save) keeps it and claims the
// saved copy for its next save; a node whose copy is older than the saved
// one (another node ran the session since) gets the saved copy.
func TestHost_AgentHomeRestore(t *testing.T) {
	store := &blob.Dir{Path: t.TempDir()}
	e := newEnv(t, withStore(store))
	h := e.host
	id := session.NewID()
	ctx := context.Background()
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	write := func(dir, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, ".claude"), 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, ".claude", "t.jsonl")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		// A later write is a later mtime, whatever the clock's grain.
		now := time.Now().Add(time.Duration(len(content)) * time.Second)
		os.Chtimes(p, now, now)
	}
	read := func(dir string) string {
		b, _ := os.ReadFile(filepath.Join(dir, ".claude", "t.jsonl"))
		return string(b)
	}
	restore := func(dir string, fence int64) bool {
		t.Helper()
		h.agents.setHome(id, nil) // a node that does not hold it (a restart, another node)
		swapped, err := h.restoreAgentHome(ctx, &box{id: id}, dir, fence)
		if err != nil {
			t.Fatalf("restore %s: %v", dir, err)
		}
		return swapped
	}
	save := func(fence int64) {
		t.Helper()
		if err := h.saveAgentHome(ctx, &box{id: id}, fence); err != nil {
			t.Fatalf("save: %v", err)
		}
	}

	write(a, "one\n")
	if restore(a, 5) || read(a) != "one\n" {
		t.Fatalf("first restore with nothing saved changed the home: %q", read(a))
	}
	save(5)

	// Node a restarts after writing more than it saved: it keeps its copy.
	write(a, "one\ntwo\n")
	if restore(a, 6) || read(a) != "one\ntwo\n" {
		t.Fatalf("a restart lost what was written after the last save: %q", read(a))
	}
	save(6)

	// Node b has none: it gets the saved copy, with the second line.
	if !restore(b, 7) || read(b) != "one\ntwo\n" {
		t.Fatalf("node b's restored home holds %q", read(b))
	}
	write(b, "one\ntwo\nthree\n")
	save(7)

	// Back on node a, whose copy is older than b's: the saved one wins.
	if !restore(a, 8) || read(a) != "one\ntwo\nthree\n" {
		t.Fatalf("node a kept its older copy: %q", read(a))
	}

	// A deleted session's saved home is gone.
	if err := h.deleteAgentHome(ctx, id); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(t.TempDir(), "c")
	if restore(c, 9) || read(c) != "" {
		t.Fatalf("after the delete a new node got %q", read(c))
	}
}
