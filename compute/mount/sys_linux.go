package mount

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// syncFS flushes the file system holding fd: one call instead of an fsync
// per restored file.
func syncFS(fd int) error { return unix.Syncfs(fd) }

// swap exchanges the staging tree and the workspace atomically. old is the
// path now holding the previous tree, or "" if there was none.
func swap(staging, target string) (old string, err error) {
	err = unix.Renameat2(unix.AT_FDCWD, staging, unix.AT_FDCWD, target, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		return staging, nil
	case errors.Is(err, unix.ENOENT):
		if err := os.Rename(staging, target); err != nil {
			return "", fmt.Errorf("move the restored tree into place: %w", err)
		}
		return "", nil
	case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EBUSY):
		return "", fmt.Errorf("swap in the restored tree: %s is a mount point or on another file system than its parent (%w): "+
			"the workspace must be a plain directory, e.g. mount its parent instead", target, err)
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP):
		// The file system cannot exchange: two renames, with a moment in
		// between where the workspace is missing.
		old = staging + ".old"
		if err := os.Rename(target, old); err != nil {
			return "", fmt.Errorf("move the old workspace aside: %w", err)
		}
		if err := os.Rename(staging, target); err != nil {
			os.Rename(old, target)
			return "", fmt.Errorf("move the restored tree into place: %w", err)
		}
		return old, nil
	}
	return "", fmt.Errorf("swap in the restored tree: %w", err)
}
