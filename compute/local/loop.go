package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// loopAttempts bounds how often attachLoop asks for another free loop
// device after the one it was given was taken by someone else first.
const loopAttempts = 32

// attachLoop binds the image img to a free loop device with autoclear set
// and returns the device's path and an open handle on it. The caller mounts
// the device and then closes the handle: the mount keeps the device bound,
// and the kernel unbinds it at unmount; closed before a mount, the device
// is unbound at once.
//
// This is what `mount -o loop` does, less its reuse of a loop device that
// is already bound to the same file: right after an unmount that device can
// still be releasing (autoclear runs on the last close), and mount(8) then
// fails with "already mounted or mount point busy". Two processes asking
// for a free device at once are told the same number; the loser's
// LOOP_CONFIGURE fails with EBUSY and it asks again.
func attachLoop(img string) (string, *os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open the loop control device: %w", err)
	}
	defer ctl.Close()
	backing, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return "", nil, err
	}
	defer backing.Close()
	for range loopAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return "", nil, fmt.Errorf("open %s: %w", dev, err)
		}
		err = configureLoop(int(f.Fd()), int(backing.Fd()), img)
		if err == nil {
			return dev, f, nil
		}
		f.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("bind %s to %s: %w", img, dev, err)
		}
	}
	return "", nil, fmt.Errorf("bind %s to a loop device: every free device was taken first, %d times", img, loopAttempts)
}

// configureLoop binds the loop device fd to the file backing with
// autoclear, in one LOOP_CONFIGURE (Linux 5.8), or with LOOP_SET_FD and
// LOOP_SET_STATUS64 on older kernels.
func configureLoop(fd, backing int, name string) error {
	cfg := unix.LoopConfig{Fd: uint32(backing)}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], name)
	err := unix.IoctlLoopConfigure(fd, &cfg)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_FD, backing); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(fd, &cfg.Info); err != nil {
		_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// mountImage mounts the ext4 image img on dir, nosuid and nodev, through a
// loop device of its own (see attachLoop).
func (q *workspaceQuota) mountImage(img, dir string) error {
	dev, f, err := attachLoop(img)
	if err != nil {
		return err
	}
	defer f.Close()
	return q.run(q.mount, "-o", "nosuid,nodev", dev, dir)
}

// imageReleaseTimeout bounds how long attach waits for an image unmounted a
// moment ago to be released by the kernel.
const imageReleaseTimeout = 10 * time.Second

// waitReleased waits until no loop device is bound to img. An unmount
// returns before the file system is gone when another mount namespace (a
// sandbox's, torn down after its last process exited) still held a copy of
// the mount; the kernel writes the file system's superblock and unbinds the
// device (autoclear) only when the last copy goes. Checking, resizing or
// mounting the image before then would work on a file system that is still
// live: a resize2fs then corrupts it.
func waitReleased(img string, timeout time.Duration) error {
	abs, err := filepath.Abs(img)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		dev, err := boundLoop(abs)
		if err != nil || dev == "" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the workspace image %s is still in use (bound to %s) %v after it was unmounted", img, dev, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// boundLoop returns the loop device bound to the file abs, "" if none is.
func boundLoop(abs string) (string, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return "", err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // unbound while we looked
		}
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == abs {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f))), nil
		}
	}
	return "", nil
}
