package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// searchableDir returns a fresh directory every uid can search (t.TempDir's
// are 0700, which the sandbox host uid cannot pass).
func searchableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "atrium-hostuid-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestServer_SandboxDefaults: the workspace quota and the host uid mapping,
// as `atrium serve` turns them on by default: a file made in the sandbox
// belongs to the unprivileged host uid, a write past the quota fails with
// ENOSPC in the sandbox, and the turn gets an error event naming the full
// workspace and the setting (issue 20 findings 4 and 8).
func TestServer_SandboxDefaults(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	data := searchableDir(t)
	logs := &lockedBuffer{}
	tw := &testWriter{t: t}
	t.Cleanup(tw.stop)
	s := startStack(t, func(c *server.Config) {
		c.DataDir = data
		c.Sandbox.HostUID, c.Sandbox.HostUIDAuto = 231072, true
		c.Sandbox.WorkspaceDiskBytes, c.Sandbox.WorkspaceDiskAuto = 32<<20, true
		c.Logger = newTestLogger(logs, tw)
	})
	for _, want := range []string{"sandboxes run as an unprivileged host uid", "sandbox workspaces have a disk quota"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("start-up did not say %q", want)
		}
	}
	alice := s.as("alice")
	sess := alice.create("defaults", nil)
	alice.prompt(sess.ID, "echo hi > mine.txt && chmod u+s mine.txt && df -k /workspace | tail -1 && head -c 67108864 /dev/zero > big; echo exit=$?")
	fin := alice.waitTurn(sess.ID, 1)
	evs := alice.events(sess.ID, 0)
	out, errOut := outputOf(evs, 1, "stdout"), outputOf(evs, 1, "stderr")
	if !strings.Contains(out, "exit=1") || !strings.Contains(errOut, "No space left on device") {
		t.Errorf("the write past the quota: stdout %q stderr %q, want ENOSPC", out, errOut)
	}
	if f := strings.Fields(out); len(f) < 2 || f[1] == "" || len(f[1]) > 5 {
		t.Errorf("df in the sandbox shows %q, want the 32 MiB quota, not the host disk", out)
	}
	said := false
	for _, ev := range evs {
		if ev.Kind == session.KindError && strings.Contains(string(ev.Data), "workspace is full") &&
			strings.Contains(string(ev.Data), "workspace_disk_bytes") {
			said = true
		}
	}
	if !said {
		t.Errorf("no error event says the workspace is full (turn %+v)", fin)
	}
	st, err := os.Stat(filepath.Join(data, "sandboxes", string(sess.ID), "disk", "workspace", "mine.txt")) // inside the mounted image
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != 231072 {
		t.Errorf("a file made in the sandbox belongs to host uid %d, want 231072", uid)
	}
	// The saved workspace restores into a fresh sandbox with a quota, on
	// a node that lost its sandboxes.
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := s.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(data, "sandboxes")); err != nil {
		t.Fatal(err)
	}
	s = startStack(t, func(c *server.Config) {
		c.DataDir = data
		c.Sandbox.HostUID, c.Sandbox.HostUIDAuto = 231072, true
		c.Sandbox.WorkspaceDiskBytes, c.Sandbox.WorkspaceDiskAuto = 32<<20, true
	})
	alice = s.as("alice")
	// The restored files are the sandbox's: it can change them.
	alice.prompt(sess.ID, "echo more >> mine.txt && mkdir -p d && touch d/new && cat mine.txt")
	if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
		t.Fatalf("turn 2 after a restore into a sandbox with a quota: %+v (stderr %q)", fin, outputOf(alice.events(sess.ID, 0), 2, "stderr"))
	}
	if out := outputOf(alice.events(sess.ID, 0), 2, "stdout"); out != "hi\nmore\n" {
		t.Errorf("the restored workspace: %q", out)
	}
	// So are files uploaded into the awake sandbox, and their new parents.
	if status, body := alice.request("PUT", "/v1/sessions/"+string(sess.ID)+"/files/up/sub/f.txt", "uploaded\n"); status != 204 {
		t.Fatalf("upload: %d %s", status, body)
	}
	alice.prompt(sess.ID, "echo changed >> up/sub/f.txt && touch up/sub/g && cat up/sub/f.txt")
	if fin := alice.waitTurn(sess.ID, 3); fin.Status != session.TurnOK {
		t.Fatalf("turn 3 changing an uploaded file: %+v (stderr %q)", fin, outputOf(alice.events(sess.ID, 0), 3, "stderr"))
	}
}

// TestServer_SandboxDefaultsFallBack: where the host cannot provide the
// host uid mapping (here: the data dir is not searchable by that uid), the
// server starts without it and says so.
func TestServer_SandboxDefaultsFallBack(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	tw := &testWriter{t: t}
	t.Cleanup(tw.stop)
	s := startStack(t, func(c *server.Config) {
		c.Sandbox.HostUID, c.Sandbox.HostUIDAuto = 231072, true // t.TempDir is 0700
		c.Logger = newTestLogger(logs, tw)
	})
	for _, want := range []string{"sandbox host uid mapping OFF", "cannot reach", "sandbox workspaces have no disk quota"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("start-up did not say %q", want)
		}
	}
	alice := s.as("alice")
	sess := alice.create("fallback", nil)
	alice.prompt(sess.ID, "echo ok")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Errorf("a turn without the host uid mapping: %+v", fin)
	}
}
