package mount

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/storage/blob"
)

// Defaults of Volume.
const (
	// DefaultPackSize is the size packs of small files are filled to.
	DefaultPackSize = 8 << 20
	// DefaultSmallFile is the size from which a file gets an object of its
	// own instead of going into a pack.
	DefaultSmallFile = 256 << 10
	// DefaultURLTTL is how long presigned URLs stay valid.
	DefaultURLTTL = time.Hour
	// DefaultCollectGrace is how old an unreferenced object must be before
	// Collect deletes it.
	DefaultCollectGrace = time.Hour
)

// MaxSparsePacks is how many packs holding less than a quarter of PackSize
// of live content a manifest may reference before a save repacks them.
const MaxSparsePacks = 8

// maxManifest bounds the manifest a Volume reads.
const maxManifest = 1 << 30

// Volume is the saved copy of one workspace in an object store, under
// Prefix (Prefix(id) for a session). It is the node's half of this package:
// it reads and writes the manifest, plans transfers, and presigns URLs for
// workspaces that cannot reach the store (see the package doc).
//
// A Volume remembers which saved copy its workspace holds (the one it last
// restored or saved), and Save writes over that copy only: keep one Volume
// per sandbox for as long as the sandbox lives. Its methods are safe for
// concurrent use and run one at a time.
type Volume struct {
	// Blob is the object store. Required.
	Blob blob.Store
	// Prefix is the key prefix of the saved workspace, ending in "/".
	// Required.
	Prefix string
	// PackSize and SmallFile tune packing; 0 means DefaultPackSize and
	// DefaultSmallFile.
	PackSize  int64
	SmallFile int64
	// URLTTL is the validity of presigned URLs; 0 means DefaultURLTTL. A
	// plan must finish within it.
	URLTTL time.Duration
	// Logger receives one line per save and restore; nil means
	// slog.Default().
	Logger *slog.Logger

	mu     sync.Mutex // held for a whole Save, Restore, Collect or Delete
	known  bool       // guarded by mu: the workspace holds base (or no copy existed)
	etag   string     // guarded by mu: ETag of base's manifest; "" when none existed
	base   *Manifest  // guarded by mu
	marked *Manifest  // guarded by mu: base at the last Mark or Restore; nil: empty
}

// Mark returns the manifest the workspace held at the previous Mark (or at
// the Restore, if none since) and the one it holds now (the last saved or
// restored; nil for an empty workspace never saved), and makes the current
// one the next Mark's start. The node marks at the end of each turn and
// after each file operation, so a turn's changes are the difference between
// the two, computed from manifests without scanning the workspace again.
func (v *Volume) Mark() (before, after *Manifest) {
	v.mu.Lock()
	defer v.mu.Unlock()
	before, after = v.marked, v.base
	v.marked = v.base
	return before, after
}

func (v *Volume) logger() *slog.Logger {
	if v.Logger != nil {
		return v.Logger
	}
	return slog.Default()
}

func (v *Volume) packSize() int64 {
	if v.PackSize > 0 {
		return v.PackSize
	}
	return DefaultPackSize
}

func (v *Volume) smallFile() int64 {
	if v.SmallFile > 0 {
		return v.SmallFile
	}
	return DefaultSmallFile
}

func (v *Volume) check() error {
	if v.Blob == nil {
		return errors.New("volume has no object store")
	}
	if !strings.HasSuffix(v.Prefix, "/") {
		return fmt.Errorf("volume prefix %q must end with /", v.Prefix)
	}
	if err := blob.ValidKey(strings.TrimSuffix(v.Prefix, "/")); err != nil {
		return fmt.Errorf("volume prefix: %w", err)
	}
	return nil
}

// Save stores the workspace's current contents: it scans ws (reading only
// files changed since the last save or restore), uploads the content the
// store lacks, then writes the manifest conditionally. It fails with
// ErrNotRestored if a saved copy exists that this Volume did not restore
// or save, ErrConflict if another writer saved since, and ErrFenced if the
// saved copy's fencing token is greater than fence; in all three cases
// nothing is overwritten. When nothing changed it writes nothing.
//
// Files are read while the sandbox may run: a file rewritten between the
// scan and its upload makes that attempt fail (appending is fine), and Save
// tries again twice before failing with ErrChanged. Saves at quiet points
// (end of a turn, before sleep) do not see this.
func (v *Volume) Save(ctx context.Context, ws Workspace, fence int64) (Stats, error) {
	if err := v.check(); err != nil {
		return Stats{}, fmt.Errorf("save workspace: %w", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	start := time.Now()
	var (
		st  Stats
		err error
	)
	for attempt := 1; ; attempt++ {
		st, err = v.save(ctx, ws, fence)
		if !errors.Is(err, ErrChanged) || attempt == 3 || ctx.Err() != nil {
			break
		}
	}
	st.Duration = time.Since(start)
	if err != nil {
		return st, fmt.Errorf("save workspace %s: %w", v.Prefix, err)
	}
	level := slog.LevelInfo
	if st.ManifestBytes == 0 {
		level = slog.LevelDebug // Nothing changed.
	}
	v.logger().Log(ctx, level, "workspace saved", "prefix", v.Prefix, "files", st.Files, "bytes", st.Bytes,
		"hashed", st.Hashed, "objects_written", st.ObjectsWritten, "bytes_written", st.BytesWritten,
		"skipped", len(st.Skipped), "duration", st.Duration)
	return st, nil
}

func (v *Volume) save(ctx context.Context, ws Workspace, fence int64) (Stats, error) {
	etag, prev, err := v.current(ctx, fence)
	if err != nil {
		return Stats{}, err
	}
	scan, err := ws.Scan(ctx, &ScanRequest{Prev: prev})
	if err != nil {
		return Stats{}, err
	}
	if err := validEntries(scan.Entries, true, false); err != nil {
		return Stats{}, fmt.Errorf("scan: %w", err)
	}
	entries, uploads := v.plan(prev, scan.Entries)
	st := treeStats(entries)
	st.Hashed, st.HashedBytes, st.Skipped = scan.Hashed, scan.HashedBytes, scan.Skipped
	if len(uploads) == 0 && prev != nil && prev.Fence == fence && slices.Equal(prev.Entries, entries) {
		return st, nil
	}
	if len(uploads) > 0 {
		var n int64
		for _, u := range uploads {
			n += u.Size
		}
		if err := reserve(ctx, v.Blob, v.Prefix, n); err != nil {
			return st, err
		}
		// The pending marker keeps collectors away from the objects until
		// the manifest naming them is written (see Collector).
		done, err := v.pending(ctx)
		if err != nil {
			return st, err
		}
		defer done()
		plan := &UploadPlan{Uploads: uploads}
		if !scan.Direct {
			if err := v.presignUploads(ctx, plan); err != nil {
				return st, err
			}
		}
		tr, err := ws.Upload(ctx, plan)
		if err != nil {
			return st, err
		}
		st.ObjectsWritten, st.BytesWritten = tr.Objects, tr.Bytes
	}
	m := &Manifest{Version: Version, ID: hexID(16), Fence: fence, Saved: time.Now().UTC(), Scanned: scan.Started, Entries: entries}
	newETag, n, err := v.writeManifest(ctx, m, etag)
	if err != nil {
		return st, err
	}
	st.ManifestBytes = n
	v.known, v.etag, v.base = true, newETag, m
	return st, nil
}

// pending writes a marker of a save in progress under pending/ and returns
// the function that removes it.
func (v *Volume) pending(ctx context.Context) (func(), error) {
	key := v.Prefix + pendingDir + hexID(16)
	if _, err := v.Blob.Put(ctx, key, strings.NewReader(""), 0, blob.PutOptions{}); err != nil {
		return nil, fmt.Errorf("mark the save in progress: %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := v.Blob.Delete(ctx, key); err != nil {
			// A collector removes it after Collector.MaxSave.
			v.logger().Warn("remove the marker of a save in progress", "key", key, "err", err)
		}
	}, nil
}

// current checks that Save may write over the saved copy and returns its
// ETag ("" when there is none) and the manifest the workspace holds.
func (v *Volume) current(ctx context.Context, fence int64) (string, *Manifest, error) {
	info, err := v.Blob.Stat(ctx, v.Prefix+ManifestKey)
	switch {
	case errors.Is(err, blob.ErrNotFound):
		if v.known && v.etag != "" {
			return "", nil, fmt.Errorf("%w: its saved copy was deleted since it was restored or saved", ErrConflict)
		}
		return "", nil, nil // The first save.
	case err != nil:
		return "", nil, fmt.Errorf("check manifest: %w", err)
	case !v.known:
		return "", nil, fmt.Errorf("%w: restore it before saving, so it is not saved over the good copy", ErrNotRestored)
	case info.ETag != v.etag:
		m, _, err := v.read(ctx)
		if err == nil && m.Fence > fence {
			return "", nil, fenced(m.Fence, fence)
		}
		return "", nil, fmt.Errorf("%w since this node restored or saved it", ErrConflict)
	case v.base.Fence > fence:
		return "", nil, fenced(v.base.Fence, fence)
	}
	return v.etag, v.base, nil
}

func fenced(theirs, ours int64) error {
	return fmt.Errorf("%w (fence %d > %d)", ErrFenced, theirs, ours)
}

// writeManifest stores m in one request, if the manifest's ETag is still
// etag ("": if there is none). It returns the new ETag and the size.
func (v *Volume) writeManifest(ctx context.Context, m *Manifest, etag string) (string, int64, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return "", 0, fmt.Errorf("encode manifest: %w", err)
	}
	opts := blob.PutOptions{ContentType: "application/json", IfMatch: etag, IfNoneMatch: etag == ""}
	info, err := v.Blob.Put(ctx, v.Prefix+ManifestKey, bytes.NewReader(data), int64(len(data)), opts)
	if errors.Is(err, blob.ErrPrecondition) {
		// Lost, or won and then lost a retry of the same request to itself.
		cur, curInfo, rerr := v.read(ctx)
		switch {
		case rerr == nil && cur.ID == m.ID:
			return curInfo.ETag, int64(len(data)), nil
		case rerr == nil && cur.Fence > m.Fence:
			return "", 0, fenced(cur.Fence, m.Fence)
		}
		return "", 0, fmt.Errorf("%w while this save ran; its manifest was not written", ErrConflict)
	}
	if err != nil {
		return "", 0, fmt.Errorf("write manifest: %w", err)
	}
	return info.ETag, int64(len(data)), nil
}

// read fetches and checks the manifest.
func (v *Volume) read(ctx context.Context) (*Manifest, blob.Info, error) {
	rc, info, err := v.Blob.Get(ctx, v.Prefix+ManifestKey)
	if err != nil {
		return nil, blob.Info{}, fmt.Errorf("read manifest: %w", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxManifest))
	if err != nil {
		return nil, blob.Info{}, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, blob.Info{}, fmt.Errorf("read manifest: %v: %w", err, ErrCorrupt)
	}
	if m.Base != "" {
		if err := resolveBase(ctx, v.Blob, &m); err != nil {
			return nil, blob.Info{}, fmt.Errorf("read manifest: %w", err)
		}
	}
	if m.Version != Version {
		return nil, blob.Info{}, fmt.Errorf("read manifest: version %d, this atrium reads version %d: %w", m.Version, Version, ErrCorrupt)
	}
	if err := validEntries(m.Entries, true, true); err != nil {
		return nil, blob.Info{}, fmt.Errorf("read manifest: %v: %w", err, ErrCorrupt)
	}
	return &m, info, nil
}

type location struct {
	blob   string
	offset int64
}

// plan assigns every file of a scan its content's location: the previous
// manifest's when it has the content, else a new object or a place in a new
// pack, which it returns as uploads.
func (v *Volume) plan(prev *Manifest, scanned []Entry) ([]Entry, []Upload) {
	known := make(map[string]location)
	if prev != nil {
		for _, e := range prev.Entries {
			if e.Type == TypeFile && e.Blob != "" {
				known[e.Hash] = location{e.Blob, e.Offset}
			}
		}
	}
	entries := slices.Clone(scanned)
	live := make(map[string]int64) // pack -> bytes of content still referenced
	counted := make(map[location]bool)
	for i := range entries {
		e := &entries[i]
		e.Blob, e.Offset = "", 0
		if e.Type != TypeFile || e.Size == 0 {
			continue
		}
		if l, ok := known[e.Hash]; ok {
			e.Blob, e.Offset = l.blob, l.offset
			if strings.HasPrefix(l.blob, "packs/") && !counted[l] {
				counted[l] = true
				live[l.blob] += e.Size
			}
		}
	}
	// Repack the files of sparse packs once there are too many of them.
	sparse := make(map[string]bool)
	for p, n := range live {
		if n < v.packSize()/4 {
			sparse[p] = true
		}
	}
	if len(sparse) <= MaxSparsePacks {
		clear(sparse)
	}
	var (
		uploads []Upload
		pack    *Upload
		packKey string
	)
	planned := make(map[string]location) // content uploaded by this save
	for i := range entries {
		e := &entries[i]
		if e.Type != TypeFile || e.Size == 0 || (e.Blob != "" && !sparse[e.Blob]) {
			continue
		}
		if l, ok := planned[e.Hash]; ok {
			e.Blob, e.Offset = l.blob, l.offset
			continue
		}
		part := Part{Path: e.Path, Size: e.Size, Hash: e.Hash}
		if e.Size >= v.smallFile() {
			e.Blob, e.Offset = "objects/"+hexID(16), 0
			uploads = append(uploads, Upload{Key: v.Prefix + e.Blob, Size: e.Size, Parts: []Part{part}})
		} else {
			if pack == nil || pack.Size+e.Size > v.packSize() {
				if pack != nil {
					uploads = append(uploads, *pack)
				}
				packKey = "packs/" + hexID(16)
				pack = &Upload{Key: v.Prefix + packKey}
			}
			e.Blob, e.Offset = packKey, pack.Size
			pack.Parts = append(pack.Parts, part)
			pack.Size += e.Size
		}
		planned[e.Hash] = location{e.Blob, e.Offset}
	}
	if pack != nil {
		uploads = append(uploads, *pack)
	}
	return entries, uploads
}

func treeStats(entries []Entry) Stats {
	var st Stats
	for _, e := range entries {
		switch e.Type {
		case TypeFile:
			st.Files++
			st.Bytes += e.Size
		case TypeDir:
			st.Dirs++
		case TypeSymlink:
			st.Symlinks++
		}
	}
	return st
}

func (v *Volume) presigner() (blob.Presigner, error) {
	p, ok := v.Blob.(blob.Presigner)
	if !ok {
		return nil, fmt.Errorf("the workspace cannot reach the object store itself and %T cannot presign URLs: remote sandboxes need an S3 store", v.Blob)
	}
	return p, nil
}

func (v *Volume) ttl() time.Duration {
	if v.URLTTL > 0 {
		return v.URLTTL
	}
	return DefaultURLTTL
}

func (v *Volume) presignUploads(ctx context.Context, plan *UploadPlan) error {
	p, err := v.presigner()
	if err != nil {
		return err
	}
	for i := range plan.Uploads {
		u := &plan.Uploads[i]
		if u.URL, err = p.PresignPut(ctx, u.Key, v.ttl()); err != nil {
			return err
		}
	}
	return nil
}

// Restore makes the workspace the saved copy: it reads the manifest, takes
// the content the workspace already holds from there, downloads the rest,
// and has ws swap the new tree in (see Workspace.Restore). Without a saved
// copy it leaves ws as it is. A manifest with a smaller fencing token is
// first rewritten with fence, so its previous owner can no longer save; one
// with a greater token fails with ErrFenced.
//
// If Restore fails, the workspace is left as it was and Save refuses to
// write over the saved copy (ErrNotRestored) until a Restore succeeds.
func (v *Volume) Restore(ctx context.Context, ws Workspace, fence int64) (Stats, error) {
	if err := v.check(); err != nil {
		return Stats{}, fmt.Errorf("restore workspace: %w", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	start := time.Now()
	st, err := v.restore(ctx, ws, fence)
	st.Duration = time.Since(start)
	if err != nil {
		return st, fmt.Errorf("restore workspace %s: %w", v.Prefix, err)
	}
	v.logger().Info("workspace restored", "prefix", v.Prefix, "files", st.Files, "bytes", st.Bytes,
		"reused", st.Reused, "objects_read", st.ObjectsRead, "bytes_read", st.BytesRead, "duration", st.Duration)
	return st, nil
}

func (v *Volume) restore(ctx context.Context, ws Workspace, fence int64) (Stats, error) {
	v.known, v.etag, v.base, v.marked = false, "", nil, nil
	m, info, err := v.read(ctx)
	if errors.Is(err, blob.ErrNotFound) {
		v.known = true // Nothing saved yet: the workspace may be saved as it is.
		return Stats{}, nil
	}
	if err != nil {
		return Stats{}, err
	}
	if m.Fence > fence {
		return Stats{}, fenced(m.Fence, fence)
	}
	etag := info.ETag
	var size int64
	if m.Fence < fence {
		claim := *m
		claim.ID, claim.Fence, claim.Saved = hexID(16), fence, time.Now().UTC()
		if etag, size, err = v.writeManifest(ctx, &claim, etag); err != nil {
			return Stats{}, fmt.Errorf("claim: %w", err)
		}
		m = &claim
	}
	st := treeStats(m.Entries)
	st.ManifestBytes = max(size, info.Size)
	scan, err := ws.Scan(ctx, &ScanRequest{Prev: m, NoHash: true})
	if err != nil {
		return st, err
	}
	if err := validEntries(scan.Entries, false, false); err != nil {
		return st, fmt.Errorf("scan: %w", err)
	}
	plan := v.restorePlan(m, scan.Entries)
	if !scan.Direct {
		p, err := v.presigner()
		if err != nil {
			return st, err
		}
		for i := range plan.Downloads {
			d := &plan.Downloads[i]
			if d.URL, err = p.PresignGet(ctx, d.Key, v.ttl()); err != nil {
				return st, err
			}
		}
	}
	tr, err := ws.Restore(ctx, plan)
	if err != nil {
		return st, err
	}
	st.ObjectsRead, st.BytesRead, st.Reused = tr.Objects, tr.Bytes, tr.Reused
	v.known, v.etag, v.base, v.marked = true, etag, m, m
	return st, nil
}

// restorePlan lists, for each content of m, where the workspace gets it:
// from a file it already holds (a scan entry with the hash), or from its
// object.
func (v *Volume) restorePlan(m *Manifest, scanned []Entry) *RestorePlan {
	local := make(map[string]string) // hash -> path of a current file with it
	for _, e := range scanned {
		if e.Type == TypeFile && e.Hash != "" && e.Size > 0 {
			local[e.Hash] = e.Path
		}
	}
	plan := &RestorePlan{Entries: m.Entries}
	downloads := make(map[string]*Download)
	seen := make(map[string]bool)
	for _, e := range m.Entries {
		if e.Type != TypeFile || e.Size == 0 || seen[e.Hash] {
			continue
		}
		seen[e.Hash] = true
		if p, ok := local[e.Hash]; ok {
			plan.Keep = append(plan.Keep, Keep{Hash: e.Hash, Path: p})
			continue
		}
		d := downloads[e.Blob]
		if d == nil {
			d = &Download{Key: BlobKey(v.Prefix, e.Blob)}
			downloads[e.Blob] = d
		}
		d.Extracts = append(d.Extracts, Extract{Offset: e.Offset, Size: e.Size, Hash: e.Hash})
		d.Size = max(d.Size, e.Offset+e.Size)
	}
	for _, d := range downloads {
		slices.SortFunc(d.Extracts, func(a, b Extract) int { return cmp.Compare(a.Offset, b.Offset) })
		plan.Downloads = append(plan.Downloads, *d)
	}
	// Large objects first, so they do not finish last.
	slices.SortFunc(plan.Downloads, func(a, b Download) int {
		return cmp.Or(cmp.Compare(b.Size, a.Size), strings.Compare(a.Key, b.Key))
	})
	return plan
}

// Collect deletes the content objects the current manifest does not
// reference and that are older than grace (0 means DefaultCollectGrace),
// and returns how many it deleted. The grace period keeps the objects of a
// save still in progress, on this node or another.
func (v *Volume) Collect(ctx context.Context, grace time.Duration) (int, error) {
	if err := v.check(); err != nil {
		return 0, fmt.Errorf("collect workspace garbage: %w", err)
	}
	if grace <= 0 {
		grace = DefaultCollectGrace
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if keeps, err := keepsHistory(ctx, v.Blob, v.Prefix); err != nil || keeps {
		// Kept manifests (turn changes, forks) reference older content.
		return 0, err
	}
	live := make(map[string]bool)
	m, _, err := v.read(ctx)
	switch {
	case err == nil:
		for _, e := range m.Entries {
			if e.Blob != "" {
				live[BlobKey(v.Prefix, e.Blob)] = true
			}
		}
	case !errors.Is(err, blob.ErrNotFound):
		return 0, fmt.Errorf("collect workspace garbage %s: %w", v.Prefix, err)
	}
	cutoff := time.Now().Add(-grace)
	var garbage []string
	for _, dir := range []string{"objects/", "packs/"} {
		for info, err := range v.Blob.List(ctx, v.Prefix+dir) {
			if err != nil {
				return 0, fmt.Errorf("collect workspace garbage %s: %w", v.Prefix, err)
			}
			if !live[info.Key] && info.Modified.Before(cutoff) {
				garbage = append(garbage, info.Key)
			}
		}
	}
	for i, key := range garbage {
		if err := v.Blob.Delete(ctx, key); err != nil {
			return i, fmt.Errorf("collect workspace garbage %s: %w", v.Prefix, err)
		}
	}
	return len(garbage), nil
}

// Delete removes the saved workspace entirely, manifest first (for a
// session that is deleted). Afterwards the Volume behaves as for a
// workspace that was never saved.
func (v *Volume) Delete(ctx context.Context) error {
	if err := v.check(); err != nil {
		return fmt.Errorf("delete saved workspace: %w", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.Blob.Delete(ctx, v.Prefix+ManifestKey); err != nil {
		return fmt.Errorf("delete saved workspace %s: %w", v.Prefix, err)
	}
	v.known, v.etag, v.base = true, "", nil
	shared, err := hasForks(ctx, v.Blob, v.Prefix)
	if err != nil {
		return fmt.Errorf("delete saved workspace %s: %w", v.Prefix, err)
	}
	var keys []string
	for info, err := range v.Blob.List(ctx, v.Prefix) {
		if err != nil {
			return fmt.Errorf("delete saved workspace %s: %w", v.Prefix, err)
		}
		if shared && (isContentKey(v.Prefix, info.Key) || strings.HasPrefix(info.Key, v.Prefix+keptDir)) {
			continue // Forks reference it (see ForkTo).
		}
		keys = append(keys, info.Key)
	}
	for _, key := range keys {
		if err := v.Blob.Delete(ctx, key); err != nil {
			return fmt.Errorf("delete saved workspace %s: %w", v.Prefix, err)
		}
	}
	return nil
}
