package remote_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// TestSandbox_MountSavedAndRestored: the directory a VM keeps for a mount
// (an agent's home) is saved to the object store through the agent, like
// the workspace, and restored into a fresh VM; a restore is refused while
// a command runs, and a path the sandbox has no kept mount at is not
// found.
func TestSandbox_MountSavedAndRestored(t *testing.T) {
	root := t.TempDir()
	home := filepath.Join(root, "homes", "s1")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "settings.json"), []byte(`{"mode":"auto"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s3 := blobtest.StartS3(t)
	store := s3.Open(t, "")
	rec := newRecorder(t, newInProcessHook(t, false))
	p := newProvider(t, rec, remote.Config{AgentsDir: filepath.Join(root, "agents")})
	if !p.KeepsMounts() || p.SleepKeepsProcesses() {
		t.Errorf("KeepsMounts %v, SleepKeepsProcesses %v with a hook that cannot sleep; want true, false", p.KeepsMounts(), p.SleepKeepsProcesses())
	}
	ctx := context.Background()
	id := session.NewID()
	mounts := []compute.Mount{{Host: home, Sandbox: "/home/agent"}}
	prefix := "sessions/" + string(id) + "/agent-home/"

	sb := computetest.Open(t, p, compute.Spec{Session: id, Fence: 1, Mounts: mounts}).(*remote.Sandbox)
	vol := &mount.Volume{Blob: store, Prefix: prefix, Logger: testLogger(t)}
	if _, err := vol.Restore(ctx, sb.Mount("/home/agent"), 1); err != nil {
		t.Fatalf("first restore (nothing saved): %v", err)
	}
	computetest.ShOK(t, sb, "mkdir -p /home/agent/.claude/projects && echo line1 > /home/agent/.claude/projects/t.jsonl && echo work > note")
	st, err := vol.Save(ctx, sb.Mount("/home/agent"), 1)
	if err != nil {
		t.Fatalf("save the home: %v", err)
	}
	if st.Files != 2 {
		t.Errorf("saved %d files of the home, want 2 (settings.json and the transcript): %+v", st.Files, st)
	}
	if _, err := vol.Save(ctx, sb.Mount("/nothing"), 1); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("save of a path with no kept mount: %v; want not found", err)
	}
	running := startRunning(t, sb)
	if _, err := vol.Restore(ctx, sb.Mount("/home/agent"), 1); !errors.Is(err, session.ErrConflict) {
		t.Errorf("restore of the home with a command running: %v; want conflict", err)
	}
	if err := running.Signal(9); err != nil {
		t.Fatal(err)
	}
	computetest.Finish(t, running, "")

	// The VM is lost; a fresh one has the node's settings only, until
	// the saved home is restored into it.
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	sb2 := computetest.Open(t, p, compute.Spec{Session: id, Fence: 2, Mounts: mounts}).(*remote.Sandbox)
	if r := computetest.Sh(t, sb2, "cat /home/agent/.claude/projects/t.jsonl"); r.Exit.Code == 0 {
		t.Fatalf("a fresh VM already holds the transcript: %q", r.Stdout)
	}
	vol2 := &mount.Volume{Blob: store, Prefix: prefix, Logger: testLogger(t)}
	if _, err := vol2.Restore(ctx, sb2.MountWorkspace("/home/agent"), 2); err != nil {
		t.Fatalf("restore the home into a fresh VM: %v", err)
	}
	if r := computetest.Sh(t, sb2, "cat /home/agent/.claude/projects/t.jsonl /home/agent/settings.json; ls"); r.Stdout != "line1\n{\"mode\":\"auto\"}" {
		t.Errorf("the restored home and the workspace: %q (stderr %q); want the transcript, the settings and an empty workspace", r.Stdout, r.Stderr)
	}
	if vms := rec.created(); len(vms) != 2 {
		t.Errorf("%d VMs, want 2", len(vms))
	}
}
