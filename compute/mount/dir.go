package mount

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/atriumhq/atrium/storage/blob"
)

// DefaultParallel is how many objects a Dir moves at once.
const DefaultParallel = 8

// bigObject is the size above which an upload may buffer a whole part in
// memory (blob.S3 multipart); at most maxBig such uploads run at once.
const (
	bigObject = 8 << 20
	maxBig    = 2
)

// copyBuffer is the size of the buffers files are streamed through.
const copyBuffer = 256 << 10

// Dir is a workspace in a directory of the machine it runs on: the node's
// directory for a local sandbox, or /workspace inside a VM, where the sandbox
// agent calls it with the plans the node sends.
//
// Dir never follows a symbolic link inside the workspace: it walks and
// opens everything relative to directory descriptors with O_NOFOLLOW, so a
// sandbox that swaps a directory for a link to /etc while a save runs
// makes the save fail, not read /etc.
//
// Restore needs the workspace's parent directory to be writable and on the
// same file system, and the workspace not to be a mount point: the new tree
// is built in a sibling directory (.<name>.atrium-restore-*) and swapped in
// with renameat2(RENAME_EXCHANGE). Nothing may run in the workspace during a
// Restore: a process whose working directory is inside it keeps the old tree.
type Dir struct {
	// Path is the workspace directory.
	Path string
	// Blob is the store for plan items without a URL; leave it nil inside
	// a VM, where every item comes with a presigned URL.
	Blob blob.Store
	// Client makes the requests to presigned URLs; nil means
	// http.DefaultClient.
	Client *http.Client
	// Parallel is how many objects move at once; 0 means DefaultParallel.
	Parallel int
	// Owner, if positive, is the uid and gid given to everything Restore
	// and the file operations create: the host uid a sandbox runs as, so
	// that it can change what the node restored or wrote. 0 leaves them
	// the node's.
	Owner int
}

var _ Workspace = (*Dir)(nil)

func (d *Dir) parallel() int {
	if d.Parallel > 0 {
		return d.Parallel
	}
	return DefaultParallel
}

func (d *Dir) client() *http.Client {
	if d.Client != nil {
		return d.Client
	}
	return http.DefaultClient
}

// openRoot opens the workspace directory; missing reports whether it does
// not exist.
func (d *Dir) openRoot() (fd int, missing bool, err error) {
	if d.Path == "" {
		return -1, false, errors.New("workspace dir: no path")
	}
	fd, err = unix.Open(d.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return -1, true, nil
	}
	if err != nil {
		return -1, false, fmt.Errorf("open workspace %s: %w", d.Path, err)
	}
	return fd, false, nil
}

// Scan implements Workspace.
func (d *Dir) Scan(ctx context.Context, req *ScanRequest) (*ScanResult, error) {
	res := &ScanResult{Started: time.Now().UnixNano(), Direct: d.Blob != nil, Entries: []Entry{}}
	root, missing, err := d.openRoot()
	if err != nil || missing {
		return res, err
	}
	defer unix.Close(root)
	s := &scanner{ctx: ctx, res: res, noHash: req.NoHash, buf: make([]byte, copyBuffer)}
	if p := req.Prev; p != nil {
		s.prev = make(map[string]*Entry, len(p.Entries))
		for i := range p.Entries {
			if e := &p.Entries[i]; e.Type == TypeFile && e.Hash != "" {
				s.prev[e.Path] = e
			}
		}
		s.cutoff = p.Scanned - int64(RacyWindow)
	}
	if err := s.walk(root, ""); err != nil {
		return nil, fmt.Errorf("scan workspace %s: %w", d.Path, err)
	}
	slices.SortFunc(res.Entries, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return res, nil
}

type scanner struct {
	ctx    context.Context
	res    *ScanResult
	prev   map[string]*Entry
	cutoff int64 // files modified before this (Unix ns) may be trusted
	noHash bool
	buf    []byte
	n      int
}

// maxSkipped bounds the list of skipped entries a scan reports.
const maxSkipped = 1000

func (s *scanner) skip(p, reason string) {
	if len(s.res.Skipped) < maxSkipped {
		s.res.Skipped = append(s.res.Skipped, Skipped{Path: p, Reason: reason})
	}
}

// walk adds the entries of the directory open as fd, at rel, and closes fd.
func (s *scanner) walk(fd int, rel string) error {
	f := os.NewFile(uintptr(fd), rel)
	names, err := f.Readdirnames(-1)
	if err != nil {
		if rel == "" {
			f.Close()
			return err
		}
		f.Close()
		s.skip(rel, "unreadable: "+err.Error())
		return nil
	}
	defer f.Close()
	slices.Sort(names)
	for _, name := range names {
		if s.n++; s.n%256 == 0 {
			if err := s.ctx.Err(); err != nil {
				return err
			}
		}
		if len(s.res.Entries) >= maxEntries {
			return fmt.Errorf("more than %d entries", maxEntries)
		}
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		if !utf8.ValidString(name) {
			// Manifests are JSON, which holds UTF-8 only.
			s.skip(strings.ToValidUTF8(p, "\uFFFD"), "name is not valid UTF-8")
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // Deleted since the directory was read.
			}
			return fmt.Errorf("stat %s: %w", p, err)
		}
		e := Entry{Path: p, Mode: fs.FileMode(st.Mode) & fs.ModePerm, MTime: st.Mtim.Nano()}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			child, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				s.skip(p, "unreadable: "+err.Error())
				continue
			}
			e.Type = TypeDir
			s.res.Entries = append(s.res.Entries, e)
			if err := s.walk(child, p); err != nil {
				return err
			}
		case unix.S_IFREG:
			e.Type, e.Size = TypeFile, st.Size
			if old := s.prev[p]; old != nil && old.Size == e.Size && old.MTime == e.MTime && e.MTime < s.cutoff {
				e.Hash = old.Hash
			} else if !s.noHash {
				ok, err := s.hash(fd, name, &e)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
			}
			s.res.Entries = append(s.res.Entries, e)
		case unix.S_IFLNK:
			target, err := readlinkat(fd, name)
			if err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return fmt.Errorf("read link %s: %w", p, err)
			}
			if !utf8.ValidString(target) {
				s.skip(p, "link target is not valid UTF-8")
				continue
			}
			e.Type, e.Target = TypeSymlink, target
			s.res.Entries = append(s.res.Entries, e)
		case unix.S_IFIFO:
			s.skip(p, "fifo")
		case unix.S_IFSOCK:
			s.skip(p, "socket")
		default:
			s.skip(p, "device")
		}
	}
	return nil
}

// hash reads the file name of directory fd into e's hash, size and mtime.
// ok is false when the entry is to be left out (gone, unreadable, or no
// longer a regular file).
func (s *scanner) hash(dirfd int, name string, e *Entry) (ok bool, err error) {
	// O_NONBLOCK: should the file have become a FIFO, opening it must not
	// wait for a writer.
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP):
		return false, nil
	case err != nil:
		s.skip(e.Path, "unreadable: "+err.Error())
		return false, nil
	}
	f := os.NewFile(uintptr(fd), e.Path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", e.Path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, nil
	}
	// The size and mtime before reading go with the hash: if the file
	// changes while it is read, the next scan sees a new mtime, and the
	// upload's check catches the mismatch.
	e.Size, e.MTime = st.Size, st.Mtim.Nano()
	h := sha256.New()
	n, err := io.CopyBuffer(h, io.LimitReader(f, e.Size), s.buf)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", e.Path, err)
	}
	if n != e.Size {
		e.Size = n // Truncated while read; a later scan catches up.
	}
	e.Hash = hex.EncodeToString(h.Sum(nil))
	s.res.Hashed++
	s.res.HashedBytes += n
	return true, nil
}

func readlinkat(fd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size > 1<<16 {
			return "", errors.New("link target too long")
		}
	}
}

// Upload implements Workspace.
func (d *Dir) Upload(ctx context.Context, plan *UploadPlan) (*Transfer, error) {
	if err := validUpload(plan); err != nil {
		return nil, err
	}
	root, missing, err := d.openRoot()
	if err != nil {
		return nil, err
	}
	if missing {
		return nil, fmt.Errorf("upload from workspace %s: it does not exist: %w", d.Path, ErrChanged)
	}
	defer unix.Close(root)
	var tr Transfer
	var mu sync.Mutex
	big := make(chan struct{}, maxBig)
	err = parallel(ctx, d.parallel(), len(plan.Uploads), func(ctx context.Context, i int) error {
		u := &plan.Uploads[i]
		if u.Size > bigObject {
			select {
			case big <- struct{}{}:
				defer func() { <-big }()
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := d.upload(ctx, root, u); err != nil {
			return fmt.Errorf("upload %s: %w", u.Key, err)
		}
		mu.Lock()
		tr.Objects++
		tr.Bytes += u.Size
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &tr, nil
}

func (d *Dir) upload(ctx context.Context, root int, u *Upload) error {
	dirs := newDirs(root)
	defer dirs.close()
	body := &partsReader{dirs: dirs, parts: u.Parts}
	defer body.close()
	var err error
	switch {
	case u.URL != "":
		err = d.put(ctx, u, body)
	case d.Blob != nil:
		_, err = d.Blob.Put(ctx, u.Key, body, u.Size, blob.PutOptions{})
	default:
		err = errors.New("no URL and no object store")
	}
	if body.err != nil {
		return body.err // The files' failure, not the transport's.
	}
	return err
}

// put sends body to a presigned URL.
func (d *Dir) put(ctx context.Context, u *Upload, body io.Reader) error {
	if u.Size == 0 {
		body = http.NoBody
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.URL, body)
	if err != nil {
		return invalidf("upload URL: %v", err)
	}
	req.ContentLength = u.Size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := d.client().Do(req)
	if err != nil {
		return transportErr(ctx, http.MethodPut, u.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return statusErr(http.MethodPut, u.URL, resp)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return nil
}

// partsReader reads the concatenation of an upload's parts from the
// workspace, checking each part's hash. It holds back the last bytes of a
// part until the hash is checked, so a file that changed since the scan
// makes the upload fail before the object is complete: the store never
// commits an object with content other than its parts' hashes.
type partsReader struct {
	dirs  *dirs
	parts []Part
	f     *os.File  // the current part's file
	h     hash.Hash // of the current part
	left  int64     // bytes of the current part not yet read
	err   error     // sticky failure of the files
}

func (r *partsReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	for r.f == nil {
		if len(r.parts) == 0 {
			return 0, io.EOF
		}
		if err := r.open(); err != nil {
			r.err = err
			return 0, err
		}
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := io.ReadFull(r.f, p)
	r.h.Write(p[:n])
	r.left -= int64(n)
	if err != nil {
		r.err = fmt.Errorf("%s: %w", r.parts[0].Path, changed("it is shorter than when it was scanned"))
		return 0, r.err
	}
	if r.left == 0 {
		part := r.parts[0]
		if hex.EncodeToString(r.h.Sum(nil)) != part.Hash {
			r.err = fmt.Errorf("%s: %w", part.Path, changed("its content changed since it was scanned"))
			return 0, r.err // Holds back this part's last bytes.
		}
		r.f.Close()
		r.f, r.parts = nil, r.parts[1:]
	}
	return n, nil
}

// open opens the next part's file.
func (r *partsReader) open() error {
	part := r.parts[0]
	dir, err := r.dirs.open(path.Dir(part.Path))
	if err != nil {
		return fmt.Errorf("%s: %w", part.Path, changed(err.Error()))
	}
	fd, err := unix.Openat(dir, path.Base(part.Path), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", part.Path, changed(err.Error()))
	}
	f := os.NewFile(uintptr(fd), part.Path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < part.Size {
		f.Close()
		return fmt.Errorf("%s: %w", part.Path, changed("it is no longer the file that was scanned"))
	}
	if part.Size == 0 {
		f.Close()
		r.parts = r.parts[1:]
		return nil
	}
	r.f, r.h, r.left = f, sha256.New(), part.Size
	return nil
}

func (r *partsReader) close() {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
}

func changed(why string) error { return fmt.Errorf("%s: %w", why, ErrChanged) }

// Restore implements Workspace.
func (d *Dir) Restore(ctx context.Context, plan *RestorePlan) (*Transfer, error) {
	if err := validRestore(plan); err != nil {
		return nil, err
	}
	if d.Path == "" {
		return nil, errors.New("restore workspace: no path")
	}
	target, err := filepath.Abs(d.Path)
	if err != nil {
		return nil, fmt.Errorf("restore workspace %s: %w", d.Path, err)
	}
	parent, name := filepath.Dir(target), filepath.Base(target)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("restore workspace %s: %w", d.Path, err)
	}
	removeStaging(parent, name)
	staging := filepath.Join(parent, "."+name+stagingTag+hexID(8))
	if err := os.Mkdir(staging, 0o700); err != nil {
		return nil, fmt.Errorf("restore workspace %s: make staging dir: %w", d.Path, err)
	}
	swapped := false
	defer func() {
		if !swapped {
			removeTree(staging)
		}
	}()
	sfd, err := unix.Open(staging, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("restore workspace %s: %w", d.Path, err)
	}
	defer unix.Close(sfd)
	r := &restorer{d: d, plan: plan, stage: sfd, byHash: make(map[string][]int)}
	tr, err := r.build(ctx)
	if err != nil {
		return nil, fmt.Errorf("restore workspace %s: %w", d.Path, err)
	}
	rootMode := uint32(0o755)
	if st, err := os.Stat(target); err == nil {
		rootMode = uint32(st.Mode().Perm())
	}
	if err := unix.Fchmod(sfd, rootMode); err != nil {
		return nil, fmt.Errorf("restore workspace %s: %w", d.Path, err)
	}
	if d.Owner > 0 {
		// A fresh tree of this restore's own: no link in it is followed.
		err := filepath.WalkDir(staging, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, d.Owner, d.Owner)
		})
		if err != nil {
			return nil, fmt.Errorf("restore workspace %s: give it to uid %d: %w", d.Path, d.Owner, err)
		}
	}
	if err := syncFS(sfd); err != nil {
		return nil, fmt.Errorf("restore workspace %s: sync: %w", d.Path, err)
	}
	old, err := swap(staging, target)
	if err != nil {
		return nil, fmt.Errorf("restore workspace %s: %w", d.Path, err)
	}
	swapped = true
	if old != "" {
		removeTree(old)
	}
	if f, err := os.Open(parent); err == nil {
		f.Sync()
		f.Close()
	}
	return tr, nil
}

// stagingTag marks the sibling directories Restore makes.
const stagingTag = ".atrium-restore-"

// removeStaging deletes staging directories an interrupted restore left.
func removeStaging(parent, name string) {
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "."+name+stagingTag) {
			removeTree(filepath.Join(parent, e.Name()))
		}
	}
}

// removeTree removes a tree, making its directories writable first if it
// has to (a restored workspace may hold read-only directories, which only
// root could empty otherwise).
func removeTree(p string) {
	if os.RemoveAll(p) == nil {
		return
	}
	filepath.WalkDir(p, func(q string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			os.Chmod(q, 0o700) // Before WalkDir reads it.
		}
		return nil
	})
	os.RemoveAll(p)
}

// restorer builds a restore plan's tree in the staging directory.
type restorer struct {
	d      *Dir
	plan   *RestorePlan
	stage  int              // staging directory
	byHash map[string][]int // hash -> indexes of the non-empty files with it

	mu   sync.Mutex
	done map[string]int // guarded by mu; hash -> index of the file written first

	objects atomic.Int64
	bytes   atomic.Int64
	reused  int
}

func (r *restorer) build(ctx context.Context) (*Transfer, error) {
	entries := r.plan.Entries
	r.done = make(map[string]int)
	dirs := newDirs(r.stage)
	defer dirs.close()
	// The tree: directories (sorted, so parents first) and links.
	for i, e := range entries {
		parent, err := dirs.open(path.Dir(e.Path))
		if err != nil {
			return nil, err
		}
		switch e.Type {
		case TypeDir:
			err = unix.Mkdirat(parent, path.Base(e.Path), 0o700)
		case TypeSymlink:
			err = unix.Symlinkat(e.Target, parent, path.Base(e.Path))
		case TypeFile:
			if e.Size > 0 {
				r.byHash[e.Hash] = append(r.byHash[e.Hash], i)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", e.Path, err)
		}
	}
	if err := r.keep(dirs); err != nil {
		return nil, err
	}
	err := parallel(ctx, r.d.parallel(), len(r.plan.Downloads), func(ctx context.Context, i int) error {
		return r.download(ctx, &r.plan.Downloads[i])
	})
	if err != nil {
		return nil, err
	}
	// Copies of content several files share, then empty files.
	buf := make([]byte, copyBuffer)
	for i, e := range entries {
		if e.Type != TypeFile {
			continue
		}
		if e.Size == 0 {
			if err := r.write(dirs, i, strings.NewReader(""), buf); err != nil {
				return nil, err
			}
			continue
		}
		first, ok := r.done[e.Hash]
		switch {
		case !ok:
			return nil, fmt.Errorf("%s: %w", e.Path, corrupt("the plan has no content for it"))
		case first == i:
			continue
		}
		if err := r.copy(dirs, first, i, buf); err != nil {
			return nil, err
		}
	}
	// Times and modes last, children before parents: creating an entry
	// changes its directory's mtime, and a read-only directory could not
	// be filled.
	for _, e := range slices.Backward(entries) {
		if e.Type == TypeFile {
			continue
		}
		parent, err := dirs.open(path.Dir(e.Path))
		if err != nil {
			return nil, err
		}
		name := path.Base(e.Path)
		if e.Type == TypeDir {
			dirs.forget(e.Path) // Its descriptor must not outlive a chmod to 0.
			if err := unix.Fchmodat(parent, name, uint32(e.Mode), 0); err != nil {
				return nil, fmt.Errorf("chmod %s: %w", e.Path, err)
			}
		}
		if err := setMTime(parent, name, e.MTime); err != nil {
			return nil, fmt.Errorf("set mtime of %s: %w", e.Path, err)
		}
	}
	return &Transfer{Objects: int(r.objects.Load()), Bytes: r.bytes.Load(), Reused: r.reused}, nil
}

// keep takes content the current workspace already holds: it hard-links a
// file whose mode and mtime already match the entry (so the link changes
// nothing in the current workspace), and copies otherwise.
func (r *restorer) keep(dirs *dirs) error {
	if len(r.plan.Keep) == 0 {
		return nil
	}
	root, missing, err := r.d.openRoot()
	if err != nil {
		return err
	}
	if missing {
		return fmt.Errorf("keep: %w", changed("the workspace does not exist"))
	}
	defer unix.Close(root)
	src := newDirs(root)
	defer src.close()
	buf := make([]byte, copyBuffer)
	for _, k := range r.plan.Keep {
		idx := r.byHash[k.Hash]
		if len(idx) == 0 {
			continue
		}
		sdir, err := src.open(path.Dir(k.Path))
		if err != nil {
			return fmt.Errorf("keep %s: %w", k.Path, changed(err.Error()))
		}
		sname := path.Base(k.Path)
		var st unix.Stat_t
		if err := unix.Fstatat(sdir, sname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("keep %s: %w", k.Path, changed("it is no longer a regular file"))
		}
		first := idx[0]
		for _, i := range idx {
			if e := r.plan.Entries[i]; fs.FileMode(st.Mode)&fs.ModePerm == e.Mode && st.Mtim.Nano() == e.MTime && st.Size == e.Size {
				first = i
				break
			}
		}
		e := r.plan.Entries[first]
		ddir, err := dirs.open(path.Dir(e.Path))
		if err != nil {
			return err
		}
		linked := false
		if fs.FileMode(st.Mode)&fs.ModePerm == e.Mode && st.Mtim.Nano() == e.MTime && st.Size == e.Size {
			// Linking can fail (another file system, protected_hardlinks):
			// copying then does the same.
			linked = unix.Linkat(sdir, sname, ddir, path.Base(e.Path), 0) == nil
		}
		if !linked {
			fd, err := unix.Openat(sdir, sname, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("keep %s: %w", k.Path, changed(err.Error()))
			}
			f := os.NewFile(uintptr(fd), k.Path)
			err = r.write(dirs, first, f, buf)
			f.Close()
			if errors.Is(err, ErrCorrupt) {
				return fmt.Errorf("keep %s: %w", k.Path, changed("its content changed since it was scanned"))
			}
			if err != nil {
				return err
			}
		}
		r.done[k.Hash] = first
		r.reused += len(idx) // The others are copied from first later.
	}
	return nil
}

// download fetches one object and writes the files it holds.
func (r *restorer) download(ctx context.Context, dl *Download) error {
	body, size, err := r.d.get(ctx, dl)
	if err != nil {
		return fmt.Errorf("download %s: %w", dl.Key, err)
	}
	defer body.Close()
	if size >= 0 && size < dl.Size {
		return fmt.Errorf("download %s: %w", dl.Key, corrupt(fmt.Sprintf("the object has %d bytes, the manifest needs %d", size, dl.Size)))
	}
	dirs := newDirs(r.stage)
	defer dirs.close()
	buf := make([]byte, copyBuffer)
	var pos int64
	for _, x := range dl.Extracts {
		if _, err := io.CopyBuffer(io.Discard, io.LimitReader(body, x.Offset-pos), buf); err != nil {
			return fmt.Errorf("download %s: %w", dl.Key, err)
		}
		pos = x.Offset + x.Size
		idx := r.byHash[x.Hash]
		r.mu.Lock()
		_, dup := r.done[x.Hash]
		r.mu.Unlock()
		if len(idx) == 0 || dup {
			if _, err := io.CopyBuffer(io.Discard, io.LimitReader(body, x.Size), buf); err != nil {
				return fmt.Errorf("download %s: %w", dl.Key, err)
			}
			continue
		}
		if err := r.write(dirs, idx[0], io.LimitReader(body, x.Size), buf); err != nil {
			return fmt.Errorf("download %s: %w", dl.Key, err)
		}
		r.mu.Lock()
		r.done[x.Hash] = idx[0]
		r.mu.Unlock()
	}
	r.objects.Add(1)
	r.bytes.Add(pos)
	return nil
}

// write creates file entry i in the staging tree from src, checking its
// size and hash, then sets its mode and mtime.
func (r *restorer) write(dirs *dirs, i int, src io.Reader, buf []byte) error {
	e := r.plan.Entries[i]
	dir, err := dirs.open(path.Dir(e.Path))
	if err != nil {
		return err
	}
	name := path.Base(e.Path)
	fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", e.Path, err)
	}
	f := os.NewFile(uintptr(fd), e.Path)
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(f, io.TeeReader(src, h), buf)
	if err != nil {
		return fmt.Errorf("write %s: %w", e.Path, err)
	}
	if n != e.Size {
		return fmt.Errorf("%s: %w", e.Path, corrupt(fmt.Sprintf("got %d bytes, the manifest says %d", n, e.Size)))
	}
	if e.Size > 0 && hex.EncodeToString(h.Sum(nil)) != e.Hash {
		return fmt.Errorf("%s: %w", e.Path, corrupt("its content does not match its hash"))
	}
	return r.finish(f, dir, name, e)
}

// copy makes file entry i a copy of the already written entry first.
func (r *restorer) copy(dirs *dirs, first, i int, buf []byte) error {
	src := r.plan.Entries[first]
	dir, err := dirs.open(path.Dir(src.Path))
	if err != nil {
		return err
	}
	fd, err := unix.Openat(dir, path.Base(src.Path), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src.Path, err)
	}
	f := os.NewFile(uintptr(fd), src.Path)
	defer f.Close()
	e := r.plan.Entries[i]
	ddir, err := dirs.open(path.Dir(e.Path))
	if err != nil {
		return err
	}
	name := path.Base(e.Path)
	dfd, err := unix.Openat(ddir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", e.Path, err)
	}
	df := os.NewFile(uintptr(dfd), e.Path)
	defer df.Close()
	if _, err := io.Copy(df, f); err != nil { // copy_file_range where it can
		return fmt.Errorf("copy %s to %s: %w", src.Path, e.Path, err)
	}
	return r.finish(df, ddir, name, e)
}

// finish sets a written file's mode and mtime.
func (r *restorer) finish(f *os.File, dir int, name string, e Entry) error {
	if err := f.Chmod(e.Mode); err != nil {
		return fmt.Errorf("chmod %s: %w", e.Path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", e.Path, err)
	}
	if err := setMTime(dir, name, e.MTime); err != nil {
		return fmt.Errorf("set mtime of %s: %w", e.Path, err)
	}
	return nil
}

func setMTime(dir int, name string, mtime int64) error {
	ts := unix.NsecToTimespec(mtime)
	return unix.UtimesNanoAt(dir, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

func corrupt(why string) error { return fmt.Errorf("%s: %w", why, ErrCorrupt) }

// get opens a download: its presigned URL, or the workspace's own store.
// size is the object's length, or -1 if unknown.
func (d *Dir) get(ctx context.Context, dl *Download) (io.ReadCloser, int64, error) {
	if dl.URL == "" {
		if d.Blob == nil {
			return nil, 0, errors.New("no URL and no object store")
		}
		rc, info, err := d.Blob.Get(ctx, dl.Key)
		if errors.Is(err, blob.ErrNotFound) {
			return nil, 0, corrupt("the object is missing")
		}
		if err != nil {
			return nil, 0, err
		}
		return rc, info.Size, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, dl.URL, nil)
	if err != nil {
		return nil, 0, invalidf("download URL: %v", err)
	}
	resp, err := d.client().Do(req)
	if err != nil {
		return nil, 0, transportErr(ctx, http.MethodGet, dl.URL, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		return nil, 0, corrupt("the object is missing")
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, 0, statusErr(http.MethodGet, dl.URL, resp)
	}
	return &httpBody{ctx: ctx, method: http.MethodGet, url: dl.URL, rc: resp.Body}, resp.ContentLength, nil
}

// httpBody maps read errors of a response body like request errors.
type httpBody struct {
	ctx    context.Context
	method string
	url    string
	rc     io.ReadCloser
}

func (b *httpBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		err = transportErr(b.ctx, b.method, b.url, err)
	}
	return n, err
}

func (b *httpBody) Close() error { return b.rc.Close() }

// redact returns a presigned URL without its query, which holds the
// signature: errors and logs must not carry it.
func redact(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		return raw[:i]
	}
	return raw
}

// transportErr describes a failed request to a presigned URL as the object
// store being unavailable (unless ctx ended), without the URL's signature.
func transportErr(ctx context.Context, method, rawURL string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err // *url.Error quotes the whole URL.
	}
	return fmt.Errorf("%s %s: %v: %w", method, redact(rawURL), err, blob.ErrUnavailable)
}

// statusErr describes an error response of the object store.
func statusErr(method, rawURL string, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	code := ""
	if i := strings.Index(string(body), "<Code>"); i >= 0 {
		if j := strings.Index(string(body[i:]), "</Code>"); j >= 0 {
			code = " " + string(body[i+len("<Code>"):i+j])
		}
	}
	msg := fmt.Sprintf("%s %s: %s%s", method, redact(rawURL), resp.Status, code)
	switch {
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return fmt.Errorf("%s: %w", msg, blob.ErrUnavailable)
	case resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%s: the presigned URL was refused (expired, or the clocks of the node and the object store disagree)", msg)
	}
	return errors.New(msg)
}

// dirs opens directories below a root directory without following symbolic
// links, caching their descriptors. Not safe for concurrent use.
type dirs struct {
	root  int
	cache map[string]int // directory path -> descriptor
}

// maxCachedDirs bounds the descriptors a dirs keeps open.
const maxCachedDirs = 128

func newDirs(root int) *dirs { return &dirs{root: root, cache: make(map[string]int)} }

// open returns a descriptor of directory dir ("." for the root).
func (c *dirs) open(dir string) (int, error) {
	if dir == "." || dir == "" {
		return c.root, nil
	}
	if fd, ok := c.cache[dir]; ok {
		return fd, nil
	}
	parent, err := c.open(path.Dir(dir))
	if err != nil {
		return -1, err
	}
	fd, err := unix.Openat(parent, path.Base(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open directory %s: %w", dir, err)
	}
	if len(c.cache) >= maxCachedDirs {
		c.close() // The caller holds no descriptor but the one returned.
	}
	c.cache[dir] = fd
	return fd, nil
}

// forget closes and drops the cached descriptor of dir.
func (c *dirs) forget(dir string) {
	if fd, ok := c.cache[dir]; ok {
		unix.Close(fd)
		delete(c.cache, dir)
	}
}

func (c *dirs) close() {
	for dir, fd := range c.cache {
		unix.Close(fd)
		delete(c.cache, dir)
	}
}

// parallel runs f for 0..n-1 with at most limit calls at once. The first
// error cancels the others' context and is returned.
func parallel(ctx context.Context, limit, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	sem := make(chan struct{}, limit)
loop:
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(ctx, i); err != nil {
				once.Do(func() {
					first = err
					cancel(err)
				})
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}
