package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Extended attributes in which Dir keeps an object's ETag and content type.
const (
	xattrETag = "user.atrium.etag"
	xattrType = "user.atrium.content-type"
)

// staleTemp is how old a temporary file must be before Dir deletes it as
// the leftover of a crash.
const staleTemp = time.Hour

// defaultContentType is the content type of objects stored without one.
const defaultContentType = "application/octet-stream"

// Dir is an object store in a local directory: the object at key "a/b" is
// the file <Path>/a/b. It is the embedded default store: one process (one
// node) owns the directory; several Dir values over the same Path, in one
// process or several, stay consistent because writes are serialized by a
// lock file.
//
// A Put streams into a temporary file under <Path>/.atrium/tmp, fsyncs it,
// then renames it into place and fsyncs the directory, so a crash leaves
// either the old object or the new one, never a mix. The ETag of an object is
// the hex SHA-256 of its content, computed while it is written and kept with
// the content type in extended attributes (user.atrium.*); on a file system
// without user extended attributes the ETag is computed on demand and the
// content type is not kept.
//
// Dir cannot hold both a key and a longer key that uses it as a directory
// ("a" and "a/b"), which S3 allows; Put of the second fails. Atrium's keys
// never do this.
//
// The zero value of every field but Path is usable; a Dir must not be
// copied after first use.
type Dir struct {
	// Path is the directory; Put creates it if it is missing.
	Path string

	clean sync.Once // removes stale temporary files on first Put
}

var _ Store = (*Dir)(nil)

// file returns the path of key's object.
func (d *Dir) file(key string) string { return filepath.Join(d.Path, filepath.FromSlash(key)) }

// errNoPath is returned by every method of a Dir without a Path.
var errNoPath = errors.New("blob dir has no path")

func (d *Dir) internal(name string) string { return filepath.Join(d.Path, reserved, name) }

// Put implements Store.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, size int64, opts PutOptions) (Info, error) {
	if err := ValidKey(key); err != nil {
		return Info{}, fmt.Errorf("put: %w", err)
	}
	if d.Path == "" {
		return Info{}, fmt.Errorf("put %s: %w", key, errNoPath)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	tmpDir := d.internal("tmp")
	if err := os.MkdirAll(tmpDir, 0o750); err != nil {
		return Info{}, fmt.Errorf("put %s: make temporary dir: %w", key, err)
	}
	d.clean.Do(func() { removeStale(tmpDir) })
	f, err := os.CreateTemp(tmpDir, "put-*")
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	tmp := f.Name()
	defer func() {
		if tmp != "" {
			f.Close()
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), &ctxReader{ctx: ctx, r: r})
	if err != nil {
		return Info{}, fmt.Errorf("put %s: write: %w", key, err)
	}
	if size >= 0 && n != size {
		return Info{}, fmt.Errorf("put %s: read %d bytes, want %d", key, n, size)
	}
	etag := hex.EncodeToString(h.Sum(nil))
	ctype := orDefault(opts.ContentType, defaultContentType)
	setXattr(f, xattrETag, etag)
	setXattr(f, xattrType, ctype)
	if err := f.Sync(); err != nil {
		return Info{}, fmt.Errorf("put %s: sync: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	unlock, err := d.lock()
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer unlock()
	if opts.conditional() {
		cur, err := d.stat(key)
		switch {
		case errors.Is(err, ErrNotFound):
			if opts.IfMatch != "" {
				return Info{}, fmt.Errorf("put %s: if-match %s: object is missing: %w", key, opts.IfMatch, ErrPrecondition)
			}
		case err != nil:
			return Info{}, fmt.Errorf("put %s: check condition: %w", key, err)
		case opts.IfNoneMatch:
			return Info{}, fmt.Errorf("put %s: if-none-match: object exists: %w", key, ErrPrecondition)
		case cur.ETag != opts.IfMatch:
			return Info{}, fmt.Errorf("put %s: if-match %s: object has ETag %s: %w", key, opts.IfMatch, cur.ETag, ErrPrecondition)
		}
	}
	dst := d.file(key)
	if err := mkdirs(d.Path, filepath.Dir(dst)); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	tmp = ""
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	st, err := os.Lstat(dst)
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	return Info{Key: key, Size: n, ETag: etag, Modified: st.ModTime(), ContentType: ctype}, nil
}

// Get implements Store.
func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	if err := ValidKey(key); err != nil {
		return nil, Info{}, fmt.Errorf("get: %w", err)
	}
	if d.Path == "" {
		return nil, Info{}, fmt.Errorf("get %s: %w", key, errNoPath)
	}
	if err := ctx.Err(); err != nil {
		return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
	}
	f, err := openObject(d.file(key))
	if err != nil {
		return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
	}
	info, err := describe(key, f)
	if err != nil {
		f.Close()
		return nil, Info{}, fmt.Errorf("get %s: %w", key, err)
	}
	return &ctxFile{ctx: ctx, File: f}, info, nil
}

// Stat implements Store.
func (d *Dir) Stat(ctx context.Context, key string) (Info, error) {
	if err := ValidKey(key); err != nil {
		return Info{}, fmt.Errorf("stat: %w", err)
	}
	if d.Path == "" {
		return Info{}, fmt.Errorf("stat %s: %w", key, errNoPath)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	info, err := d.stat(key)
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return info, nil
}

func (d *Dir) stat(key string) (Info, error) {
	f, err := openObject(d.file(key))
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	return describe(key, f)
}

// Delete implements Store. It also removes the directories the object's key
// leaves empty.
func (d *Dir) Delete(ctx context.Context, key string) error {
	if err := ValidKey(key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if d.Path == "" {
		return fmt.Errorf("delete %s: %w", key, errNoPath)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if _, err := os.Lstat(d.Path); errors.Is(err, fs.ErrNotExist) {
		return nil // Nothing was ever stored.
	}
	unlock, err := d.lock()
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	defer unlock()
	f := d.file(key)
	if st, err := os.Lstat(f); err == nil && st.IsDir() {
		return nil // A directory of longer keys, not an object.
	}
	if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	for dir := filepath.Dir(f); dir != filepath.Clean(d.Path); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break // Not empty, or already gone.
		}
	}
	return nil
}

// List implements Store.
func (d *Dir) List(ctx context.Context, prefix string) iter.Seq2[Info, error] {
	if err := validPrefix(prefix); err != nil {
		return errorSeq(err)
	}
	if d.Path == "" {
		return errorSeq(fmt.Errorf("list %q: %w", prefix, errNoPath))
	}
	return func(yield func(Info, error) bool) {
		// Walk the deepest directory the prefix names entirely.
		base := ""
		if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
			base = prefix[:i]
		}
		var keys []string
		root := filepath.Join(d.Path, filepath.FromSlash(base))
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if p == root && errors.Is(err, fs.ErrNotExist) {
					return fs.SkipAll
				}
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rel, _ := filepath.Rel(d.Path, p)
			key := filepath.ToSlash(rel)
			if e.IsDir() {
				if key == reserved || (key != "." && !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/")) {
					return fs.SkipDir
				}
				return nil
			}
			if e.Type().IsRegular() && strings.HasPrefix(key, prefix) {
				keys = append(keys, key)
			}
			return nil
		})
		if err != nil {
			yield(Info{}, fmt.Errorf("list %q: %w", prefix, err))
			return
		}
		slices.Sort(keys)
		for _, key := range keys {
			if err := ctx.Err(); err != nil {
				yield(Info{}, fmt.Errorf("list %q: %w", prefix, err))
				return
			}
			info, err := d.stat(key)
			if errors.Is(err, ErrNotFound) {
				continue // Deleted since the walk.
			}
			if err != nil {
				err = fmt.Errorf("list %q: %w", prefix, err)
			}
			if !yield(info, err) || err != nil {
				return
			}
		}
	}
}

// lock takes the store's write lock, an exclusive flock on
// <Path>/.atrium/lock, which serializes the check and the rename of
// conditional writes with every other write, across processes too.
func (d *Dir) lock() (unlock func(), err error) {
	if err := os.MkdirAll(d.internal(""), 0o750); err != nil {
		return nil, fmt.Errorf("lock store: %w", err)
	}
	f, err := os.OpenFile(d.internal("lock"), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("lock store: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock store: %w", err)
	}
	return func() { f.Close() }, nil // Closing the file releases the lock.
}

// openObject opens the regular file of an object, never following a
// symbolic link, and maps a missing file to ErrNotFound.
func openObject(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, ErrNotFound // A directory of longer keys.
	}
	return f, nil
}

// describe returns the Info of the open object f, hashing its content when
// its ETag is not recorded (and leaving f at its start).
func describe(key string, f *os.File) (Info, error) {
	st, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	info := Info{Key: key, Size: st.Size(), Modified: st.ModTime(), ContentType: defaultContentType}
	if t := getXattr(f, xattrType); t != "" {
		info.ContentType = t
	}
	if info.ETag = getXattr(f, xattrETag); info.ETag != "" {
		return info, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return Info{}, fmt.Errorf("hash: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Info{}, err
	}
	info.ETag = hex.EncodeToString(h.Sum(nil))
	return info, nil
}

func setXattr(f *os.File, name, value string) {
	// Best effort: without user xattrs the ETag is recomputed on demand.
	_ = unix.Fsetxattr(int(f.Fd()), name, []byte(value), 0)
}

func getXattr(f *os.File, name string) string {
	buf := make([]byte, 256)
	n, err := unix.Fgetxattr(int(f.Fd()), name, buf)
	if err != nil || n <= 0 {
		return ""
	}
	return string(buf[:n])
}

// mkdirs makes dir and its missing parents below root, fsyncing the parent
// of each directory it creates so the new entries survive a crash.
func mkdirs(root, dir string) error {
	st, err := os.Stat(dir)
	if err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s is an object, not a directory of keys", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if dir == filepath.Clean(root) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if err := mkdirs(root, parent); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
		if errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("%s is an object, not a directory of keys", parent)
		}
		return err
	}
	return syncDir(parent)
}

// syncDir fsyncs a directory, making the entries created in it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync dir: %w", err)
	}
	return nil
}

// removeStale deletes temporary files a crash left behind.
func removeStale(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleTemp {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ctxReader fails reads once its context is done, so a Put of a reader
// that never ends still stops.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// ctxFile is the reader Get returns: reads fail once ctx is done.
type ctxFile struct {
	ctx context.Context
	*os.File
}

func (f *ctxFile) Read(p []byte) (int, error) {
	if err := f.ctx.Err(); err != nil {
		return 0, err
	}
	return f.File.Read(p)
}

// WriteTo keeps io.Copy from bypassing Read's context check through
// os.File's own WriteTo.
func (f *ctxFile) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(w, struct{ io.Reader }{f}, make([]byte, 64<<10))
}
