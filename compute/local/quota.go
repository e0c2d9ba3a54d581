package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/atriumhq/atrium/compute"
)

// workspaceQuota gives each sandbox's workspace a file system of its own, of
// a fixed size: an ext4 image (sparse: it takes the host disk its files
// take) in the sandbox's directory, loop-mounted on the workspace with
// nosuid and nodev. A write past the size fails with ENOSPC in the sandbox,
// and df there shows the quota, not the host disk. It needs root.
type workspaceQuota struct {
	bytes int64
	owner int // uid and gid of the file system's root directory
	mkfs  string
	mount string
	umnt  string
}

// workspaceImage is the name of the workspace image in a sandbox's directory.
const workspaceImage = "workspace.img"

func newWorkspaceQuota(bytes int64, owner int) (*workspaceQuota, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a workspace quota needs atrium to run as root (it loop-mounts an image per sandbox)")
	}
	if bytes < 16<<20 {
		return nil, fmt.Errorf("a workspace quota of %d bytes is too small (at least 16 MiB)", bytes)
	}
	q := &workspaceQuota{bytes: bytes, owner: owner}
	for _, t := range []struct {
		dst  *string
		name string
	}{{&q.mkfs, "mkfs.ext4"}, {&q.mount, "mount"}, {&q.umnt, "umount"}} {
		p, err := exec.LookPath(t.name)
		if err != nil {
			return nil, fmt.Errorf("a workspace quota needs %s (e2fsprogs, util-linux): %w", t.name, err)
		}
		*t.dst = p
	}
	return q, nil
}

// mounted reports whether dir is a mount point.
func mounted(dir string) (bool, error) {
	var st, parent syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return false, err
	}
	if err := syscall.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// errNoLoop means a fresh image could not be mounted (no free loop device,
// say) and nothing was changed: with Config.WorkspaceBestEffort the sandbox
// runs without a quota.
var errNoLoop = errors.New("the workspace image could not be mounted")

// attach mounts the sandbox's image on workspace, making the image on first
// use and moving what the workspace held into it. A fresh image is mounted
// beside the workspace first and moved onto it (mount --move), so if it
// cannot be mounted at all the error matches errNoLoop and the workspace is
// as it was, without an image.
func (q *workspaceQuota) attach(dir, workspace string) error {
	if q == nil {
		return nil
	}
	if ok, err := mounted(workspace); err != nil || ok {
		return err
	}
	img := filepath.Join(dir, workspaceImage)
	if _, err := os.Stat(img); err == nil {
		return q.run(q.mount, "-o", "loop,nosuid,nodev", img, workspace)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := q.makeImage(img); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "workspace.new")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := q.run(q.mount, "-o", "loop,nosuid,nodev", img, tmp); err != nil {
		_ = os.Remove(img)
		return fmt.Errorf("%w: %w", errNoLoop, err)
	}
	_ = os.Remove(filepath.Join(tmp, "lost+found")) // not the session's file
	entries, err := os.ReadDir(workspace)
	if err == nil && len(entries) > 0 { // a workspace from before the quota: copy it in.
		cp := exec.Command("cp", "-a", workspace+"/.", tmp+"/")
		if out, cpErr := cp.CombinedOutput(); cpErr != nil {
			err = fmt.Errorf("move the workspace into its quota (%d bytes): %s", q.bytes, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		_ = q.run(q.umnt, tmp)
		_ = os.Remove(img)
		return err
	}
	// From here the image holds the workspace: it is kept whatever fails,
	// and the next attach mounts it.
	for _, e := range entries {
		if err := removeAll(filepath.Join(workspace, e.Name())); err != nil {
			_ = q.run(q.umnt, tmp)
			return err
		}
	}
	if err := q.run(q.mount, "--move", tmp, workspace); err != nil {
		// A parent mount with shared propagation refuses a move: mount
		// the image again, on the workspace.
		if err := q.run(q.umnt, tmp); err != nil {
			return err
		}
		return q.run(q.mount, "-o", "loop,nosuid,nodev", img, workspace)
	}
	return nil
}

// CheckWorkspaceQuota reports whether this host can give sandboxes a
// workspace quota (Config.WorkspaceBytes): atrium runs as root, mkfs.ext4,
// mount and umount are installed, and a loop device is free. The error says
// what is missing.
func CheckWorkspaceQuota() error {
	if _, err := newWorkspaceQuota(16<<20, 0); err != nil {
		return err
	}
	out, err := exec.Command("losetup", "-f").CombinedOutput()
	if err != nil {
		return fmt.Errorf("a workspace quota needs a free loop device (losetup -f: %s)", strings.TrimSpace(string(out)))
	}
	return nil
}

func (q *workspaceQuota) makeImage(img string) error {
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(q.bytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		id := strconv.Itoa(q.owner)
		err = q.run(q.mkfs, "-q", "-F", "-m", "0", "-E", "root_owner="+id+":"+id, img)
	}
	if err != nil {
		_ = os.Remove(img)
		return fmt.Errorf("make the workspace image: %w", err)
	}
	return nil
}

// detach unmounts the workspace if it is mounted.
func (q *workspaceQuota) detach(workspace string) error {
	if q == nil {
		return nil
	}
	if ok, err := mounted(workspace); err != nil || !ok {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return q.run(q.umnt, workspace)
}

func (q *workspaceQuota) run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fullBelow is the free space under which a workspace counts as full: less
// than a block or two is what a write that failed with ENOSPC leaves.
const fullBelow = 64 << 10

// withFull marks e DiskFull when the workspace's file system is full.
func (q *workspaceQuota) withFull(workspace string, e compute.Exit) compute.Exit {
	if q == nil {
		return e
	}
	if ok, err := mounted(workspace); err != nil || !ok {
		return e // Running without its quota (Config.WorkspaceBestEffort).
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(workspace, &st); err != nil || int64(st.Bavail)*int64(st.Bsize) >= fullBelow {
		return e
	}
	e.DiskFull = true
	e.Detail += fmt.Sprintf("; the workspace quota of %d bytes is full", q.bytes)
	return e
}
