package server_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestServer_SandboxDefaultsPrivateDataDir: a data dir made 0700 (as Atrium
// makes it, and as `make run` left .atrium before) does not turn the host
// uid mapping off: the server lets others pass through it (0711), not list
// it, and what is in it keeps its own mode.
func TestServer_SandboxDefaultsPrivateDataDir(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	data := filepath.Join(searchableDir(t), ".atrium")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	tw := &testWriter{t: t}
	t.Cleanup(tw.stop)
	s := startStack(t, func(c *server.Config) {
		c.DataDir = data
		c.Sandbox.HostUID, c.Sandbox.HostUIDAuto = 231072, true
		c.Logger = newTestLogger(logs, tw)
	})
	if !strings.Contains(logs.String(), "sandboxes run as an unprivileged host uid") || strings.Contains(logs.String(), "mapping OFF") {
		t.Errorf("start-up did not turn the host uid mapping on:\n%s", logs.String())
	}
	modes := map[string]fs.FileMode{".": 0o711, "agent-homes": 0o711, "history": 0o700, "sandboxes": 0o711}
	for name, want := range modes {
		fi, err := os.Stat(filepath.Join(data, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %v, want %v", name, got, want)
		}
	}
	alice := s.as("alice")
	sess := alice.create("private data dir", nil)
	alice.prompt(sess.ID, "echo hi > mine.txt")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn: %+v", fin)
	}
	st, err := os.Stat(filepath.Join(data, "sandboxes", string(sess.ID), "workspace", "mine.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != 231072 {
		t.Errorf("a file made in the sandbox belongs to host uid %d, want 231072", uid)
	}
}
