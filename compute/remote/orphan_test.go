package remote_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// returningHook returns the VM it already runs for a session, as `atrium
// vmhost` does, so that a restarted node finds its VM again.
type returningHook struct {
	*sleepingHook

	mu  sync.Mutex
	vms map[session.ID]remote.VM // guarded by mu
}

func (h *returningHook) CreateVM(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if vm, ok := h.vms[req.Session]; ok {
		return vm, nil
	}
	vm, err := h.sleepingHook.CreateVM(ctx, req)
	if err == nil {
		h.vms[req.Session] = vm
	}
	return vm, err
}

// TestSandbox_OrphanedSuspendedKilled: a node suspended a command (an
// agent process) and put the VM to sleep, then died; the new node finds the
// VM again, and its open kills the command nobody can attach to any more,
// so the workspace can be restored at once (instead of a conflict until the
// command's reattach timeout).
func TestSandbox_OrphanedSuspendedKilled(t *testing.T) {
	s3 := blobtest.StartS3(t)
	store := s3.Open(t, "")
	hook := &returningHook{sleepingHook: &sleepingHook{inProcessHook: newInProcessHook(t, true)}, vms: map[session.ID]remote.VM{}}
	ctx := context.Background()
	id := session.NewID()
	p1 := newProvider(t, &unwrapHook{Hook: hook, inner: hook.sleepingHook}, remote.Config{})
	sb1 := computetest.Open(t, p1, compute.Spec{Session: id, Fence: 1}).(*remote.Sandbox)
	vol := &mount.Volume{Blob: store, Prefix: mount.Prefix(id), Logger: testLogger(t)}
	if _, err := vol.Restore(ctx, sb1.Workspace(), 1); err != nil {
		t.Fatal(err)
	}
	computetest.ShOK(t, sb1, "echo kept > note")
	if _, err := vol.Save(ctx, sb1.Workspace(), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := sb1.Exec(ctx, compute.ExecRequest{Argv: counter}); err != nil {
		t.Fatal(err)
	}
	if err := sb1.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}

	// The node is gone: a new provider opens the same VM with a newer
	// fence and restores the workspace.
	p2 := newProvider(t, &unwrapHook{Hook: hook, inner: hook.sleepingHook}, remote.Config{})
	sb2 := computetest.Open(t, p2, compute.Spec{Session: id, Fence: 2}).(*remote.Sandbox)
	vol2 := &mount.Volume{Blob: store, Prefix: mount.Prefix(id), Logger: testLogger(t)}
	if _, err := vol2.Restore(ctx, sb2.Workspace(), 2); err != nil {
		if errors.Is(err, session.ErrConflict) {
			t.Fatalf("restore after the node that suspended a command died: %v (the orphaned command still counts as running)", err)
		}
		t.Fatal(err)
	}
	if out := computetest.ShOK(t, sb2, "cat note"); out != "kept\n" {
		t.Errorf("workspace after the restore: %q", out)
	}
	if n := len(hook.vms); n != 1 {
		t.Errorf("%d VMs, want the same one", n)
	}
}
