package mount

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
)

// Dir's file operations change a live workspace (an awake sandbox's) one
// path at a time, through an os.Root: a path that leaves the workspace,
// through ".." or a symbolic link, fails with ErrOutside.

func (d *Dir) root() (*os.Root, error) {
	if err := os.MkdirAll(d.Path, 0o755); err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	r, err := os.OpenRoot(d.Path)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return r, nil
}

// pathError converts an error of an os.Root operation into one of this
// package's kinds.
func pathError(name string, err error) error {
	var pe *fs.PathError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes"):
		return fmt.Errorf("%w: %s", ErrOutside, name)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("%w: %s", ErrOutside, name)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s", ErrNoEntry, name)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%w: %s", ErrIsDir, name)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %s", ErrNotDir, name)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// WriteFile writes r to name (slash-separated, relative to the workspace),
// creating its parent directories: through a temporary file renamed into
// place, so the file appears complete or not at all and a failed write
// leaves the old one.
func (d *Dir) WriteFile(ctx context.Context, name string, r io.Reader, perm fs.FileMode) error {
	root, err := d.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
		return fmt.Errorf("%w: %s", ErrIsDir, name)
	}
	dir := path.Dir(name)
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return pathError(dir, err)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(dir, ".atrium-upload-"+hex.EncodeToString(rnd[:]))
	if err := d.chownDirs(root, dir); err != nil {
		return err
	}
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return pathError(name, err)
	}
	_, err = io.Copy(f, ctxReader{ctx, r})
	if err == nil && d.Owner > 0 {
		err = f.Chown(d.Owner, d.Owner)
	}
	if err == nil {
		err = f.Chmod(perm.Perm())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
		err = pathError(name, err)
	}
	if err != nil {
		_ = root.Remove(tmp)
	}
	return err
}

// Mkdir makes directory name and its parents.
func (d *Dir) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	root, err := d.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(name, perm.Perm()); err != nil {
		return pathError(name, err)
	}
	return d.chownDirs(root, name)
}

// chownDirs gives dir and its parents below the root to Owner, if set.
func (d *Dir) chownDirs(root *os.Root, dir string) error {
	if d.Owner <= 0 {
		return nil
	}
	for p := dir; p != "." && p != ""; p = path.Dir(p) {
		if err := root.Lchown(p, d.Owner, d.Owner); err != nil {
			return pathError(p, err)
		}
	}
	return nil
}

// Symlink makes name a symbolic link to target, replacing a file or link
// there.
func (d *Dir) Symlink(ctx context.Context, name, target string) error {
	root, err := d.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return pathError(name, err)
	}
	if fi, err := root.Lstat(name); err == nil {
		if fi.IsDir() {
			return fmt.Errorf("%w: %s", ErrIsDir, name)
		}
		if err := root.Remove(name); err != nil {
			return pathError(name, err)
		}
	}
	if err := d.chownDirs(root, path.Dir(name)); err != nil {
		return err
	}
	if err := root.Symlink(target, name); err != nil {
		return pathError(name, err)
	}
	if d.Owner > 0 {
		return pathError(name, root.Lchown(name, d.Owner, d.Owner))
	}
	return nil
}

// Remove removes name and, for a directory, everything under it.
func (d *Dir) Remove(ctx context.Context, name string) error {
	root, err := d.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if _, err := root.Lstat(name); err != nil {
		return pathError(name, err)
	}
	return pathError(name, root.RemoveAll(name))
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
