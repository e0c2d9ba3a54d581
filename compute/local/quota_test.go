package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// Issue 20 finding 4 (the /tmp part): a sandbox's /tmp has a size, and a
// write past it fails with ENOSPC inside the sandbox.
func TestSandbox_TmpSize(t *testing.T) {
	p := newTestProvider(t, Config{TmpBytes: 8 << 20})
	sb := computetest.Open(t, p, compute.Spec{Session: session.NewID()})
	r := computetest.Sh(t, sb, "df -k /tmp | tail -1; head -c 4194304 /dev/zero > /tmp/a && echo small-ok; head -c 16777216 /dev/zero > /tmp/b; echo exit=$?")
	if !strings.Contains(r.Stdout, "small-ok") || !strings.Contains(r.Stdout, "exit=1") ||
		!strings.Contains(r.Stderr, "No space left on device") {
		t.Fatalf("stdout %q stderr %q: want the 4 MiB write to succeed and the 16 MiB one to fail with ENOSPC", r.Stdout, r.Stderr)
	}
	if f := strings.Fields(r.Stdout); len(f) < 2 || f[1] != "8192" {
		t.Errorf("df shows /tmp as %q, want 8192 KiB", r.Stdout)
	}
}

// Issue 20 finding 4: with WorkspaceBytes, the workspace is a file system
// of that size: df shows it, a write past it fails with ENOSPC in the
// sandbox, what was in the workspace before is kept, and Destroy removes it.
func TestSandbox_WorkspaceQuota(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	dir := t.TempDir()
	id := session.NewID()
	ws := filepath.Join(dir, string(id), "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "kept"), []byte("before the quota\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newTestProvider(t, Config{Dir: dir, WorkspaceBytes: 32 << 20})
	sb := computetest.Open(t, p, compute.Spec{Session: id})
	r := computetest.Sh(t, sb, "cat kept; ls -A; df -k /workspace | tail -1; head -c 8388608 /dev/zero > small && echo small-ok; head -c 67108864 /dev/zero > big; echo exit=$?")
	if !strings.Contains(r.Stdout, "before the quota") || !strings.Contains(r.Stdout, "small-ok") ||
		!strings.Contains(r.Stdout, "exit=1") || !strings.Contains(r.Stderr, "No space left on device") {
		t.Fatalf("stdout %q stderr %q", r.Stdout, r.Stderr)
	}
	if !r.Exit.DiskFull || !strings.Contains(r.Exit.Detail, "quota of 33554432 bytes is full") {
		t.Errorf("exit %+v: want DiskFull and a detail naming the quota", r.Exit)
	}
	if r := computetest.Sh(t, sb, "rm big; echo ok"); r.Exit.DiskFull {
		t.Errorf("exit after freeing space %+v", r.Exit)
	}
	if strings.Contains(r.Stdout, "lost+found") {
		t.Errorf("the workspace shows lost+found: %q", r.Stdout)
	}
	disk := filepath.Join(dir, string(id), diskDir)
	if ok, err := mounted(disk); err != nil || !ok {
		t.Fatalf("workspace image mounted: %v %v", ok, err)
	}
	// The host sees the files through the mount.
	if b, err := os.ReadFile(filepath.Join(quotaWorkspace(filepath.Join(dir, string(id))), "kept")); err != nil || string(b) != "before the quota\n" {
		t.Errorf("host reads %q %v", b, err)
	}
	// A provider that closes unmounts it; the next one mounts it again.
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ok, err := mounted(disk); err != nil || ok {
		t.Fatalf("workspace image still mounted after Close: %v %v", ok, err)
	}
	p2 := newTestProvider(t, Config{Dir: dir, WorkspaceBytes: 32 << 20})
	sb2 := computetest.Open(t, p2, compute.Spec{Session: id, Fence: 2})
	if got := computetest.ShOK(t, sb2, "cat kept; wc -c < small"); got != "before the quota\n8388608\n" {
		t.Errorf("after a provider restart the workspace holds %q", got)
	}
	if err := sb2.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, string(id))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Destroy the sandbox directory remains: %v", err)
	}
}

// TestSandbox_WorkspaceQuotaBestEffort: when a new sandbox's image cannot be
// mounted (here mount itself fails, as it does with no free loop device),
// WorkspaceBestEffort runs the sandbox without the quota, its workspace
// as it was and no image left; without it, the sandbox fails, naming the
// quota. A sandbox whose image exists never falls back.
func TestSandbox_WorkspaceQuotaBestEffort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	for _, best := range []bool{true, false} {
		dir := t.TempDir()
		id := session.NewID()
		ws := filepath.Join(dir, string(id), "workspace")
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ws, "kept"), []byte("mine\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		p := newTestProvider(t, Config{Dir: dir, WorkspaceBytes: 32 << 20, WorkspaceBestEffort: best})
		p.quota.mount = "/bin/false" // no loop device for anyone
		sb, err := p.Open(context.Background(), compute.Spec{Session: id})
		if !best {
			if err == nil || !strings.Contains(err.Error(), "mount the workspace quota") {
				t.Errorf("without best effort, open: %v, want a failure naming the quota", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("best-effort open: %v", err)
		}
		if got := computetest.ShOK(t, sb, "cat kept"); got != "mine\n" {
			t.Errorf("the workspace without its quota holds %q", got)
		}
		if _, err := os.Stat(filepath.Join(dir, string(id), workspaceImage)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a failed mount left the image: %v", err)
		}
		if r := computetest.Sh(t, sb, "head -c 1048576 /dev/zero > f; echo ok"); r.Exit.DiskFull {
			t.Errorf("a workspace without its quota was reported full: %+v", r.Exit)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSandbox_WorkspaceQuotaRestore: a saved workspace restores into a
// sandbox with a quota (compute/mount builds the tree beside the workspace
// and swaps the two with one rename, which a mount point would refuse:
// the workspace is a directory inside the mounted image), and the restored
// files are the sandbox's.
func TestSandbox_WorkspaceQuotaRestore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	store := &blob.Dir{Path: t.TempDir()}
	id := session.NewID()
	p := newTestProvider(t, Config{WorkspaceBytes: 32 << 20})
	sb := computetest.Open(t, p, compute.Spec{Session: id})
	computetest.ShOK(t, sb, "mkdir -p src && echo 'package main' > src/main.go && echo notes > notes.txt")
	ctx := context.Background()
	vol := &mount.Volume{Blob: store, Prefix: mount.Prefix(id)}
	ws := sb.(*Sandbox).Workspace()
	ws.Blob = store // the node reaches the store itself
	if _, err := vol.Restore(ctx, ws, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := vol.Save(ctx, ws, 1); err != nil {
		t.Fatal(err)
	}
	computetest.ShOK(t, sb, "rm notes.txt && echo changed > src/main.go")
	// A fresh Volume restores the saved copy over what the sandbox changed,
	// as after a node restart.
	if _, err := (&mount.Volume{Blob: store, Prefix: mount.Prefix(id)}).Restore(ctx, ws, 2); err != nil {
		t.Fatalf("restore into a workspace with a quota: %v", err)
	}
	if got := computetest.ShOK(t, sb, "cat src/main.go notes.txt; df -k /workspace | tail -1 | awk '{print $2}'"); !strings.HasPrefix(got, "package main\nnotes\n") || len(strings.TrimSpace(strings.TrimPrefix(got, "package main\nnotes\n"))) > 5 {
		t.Errorf("after the restore the sandbox sees %q, want the saved files on the 32 MiB file system", got)
	}
}

// TestSandbox_WorkspaceQuotaPerSandbox: a compute.Spec's DiskBytes sizes
// the sandbox's workspace instead of WorkspaceBytes (a session's
// settings.disk_bytes). A new size applies when the image is next mounted:
// growing keeps the files; shrinking below them fails the open, saying so,
// and leaves the image as it was; shrinking to what fits works.
func TestSandbox_WorkspaceQuotaPerSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	dir := t.TempDir()
	id := session.NewID()
	reopen := func(fence int64, bytes int64) (*Provider, compute.Sandbox, error) {
		p := newTestProvider(t, Config{Dir: dir, WorkspaceBytes: 64 << 20})
		sb, err := p.Open(context.Background(), compute.Spec{Session: id, Fence: fence, DiskBytes: bytes})
		return p, sb, err
	}
	dfKiB := func(sb compute.Sandbox) int {
		f := strings.Fields(computetest.ShOK(t, sb, "df -k /workspace | tail -1"))
		if len(f) < 2 {
			t.Fatalf("df: %q", f)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	p, sb, err := reopen(1, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	if kib := dfKiB(sb); kib < 24<<10 || kib > 32<<10 {
		t.Errorf("df shows %d KiB, want the 32 MiB of DiskBytes, not WorkspaceBytes' 64 MiB", kib)
	}
	r := computetest.Sh(t, sb, "head -c 41943040 /dev/zero > big; echo exit=$?")
	if !strings.Contains(r.Stdout, "exit=1") || !strings.Contains(r.Stderr, "No space left on device") {
		t.Fatalf("a 40 MiB write into 32 MiB: stdout %q stderr %q, want ENOSPC", r.Stdout, r.Stderr)
	}
	if !r.Exit.DiskFull || !strings.Contains(r.Exit.Detail, "quota of 33554432 bytes is full") {
		t.Errorf("exit %+v: want DiskFull naming the sandbox's own quota", r.Exit)
	}
	computetest.ShOK(t, sb, "rm big && head -c 4194304 /dev/zero > kept && echo ok")
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Grown at the next mount: the files are kept and 60 MiB more fit.
	p, sb, err = reopen(2, 96<<20)
	if err != nil {
		t.Fatal(err)
	}
	if kib := dfKiB(sb); kib < 84<<10 || kib > 96<<10 {
		t.Errorf("after growing df shows %d KiB, want 96 MiB", kib)
	}
	if got := computetest.ShOK(t, sb, "wc -c < kept; head -c 62914560 /dev/zero > more && echo more-ok"); got != "4194304\nmore-ok\n" {
		t.Errorf("after growing: %q", got)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	// 64 MiB of files do not fit in 32 MiB: the open fails, saying so,
	// and the image keeps its size.
	img := filepath.Join(dir, string(id), workspaceImage)
	before, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = reopen(3, 32<<20)
	if err == nil || !strings.Contains(err.Error(), "cannot shrink to 33554432 bytes") || !errors.Is(err, session.ErrBadRequest) {
		t.Fatalf("shrinking below the files: %v, want a bad request saying the quota cannot shrink", err)
	}
	if after, err := os.Stat(img); err != nil || after.Size() != before.Size() {
		t.Errorf("the image changed after a refused shrink: %v → %v (%v)", before.Size(), after, err)
	}

	// Back at 96 MiB the files are there; with them deleted, 32 MiB fits.
	p, sb, err = reopen(4, 96<<20)
	if err != nil {
		t.Fatal(err)
	}
	computetest.ShOK(t, sb, "rm more && echo ok")
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, sb, err = reopen(5, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	if kib := dfKiB(sb); kib < 24<<10 || kib > 32<<10 {
		t.Errorf("after shrinking df shows %d KiB, want 32 MiB", kib)
	}
	if got := computetest.ShOK(t, sb, "wc -c < kept"); got != "4194304\n" {
		t.Errorf("after shrinking kept is %q bytes", got)
	}
}

// TestProvider_DiskBytesBad: a DiskBytes below 16 MiB or negative is a bad
// request.
func TestProvider_DiskBytesBad(t *testing.T) {
	p := newTestProvider(t, Config{WorkspaceBytes: 32 << 20, Unsafe: true})
	for _, n := range []int64{-1, 1 << 20} {
		_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID(), Fence: 1, DiskBytes: n})
		if !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("DiskBytes %d: %v, want a bad request", n, err)
		}
	}
}
