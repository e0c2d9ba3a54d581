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
	"sync/atomic"
	"syscall"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// workspaceQuota gives each sandbox's workspace a file system of its own, of
// a fixed size: an ext4 image (sparse: it takes the host disk its files
// take) in the sandbox's directory, loop-mounted with nosuid and nodev on
// <sandbox dir>/disk. The workspace is the directory "workspace" inside it,
// not the mount point itself, so that a restore (compute/mount) can build
// the new tree beside it on the same file system and swap the two with one
// rename, which a mount point refuses. A write past the size fails with
// ENOSPC in the sandbox, and df there shows the quota, not the host disk.
// It needs root.
//
// A sandbox's size is its compute.Spec's DiskBytes (a session's
// settings.disk_bytes), else Config.WorkspaceBytes. It applies when the
// image is made, and when an unmounted image is next mounted (the sandbox's
// next open after a sleep or a node restart): an image of another size is
// resized first, offline, with resize2fs. A mounted image keeps its size
// until then. Growing always works (the host disk permitting); shrinking
// works when the files fit in the new size, else the open fails with an
// error saying so and the image is left as it was: raise disk_bytes (or
// delete files under the old size by setting it back) and the next open
// mounts it.
type workspaceQuota struct {
	bytes int64 // the default size, Config.WorkspaceBytes
	owner int   // uid and gid of the file system's root directory
	mkfs  string
	mount string
	umnt  string
}

// Names in a sandbox's directory with a quota.
const (
	// workspaceImage is the image file.
	workspaceImage = "disk.img"
	// diskDir is where the image is mounted; the workspace is
	// diskDir/workspace.
	diskDir = "disk"
)

// reservedPercent of a workspace image is for root (see makeImage).
const reservedPercent = 5

// quotaWorkspace is the workspace of a sandbox in dir with a quota.
func quotaWorkspace(dir string) string { return filepath.Join(dir, diskDir, "workspace") }

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

// attach mounts the image of the sandbox in dir on dir/disk, making it on
// first use and moving into it what the workspace held before (a workspace
// of a sandbox that ran without the quota, at dir/workspace or, after a
// best-effort fallback, at dir/disk/workspace). A fresh image is mounted
// beside its place first and moved onto it (mount --move), so if it cannot
// be mounted at all the error matches errNoLoop and nothing was changed.
// The workspace directory itself is made by the caller.
//
// bytes is the quota (0: q.bytes); *size is set to the mounted image's
// quota.
func (q *workspaceQuota) attach(dir string, bytes int64, size *atomic.Int64) error {
	if q == nil {
		return nil
	}
	if bytes <= 0 {
		bytes = q.bytes
	}
	disk := filepath.Join(dir, diskDir)
	if err := os.MkdirAll(disk, 0o755); err != nil {
		return err
	}
	if ok, err := mounted(disk); err != nil || ok {
		if ok && size.Load() == 0 {
			// Mounted by an earlier provider process: its size is the
			// image's.
			if st, err := os.Stat(filepath.Join(dir, workspaceImage)); err == nil {
				size.Store(st.Size() / 100 * (100 - reservedPercent))
			}
		}
		return err
	}
	img := filepath.Join(dir, workspaceImage)
	if st, err := os.Stat(img); err == nil {
		if err := waitReleased(img, imageReleaseTimeout); err != nil {
			return err
		}
		if st.Size() != imageSize(bytes) {
			if err := q.resize(img, st.Size(), bytes); err != nil {
				return err
			}
		}
		if err := q.mountImage(img, disk); err != nil {
			return err
		}
		size.Store(bytes)
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := q.makeImage(img, bytes); err != nil {
		return err
	}
	tmp := filepath.Join(dir, diskDir+".new")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := q.mountImage(img, tmp); err != nil {
		_ = os.Remove(img)
		return fmt.Errorf("%w: %w", errNoLoop, err)
	}
	newWS := filepath.Join(tmp, "workspace")
	err := os.Mkdir(newWS, 0o755)
	var olds []string
	for _, old := range []string{filepath.Join(dir, "workspace"), quotaWorkspace(dir)} {
		entries, rerr := os.ReadDir(old)
		if err != nil || rerr != nil || len(entries) == 0 {
			continue
		}
		olds = append(olds, old)
		cp := exec.Command("cp", "-a", old+"/.", newWS+"/")
		if out, cpErr := cp.CombinedOutput(); cpErr != nil {
			err = fmt.Errorf("move the workspace into its quota (%d bytes): %s", bytes, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		_ = q.run(q.umnt, tmp)
		_ = os.Remove(img)
		return err
	}
	// From here the image holds the workspace: it is kept whatever fails,
	// and the next attach mounts it.
	for _, old := range olds {
		if err := removeAll(old); err != nil {
			_ = q.run(q.umnt, tmp)
			return err
		}
	}
	if err := q.run(q.mount, "--move", tmp, disk); err != nil {
		// A parent mount with shared propagation refuses a move: mount
		// the image again, in its place.
		if err := q.run(q.umnt, tmp); err != nil {
			return err
		}
		if err := q.mountImage(img, disk); err != nil {
			return err
		}
	}
	size.Store(bytes)
	return nil
}

// imageSize is the size of the image file of a quota of bytes: 5% more,
// reserved for root (see makeImage).
func imageSize(bytes int64) int64 { return bytes / (100 - reservedPercent) * 100 }

// resize makes the unmounted image img, of has bytes, the image of a quota
// of bytes: it checks the file system (resize2fs wants a fresh check) and
// grows it into the longer file, or shrinks it and then the file. A shrink
// to less than the files take fails, saying so, and leaves the image as it
// was.
func (q *workspaceQuota) resize(img string, has, bytes int64) error {
	want := imageSize(bytes)
	fsck, err := exec.LookPath("e2fsck")
	if err == nil {
		var rs string
		if rs, err = exec.LookPath("resize2fs"); err == nil {
			// e2fsck -p exits 1 when it corrected something: the file
			// system is fine then.
			out, ferr := exec.Command(fsck, "-f", "-p", img).CombinedOutput()
			var ee *exec.ExitError
			if ferr != nil && !(errors.As(ferr, &ee) && ee.ExitCode() == 1) {
				return fmt.Errorf("check the workspace image before resizing it to %d bytes: %v: %s", bytes, ferr, strings.TrimSpace(string(out)))
			}
			if want > has {
				if err := os.Truncate(img, want); err != nil {
					return fmt.Errorf("grow the workspace image: %w", err)
				}
				if err := q.run(rs, img); err != nil {
					return fmt.Errorf("grow the workspace to %d bytes: %w", bytes, err)
				}
				return nil
			}
			if err := q.run(rs, img, strconv.FormatInt(want/1024, 10)+"K"); err != nil {
				return session.Errorf(session.CodeBadRequest,
					"the workspace quota cannot shrink to %d bytes (settings.disk_bytes): its files do not fit, or resize2fs failed; "+
						"raise disk_bytes, or set it back and delete files first (%v)", bytes, err)
			}
			return os.Truncate(img, want)
		}
	}
	return fmt.Errorf("resize the workspace quota to %d bytes: %w (install e2fsprogs)", bytes, err)
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

func (q *workspaceQuota) makeImage(img string, bytes int64) error {
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// 5% of the file system is reserved for root: the node, which
	// restores the saved workspace, not the sandbox (its user is the host
	// uid). A workspace the sandbox filled to its quota thus always fits
	// again in a fresh image, where the restore needs a little more than
	// the files for its staging tree's metadata. The image is that much
	// larger than the quota.
	err = f.Truncate(imageSize(bytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		id := strconv.Itoa(q.owner)
		err = q.run(q.mkfs, "-q", "-F", "-m", strconv.Itoa(reservedPercent), "-E", "root_owner="+id+":"+id, img)
	}
	if err != nil {
		_ = os.Remove(img)
		return fmt.Errorf("make the workspace image: %w", err)
	}
	return nil
}

// detach unmounts the image of the sandbox in dir if it is mounted.
func (q *workspaceQuota) detach(dir string) error {
	if q == nil {
		return nil
	}
	disk := filepath.Join(dir, diskDir)
	if ok, err := mounted(disk); err != nil || !ok {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return q.run(q.umnt, disk)
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

// withFull marks e DiskFull when the workspace's file system, of a quota of
// bytes, is full.
func (q *workspaceQuota) withFull(workspace string, bytes int64, e compute.Exit) compute.Exit {
	if q == nil {
		return e
	}
	if bytes <= 0 {
		bytes = q.bytes
	}
	if ok, err := mounted(filepath.Dir(workspace)); err != nil || !ok {
		return e // Running without its quota (Config.WorkspaceBestEffort).
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(workspace, &st); err != nil || int64(st.Bavail)*int64(st.Bsize) >= fullBelow {
		return e
	}
	e.DiskFull = true
	e.Detail += fmt.Sprintf("; the workspace quota of %d bytes is full", bytes)
	return e
}
