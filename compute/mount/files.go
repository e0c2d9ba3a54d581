package mount

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/atriumhq/atrium/storage/blob"
)

// A saved workspace can be read and changed without a sandbox: the node
// serves the files of a session whose sandbox sleeps from its manifest, and
// writes a file by uploading its content and rewriting the manifest
// (conditionally, like Save). Besides the manifest and content, the
// volume's prefix holds:
//
//	manifests/<id>.json   immutable copies of manifests (KeepManifest), for the
//	                      changes of a turn and for forks at an older seq
//	marks/<name>.json     what a turn or a file operation changed (Mark)
//	forks/<session>       a fork references this volume's content
//
// A fork's manifest names content where it is, by full key
// ("sessions/<parent>/workspace/objects/<id>"), so a fork of a 100 MB
// workspace writes one manifest and no content. Delete keeps the content of
// a volume that has forks; Volume.Collect deletes nothing from a volume
// that keeps manifests or has forks, while a Collector pass, which sees
// every volume, keeps exactly what current manifests, kept manifests within
// Collector.KeepHistory and forks' bases name.

// Errors of reading and changing a saved workspace by path.
var (
	// ErrNoEntry means no file or directory has the path.
	ErrNoEntry = errors.New("mount: no such file or directory in the workspace")
	// ErrOutside means the path leaves the workspace: through a symbolic
	// link, or a link whose target does.
	ErrOutside = errors.New("mount: path leads out of the workspace")
	// ErrIsDir means the path is a directory where a file was expected.
	ErrIsDir = errors.New("mount: path is a directory")
	// ErrNotDir means a parent of the path, or a listed path, is not a
	// directory.
	ErrNotDir = errors.New("mount: path is not a directory")
)

// Sub-prefixes of a volume.
const (
	keptDir  = "manifests/"
	marksDir = "marks/"
	forksDir = "forks/"
)

// BlobKey returns the full store key of a content location of the volume
// at prefix: Entry.Blob is relative to the prefix ("objects/<id>") or, for
// content shared with another session's volume, a full key.
func BlobKey(prefix, loc string) string {
	if strings.HasPrefix(loc, "sessions/") {
		return loc
	}
	return prefix + loc
}

// validSharedKey checks a full content key:
// sessions/<id>/workspace/(objects|packs)/<hex>.
func validSharedKey(k string) error {
	parts := strings.Split(k, "/")
	if len(parts) != 5 || parts[0] != "sessions" || parts[1] == "" || parts[2] != "workspace" ||
		(parts[3] != "objects" && parts[3] != "packs") || !isHex(parts[4]) {
		return invalidf("invalid shared content key %q", k)
	}
	return blob.ValidKey(k)
}

// isContentKey reports whether key is content of the volume at prefix.
func isContentKey(prefix, key string) bool {
	return strings.HasPrefix(key, prefix+"objects/") || strings.HasPrefix(key, prefix+"packs/")
}

func anyUnder(ctx context.Context, store blob.Store, prefix string) (bool, error) {
	for _, err := range store.List(ctx, prefix) {
		if err != nil {
			return false, err
		}
		return true, nil
	}
	return false, nil
}

// hasForks reports whether a fork references the content of the volume at
// prefix.
func hasForks(ctx context.Context, store blob.Store, prefix string) (bool, error) {
	return anyUnder(ctx, store, prefix+forksDir)
}

// keepsHistory reports whether the volume keeps manifests or has forks.
func keepsHistory(ctx context.Context, store blob.Store, prefix string) (bool, error) {
	if ok, err := hasForks(ctx, store, prefix); ok || err != nil {
		return ok, err
	}
	return anyUnder(ctx, store, prefix+keptDir)
}

// ReadManifest reads the saved manifest of the volume at prefix and its
// ETag; with no saved copy it returns an empty manifest and "".
func ReadManifest(ctx context.Context, store blob.Store, prefix string) (*Manifest, string, error) {
	v := &Volume{Blob: store, Prefix: prefix}
	if err := v.check(); err != nil {
		return nil, "", err
	}
	m, info, err := v.read(ctx)
	if errors.Is(err, blob.ErrNotFound) {
		return &Manifest{Version: Version, Entries: []Entry{}}, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	return m, info.ETag, nil
}

// KeepManifest stores an immutable copy of m under manifests/<id>.json; a copy
// that exists is left as it is.
func KeepManifest(ctx context.Context, store blob.Store, prefix string, m *Manifest) error {
	if m == nil || m.ID == "" {
		return nil
	}
	key := prefix + keptDir + m.ID + ".json"
	if _, err := store.Stat(ctx, key); err == nil {
		return nil
	}
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("keep manifest: %w", err)
	}
	_, err = store.Put(ctx, key, bytes.NewReader(data), int64(len(data)), blob.PutOptions{ContentType: "application/json", IfNoneMatch: true})
	if err != nil && !errors.Is(err, blob.ErrPrecondition) {
		return fmt.Errorf("keep manifest %s: %w", m.ID, err)
	}
	return nil
}

// ReadKept reads the kept copy of manifest id.
func ReadKept(ctx context.Context, store blob.Store, prefix, id string) (*Manifest, error) {
	if !isHex(id) {
		return nil, invalidf("invalid manifest id %q", id)
	}
	var m Manifest
	err := readJSON(ctx, store, prefix+keptDir+id+".json", &m)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, fmt.Errorf("the workspace as of then is no longer kept (its manifest %s was collected: "+
			"the workspace's history is kept for storage.workspace_history): %w", id, err)
	}
	if err != nil {
		return nil, fmt.Errorf("read kept manifest %s: %w", id, err)
	}
	if err := validEntries(m.Entries, true, true); err != nil {
		return nil, fmt.Errorf("read kept manifest %s: %v: %w", id, err, ErrCorrupt)
	}
	return &m, nil
}

func readJSON(ctx context.Context, store blob.Store, key string, v any) error {
	rc, _, err := store.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxManifest))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%v: %w", err, ErrCorrupt)
	}
	return nil
}

func writeJSON(ctx context.Context, store blob.Store, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = store.Put(ctx, key, bytes.NewReader(data), int64(len(data)), blob.PutOptions{ContentType: "application/json"})
	return err
}

// Lookup returns the entry of path p.
func (m *Manifest) Lookup(p string) (Entry, bool) {
	i, ok := slices.BinarySearchFunc(m.Entries, p, func(e Entry, p string) int { return strings.Compare(e.Path, p) })
	if !ok {
		return Entry{}, false
	}
	return m.Entries[i], true
}

// CleanPath checks a path given by a user, relative to the workspace root
// (a leading "/workspace/" or "/" is not allowed: paths are relative), and
// returns it cleaned; "" or "." is the root.
func CleanPath(p string) (string, error) {
	if p == "" || p == "." {
		return "", nil
	}
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: %q is absolute; give a path relative to /workspace", ErrOutside, p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", fmt.Errorf("%w: %q has a '..' element", ErrOutside, p)
		}
	}
	c := path.Clean(p)
	if c == "." {
		return "", nil
	}
	if err := validPath(c); err != nil {
		return "", err
	}
	return c, nil
}

// checkParents checks that every parent of p is a directory of m: a
// symbolic link among them leads out (ErrOutside), a file is ErrNotDir.
func (m *Manifest) checkParents(p string) error {
	for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
		e, ok := m.Lookup(dir)
		switch {
		case !ok:
			continue
		case e.Type == TypeSymlink:
			return fmt.Errorf("%w: %s is a symbolic link", ErrOutside, dir)
		case e.Type != TypeDir:
			return fmt.Errorf("%w: %s is a file", ErrNotDir, dir)
		}
	}
	return nil
}

// Resolve returns the entry at p, following symbolic links whose targets
// stay inside the workspace. A link that leads out, or a parent that is a
// link, fails with ErrOutside; a missing path with ErrNoEntry.
func (m *Manifest) Resolve(p string) (Entry, error) {
	for hops := 0; hops < 40; hops++ {
		if p == "" {
			return Entry{Path: "", Type: TypeDir, Mode: 0o755}, nil
		}
		if err := m.checkParents(p); err != nil {
			return Entry{}, err
		}
		e, ok := m.Lookup(p)
		if !ok {
			return Entry{}, fmt.Errorf("%w: %s", ErrNoEntry, p)
		}
		if e.Type != TypeSymlink {
			return e, nil
		}
		t := e.Target
		if strings.HasPrefix(t, "/workspace/") {
			t = strings.TrimPrefix(t, "/workspace/")
		} else if strings.HasPrefix(t, "/") {
			return Entry{}, fmt.Errorf("%w: %s links to %s", ErrOutside, e.Path, e.Target)
		} else {
			t = path.Join(path.Dir(e.Path), t)
		}
		next, err := CleanPath(t)
		if err != nil || strings.HasPrefix(t, "../") || t == ".." {
			return Entry{}, fmt.Errorf("%w: %s links to %s", ErrOutside, e.Path, e.Target)
		}
		p = next
	}
	return Entry{}, fmt.Errorf("%w: too many levels of symbolic links", ErrOutside)
}

// List returns the entries below directory dir ("" is the root): its
// children, or everything under it when recursive.
func (m *Manifest) List(dir string, recursive bool) ([]Entry, error) {
	if dir != "" {
		e, err := m.Resolve(dir)
		if err != nil {
			return nil, err
		}
		if e.Type != TypeDir {
			return nil, fmt.Errorf("%w: %s", ErrNotDir, dir)
		}
		dir = e.Path
	}
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	start, _ := slices.BinarySearchFunc(m.Entries, prefix, func(e Entry, p string) int { return strings.Compare(e.Path, p) })
	var out []Entry
	for _, e := range m.Entries[start:] {
		if !strings.HasPrefix(e.Path, prefix) {
			break // Sorted: the entries under dir are contiguous.
		}
		if !recursive && strings.Contains(e.Path[len(prefix):], "/") {
			continue
		}
		out = append(out, e)
	}
	return out, nil
}

// Open returns a reader of file e's content from the store, which checks
// the content's hash at the end (ErrCorrupt on a mismatch).
func Open(ctx context.Context, store blob.Store, prefix string, e Entry) (io.ReadCloser, error) {
	if e.Type != TypeFile {
		return nil, fmt.Errorf("%w: %s", ErrIsDir, e.Path)
	}
	if e.Size == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	rc, _, err := store.Get(ctx, BlobKey(prefix, e.Blob))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", e.Path, err)
	}
	if e.Offset > 0 {
		if _, err := io.CopyN(io.Discard, rc, e.Offset); err != nil {
			rc.Close()
			return nil, fmt.Errorf("open %s: %v: %w", e.Path, err, ErrCorrupt)
		}
	}
	return &checkedReader{rc: rc, r: io.LimitReader(rc, e.Size), h: sha256.New(), e: e}, nil
}

type checkedReader struct {
	rc io.ReadCloser
	r  io.Reader
	h  interface {
		io.Writer
		Sum([]byte) []byte
	}
	e Entry
	n int64
}

func (c *checkedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if err == io.EOF {
		if c.n != c.e.Size || hex.EncodeToString(c.h.Sum(nil)) != c.e.Hash {
			return n, fmt.Errorf("content of %s does not match its hash: %w", c.e.Path, ErrCorrupt)
		}
	}
	return n, err
}

func (c *checkedReader) Close() error { return c.rc.Close() }

// PutContent uploads size bytes of r as a new content object of the volume
// at prefix and returns a file entry with its location, size and hash (the
// caller sets Path, Mode and MTime). A reader that fails or ends early
// stores nothing that a manifest references.
func PutContent(ctx context.Context, store blob.Store, prefix string, r io.Reader, size int64) (Entry, error) {
	e := Entry{Type: TypeFile, Size: size}
	h := sha256.New()
	if size == 0 {
		e.Hash = hex.EncodeToString(h.Sum(nil))
		return e, nil
	}
	if err := reserve(ctx, store, prefix, size); err != nil {
		return Entry{}, err
	}
	e.Blob = "objects/" + hexID(16)
	if _, err := store.Put(ctx, prefix+e.Blob, io.TeeReader(r, h), size, blob.PutOptions{}); err != nil {
		return Entry{}, fmt.Errorf("upload content: %w", err)
	}
	e.Hash = hex.EncodeToString(h.Sum(nil))
	return e, nil
}

// SetEntry returns entries with e at e.Path (replacing a file or link
// there), and the directories above it made as needed (mode 0755, mtime
// now). A directory at e.Path fails with ErrIsDir unless e is a directory;
// a parent that is a file fails with ErrNotDir, one that is a link with
// ErrOutside.
func SetEntry(entries []Entry, e Entry, now int64) ([]Entry, error) {
	if err := validPath(e.Path); err != nil {
		return nil, err
	}
	m := &Manifest{Entries: entries}
	if err := m.checkParents(e.Path); err != nil {
		return nil, err
	}
	out := slices.Clone(entries)
	for dir := path.Dir(e.Path); dir != "."; dir = path.Dir(dir) {
		if _, ok := m.Lookup(dir); !ok {
			out = append(out, Entry{Path: dir, Type: TypeDir, Mode: 0o755, MTime: now})
		}
	}
	if old, ok := m.Lookup(e.Path); ok {
		if old.Type == TypeDir {
			if e.Type == TypeDir {
				return entries, nil
			}
			return nil, fmt.Errorf("%w: %s", ErrIsDir, e.Path)
		}
		out = slices.DeleteFunc(out, func(x Entry) bool { return x.Path == e.Path })
	}
	out = append(out, e)
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

// RemoveEntry returns entries without p and everything under it, and
// whether p was there.
func RemoveEntry(entries []Entry, p string) ([]Entry, bool) {
	found := false
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if e.Path == p || strings.HasPrefix(e.Path, p+"/") {
			found = true
			continue
		}
		out = append(out, e)
	}
	return out, found
}

// Update rewrites the saved manifest of the volume at prefix without a
// sandbox: apply gets its entries (empty without a saved copy) and returns
// the new ones, written conditionally on the manifest being unchanged since
// it was read (retried a few times on a conflict) and refused with
// ErrFenced when the saved copy belongs to a newer fence. It returns the
// manifest written (the old one, unwritten, when apply changed nothing).
func Update(ctx context.Context, store blob.Store, prefix string, fence int64, apply func([]Entry) ([]Entry, error)) (*Manifest, error) {
	v := &Volume{Blob: store, Prefix: prefix}
	if err := v.check(); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		m, etag, err := ReadManifest(ctx, store, prefix)
		if err != nil {
			return nil, err
		}
		if m.Fence > fence {
			return nil, fenced(m.Fence, fence)
		}
		entries, err := apply(slices.Clone(m.Entries))
		if err != nil {
			return nil, err
		}
		if etag != "" && slices.Equal(entries, m.Entries) {
			return m, nil
		}
		if err := validEntries(entries, true, true); err != nil {
			return nil, err
		}
		next := &Manifest{Version: Version, ID: hexID(16), Fence: fence, Saved: time.Now().UTC(), Scanned: time.Now().UnixNano(), Entries: entries}
		_, _, err = v.writeManifest(ctx, next, etag)
		if errors.Is(err, ErrConflict) && attempt < 4 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return next, nil
	}
}

// ForkTo makes m, a manifest of the volume at src, the saved workspace of
// the volume at dst (which must have none), and records the fork at src so
// that deleting src keeps what the fork uses. The fork's manifest names a
// kept copy of m (Manifest.Base, written unless it exists, as it does for a
// manifest a turn or a file write ended with), so a fork writes a marker and
// a manifest of a few hundred bytes whatever the workspace's size; its
// first save writes a manifest of its own.
func ForkTo(ctx context.Context, store blob.Store, src string, m *Manifest, dst, child string) error {
	if m == nil || len(m.Entries) == 0 {
		return nil
	}
	if err := blob.ValidKey(src + forksDir + child); err != nil {
		return err
	}
	if m.ID == "" {
		return invalidf("a manifest without an id cannot be forked")
	}
	if err := KeepManifest(ctx, store, src, m); err != nil {
		return err
	}
	if err := writeJSON(ctx, store, src+forksDir+child, map[string]string{"fork": dst}); err != nil {
		return fmt.Errorf("record fork: %w", err)
	}
	v := &Volume{Blob: store, Prefix: dst}
	next := &Manifest{Version: Version, ID: hexID(16), Saved: time.Now().UTC(), Scanned: m.Scanned, Entries: []Entry{},
		Base: src + keptDir + m.ID + ".json"}
	if _, _, err := v.writeManifest(ctx, next, ""); err != nil {
		return fmt.Errorf("write forked manifest: %w", err)
	}
	return nil
}

// resolveBase fills m's entries from the kept manifest its Base names,
// their content named by full key.
func resolveBase(ctx context.Context, store blob.Store, m *Manifest) error {
	src, _, ok := strings.Cut(m.Base, keptDir)
	if !ok || !strings.HasPrefix(m.Base, "sessions/") || len(m.Entries) > 0 {
		return fmt.Errorf("invalid base %q: %w", m.Base, ErrCorrupt)
	}
	var base Manifest
	if err := readJSON(ctx, store, m.Base, &base); err != nil {
		return fmt.Errorf("read base %s: %w", m.Base, err)
	}
	if base.Base != "" {
		return fmt.Errorf("base %s has a base itself: %w", m.Base, ErrCorrupt)
	}
	m.Entries = base.Entries
	for i := range m.Entries {
		if m.Entries[i].Blob != "" {
			m.Entries[i].Blob = BlobKey(src, m.Entries[i].Blob)
		}
	}
	m.Base = ""
	return nil
}

// Change is a file, or symbolic link, that differs between two manifests.
type Change struct {
	Path   string `json:"path"`
	Status string `json:"status"` // "added", "modified" or "deleted"
	Old    *Entry `json:"old,omitempty"`
	New    *Entry `json:"new,omitempty"`
}

// Change statuses.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Diff returns the files and symbolic links that differ between the sorted
// entries a and b (content, link target, type or permission bits), in path
// order. Directories are not listed. It walks both lists once.
func Diff(a, b []Entry) []Change {
	var out []Change
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].Path < b[j].Path):
			if a[i].Type != TypeDir {
				out = append(out, Change{Path: a[i].Path, Status: Deleted, Old: &a[i]})
			}
			i++
		case i == len(a) || b[j].Path < a[i].Path:
			if b[j].Type != TypeDir {
				out = append(out, Change{Path: b[j].Path, Status: Added, New: &b[j]})
			}
			j++
		default:
			x, y := a[i], b[j]
			switch {
			case x.Type == TypeDir && y.Type == TypeDir:
			case x.Type == TypeDir:
				out = append(out, Change{Path: y.Path, Status: Added, New: &b[j]})
			case y.Type == TypeDir:
				out = append(out, Change{Path: x.Path, Status: Deleted, Old: &a[i]})
			case x.Type != y.Type || x.Hash != y.Hash || x.Target != y.Target || x.Mode != y.Mode:
				out = append(out, Change{Path: x.Path, Status: Modified, Old: &a[i], New: &b[j]})
			}
			i++
			j++
		}
	}
	return out
}

// Mark records what one turn (Turn) or one file operation (Seq, its
// files_changed event) did to the workspace: the manifests before and after
// (ids of kept copies; "" for an empty workspace) and the changes between.
type Mark struct {
	Turn    int64     `json:"turn,omitempty"`
	Seq     int64     `json:"seq,omitempty"`
	Before  string    `json:"before"`
	After   string    `json:"after"`
	Changes []Change  `json:"changes"`
	Saved   time.Time `json:"saved"`
}

// TurnMark and SeqMark name marks.
func TurnMark(turn int64) string { return "turn-" + strconv.FormatInt(turn, 10) }
func SeqMark(seq int64) string   { return "seq-" + strconv.FormatInt(seq, 10) }

// WriteMark stores mk under marks/<name>.json.
func WriteMark(ctx context.Context, store blob.Store, prefix, name string, mk *Mark) error {
	if err := writeJSON(ctx, store, prefix+marksDir+name+".json", mk); err != nil {
		return fmt.Errorf("write workspace mark %s: %w", name, err)
	}
	return nil
}

// ReadMark reads mark name; blob.ErrNotFound when there is none.
func ReadMark(ctx context.Context, store blob.Store, prefix, name string) (*Mark, error) {
	var mk Mark
	if err := readJSON(ctx, store, prefix+marksDir+name+".json", &mk); err != nil {
		return nil, fmt.Errorf("read workspace mark %s: %w", name, err)
	}
	return &mk, nil
}

// ReadAt returns the manifest a mark names: its kept copy, or an empty
// manifest for "".
func ReadAt(ctx context.Context, store blob.Store, prefix, id string) (*Manifest, error) {
	if id == "" {
		return &Manifest{Version: Version, Entries: []Entry{}}, nil
	}
	return ReadKept(ctx, store, prefix, id)
}
