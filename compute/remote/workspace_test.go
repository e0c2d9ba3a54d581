package remote_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// storeAddr gives this host an address the netns VMs can reach (routed
// through their veth links) and returns it.
func storeAddr(tb testing.TB) string {
	tb.Helper()
	requireNetns(tb)
	hookDir(tb)
	addr := hookState.prefix + ".255.1"
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		tb.Fatalf("ip addr add %s dev lo: %v: %s", addr, err, out)
	}
	tb.Cleanup(func() { _ = exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").Run() })
	return addr
}

// workspaceScript fills a workspace with the kinds of things a save must
// keep.
const workspaceScript = `
set -e
mkdir -p src/pkg empty/nested bin
for i in $(seq 1 300); do echo "file $i" > src/pkg/f$i.txt; done
head -c 3000000 /dev/urandom > blob.bin
printf '#!/bin/sh\necho tool\n' > bin/tool && chmod 755 bin/tool
chmod 600 src/pkg/f1.txt
ln -s src/pkg/f2.txt link
ln -s /etc/passwd outside
`

// describeWorkspace prints what a save must keep of a workspace.
const describeWorkspace = "find . -printf '%p %y %m %l\\n' | LC_ALL=C sort && find . -type f -exec sha256sum {} + | LC_ALL=C sort"

func TestWorkspace_RoundTripThroughTheAgent(t *testing.T) {
	requireBwrap(t)
	addr := storeAddr(t)
	s3 := blobtest.StartS3On(t, addr)
	store := s3.Open(t, "")
	rec := newNetnsHook(t)
	rec.hook.(*remote.CommandHook).Env = append(rec.hook.(*remote.CommandHook).Env, "NETNS_HOOK_ROUTES="+addr+"/32")
	p := newProvider(t, rec, remote.Config{})
	ctx := context.Background()
	id := session.NewID()

	// The first owner restores (nothing saved yet), works, and saves.
	sb := computetest.Open(t, p, compute.Spec{Session: id, Fence: 1}).(*remote.Sandbox)
	vol := &mount.Volume{Blob: store, Prefix: mount.Prefix(id), Logger: testLogger(t)}
	if _, err := vol.Restore(ctx, sb.Workspace(), 1); err != nil {
		t.Fatalf("first restore: %v", err)
	}
	computetest.ShOK(t, sb, workspaceScript)
	want := computetest.ShOK(t, sb, describeWorkspace)
	st, err := vol.Save(ctx, sb.Workspace(), 1)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	t.Logf("save: %+v", st)
	if st.Files != 302 || st.Symlinks != 2 || st.Dirs != 5 || st.ObjectsWritten == 0 {
		t.Errorf("save stats %+v: want 302 files, 2 links, 5 dirs and some objects", st)
	}

	// A command still running refuses a restore: it would keep the old
	// tree.
	running := startRunning(t, sb)
	if _, err := vol.Restore(ctx, sb.Workspace(), 1); !errors.Is(err, session.ErrConflict) {
		t.Errorf("restore with a command running: %v; want conflict", err)
	}
	if err := running.Signal(9); err != nil {
		t.Fatal(err)
	}
	computetest.Finish(t, running, "")

	// The VM goes away; a new owner gets a fresh VM and restores into it.
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	sb2 := computetest.Open(t, p, compute.Spec{Session: id, Fence: 2}).(*remote.Sandbox)
	if got := computetest.ShOK(t, sb2, "ls -A | wc -l"); got != "0\n" {
		t.Fatalf("the fresh VM's workspace has %s entries", strings.TrimSpace(got))
	}
	vol2 := &mount.Volume{Blob: store, Prefix: mount.Prefix(id), Logger: testLogger(t)}
	st, err = vol2.Restore(ctx, sb2.Workspace(), 2)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Logf("restore: %+v", st)
	if got := computetest.ShOK(t, sb2, describeWorkspace); got != want {
		t.Errorf("restored workspace:\n%s\nwant:\n%s", got, want)
	}
	if got := computetest.ShOK(t, sb2, "./bin/tool && cat link"); got != "tool\nfile 2\n" {
		t.Errorf("restored tool and link: %q", got)
	}

	// An incremental save after changing one file uploads just that.
	computetest.ShOK(t, sb2, "echo changed > src/pkg/f7.txt")
	st, err = vol2.Save(ctx, sb2.Workspace(), 2)
	if err != nil {
		t.Fatalf("incremental save: %v", err)
	}
	if st.ObjectsWritten != 1 || st.BytesWritten > 64 {
		t.Errorf("incremental save wrote %d objects, %d bytes; want one small object", st.ObjectsWritten, st.BytesWritten)
	}
	// The old owner's volume is fenced off.
	if _, err := vol.Save(ctx, sb2.Workspace(), 1); err == nil {
		t.Errorf("save by the old owner succeeded")
	}
	if vms := rec.created(); len(vms) != 2 {
		t.Errorf("%d VMs, want 2", len(vms))
	}
}
