package mount

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io/fs"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/atriumhq/atrium/storage/blob"
)

// Workspace is a sandbox's /workspace directory, on this host or in a
// remote VM. Dir implements it for a directory on the machine it runs on;
// a remote implementation forwards the JSON values to a Dir in the VM (and
// errors as Code plus message). A Volume calls one method at a time.
type Workspace interface {
	// Scan lists the workspace's entries, sorted by path, hashing the files
	// req.Prev does not vouch for. A missing workspace directory scans as
	// empty.
	Scan(ctx context.Context, req *ScanRequest) (*ScanResult, error)
	// Upload stores each object of plan: reads its parts from the
	// workspace, checks each part's hash (ErrChanged if a file no longer
	// matches) and PUTs the concatenation. A failed upload stores nothing
	// under its key.
	Upload(ctx context.Context, plan *UploadPlan) (*Transfer, error)
	// Restore replaces the workspace's contents with plan's tree: built in
	// a staging directory beside the workspace, every file's hash checked
	// while streaming (ErrCorrupt on a mismatch), then swapped in with one
	// atomic rename. On error the workspace is left as it was.
	Restore(ctx context.Context, plan *RestorePlan) (*Transfer, error)
}

// ScanRequest asks a workspace for its entries.
type ScanRequest struct {
	// Prev is the manifest the workspace was last saved to or restored
	// from. A file whose size and modification time equal its entry there
	// (and that is not racy, see RacyWindow) keeps the entry's hash
	// without being read.
	Prev *Manifest `json:"prev,omitempty"`
	// NoHash leaves the hash of files Prev does not vouch for empty instead
	// of reading them (Restore only needs to know which files it can keep).
	NoHash bool `json:"no_hash,omitempty"`
}

// ScanResult is a workspace's current tree.
type ScanResult struct {
	// Entries are sorted by Path. Blob and Offset are empty.
	Entries []Entry `json:"entries"`
	// Started is when the scan began, in Unix nanoseconds by the
	// workspace's clock.
	Started int64 `json:"started"`
	// Hashed files (HashedBytes) were read to compute their hash.
	Hashed      int   `json:"hashed"`
	HashedBytes int64 `json:"hashed_bytes"`
	// Skipped lists special and unreadable files left out.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Direct is true when the workspace reaches the object store itself
	// (Dir.Blob is set), so plans may leave URLs empty. A workspace in a VM
	// reports false and gets presigned URLs.
	Direct bool `json:"direct"`
}

// UploadPlan lists the objects a workspace must store.
type UploadPlan struct {
	Uploads []Upload `json:"uploads"`
}

// Upload is one object to store: the concatenation of Parts.
type Upload struct {
	// Key is the object's full key in the store.
	Key string `json:"key"`
	// URL is a presigned PUT URL for Key; empty means through the
	// workspace's own store (Dir.Blob).
	URL string `json:"url,omitempty"`
	// Size is the object's length, the sum of the parts' sizes.
	Size  int64  `json:"size"`
	Parts []Part `json:"parts"`
}

// Part is a file whose content goes into an object.
type Part struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Hash string `json:"hash"`
}

// RestorePlan is the tree a workspace must become and where the content of
// its files comes from: each file's content (by hash) is in a Download
// Extract or a Keep, or the file is empty.
type RestorePlan struct {
	// Entries is the whole tree, sorted by Path.
	Entries   []Entry    `json:"entries"`
	Downloads []Download `json:"downloads,omitempty"`
	Keep      []Keep     `json:"keep,omitempty"`
}

// Download is one object to fetch and the file contents it holds.
type Download struct {
	// Key is the object's full key in the store.
	Key string `json:"key"`
	// URL is a presigned GET URL for Key; empty means through the
	// workspace's own store (Dir.Blob).
	URL  string `json:"url,omitempty"`
	Size int64  `json:"size"`
	// Extracts are sorted by Offset and do not overlap.
	Extracts []Extract `json:"extracts"`
}

// Extract is the content of the files with Hash: Size bytes at Offset.
type Extract struct {
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
	Hash   string `json:"hash"`
}

// Keep says a file of the current workspace, at Path, already holds the
// content with Hash, so the restore takes it from there.
type Keep struct {
	Hash string `json:"hash"`
	Path string `json:"path"`
}

// Transfer is what a workspace moved for a plan.
type Transfer struct {
	Objects int   `json:"objects"`
	Bytes   int64 `json:"bytes"`
	// Reused files came from the current workspace (Keep).
	Reused int `json:"reused"`
}

// maxEntries bounds a workspace, so a hostile scan cannot exhaust the node.
const maxEntries = 4 << 20

// validEntries checks a sorted tree: valid unique paths, every entry's
// parent a directory of the tree, valid types, modes, hashes and targets.
// withHash requires a hash on every file; stored requires the location of
// every non-empty file's content.
func validEntries(entries []Entry, withHash, stored bool) error {
	if len(entries) > maxEntries {
		return invalidf("%d entries, more than the limit of %d", len(entries), maxEntries)
	}
	dirs := make(map[string]bool)
	for i, e := range entries {
		if err := validPath(e.Path); err != nil {
			return err
		}
		if i > 0 && entries[i-1].Path >= e.Path {
			return invalidf("entries not sorted by path at %q", e.Path)
		}
		if parent := path.Dir(e.Path); parent != "." && !dirs[parent] {
			return invalidf("%q is not inside a directory of the workspace", e.Path)
		}
		if e.Mode&^fs.ModePerm != 0 {
			return invalidf("%q has mode %o beyond the permission bits", e.Path, uint32(e.Mode))
		}
		switch e.Type {
		case TypeDir:
			dirs[e.Path] = true
		case TypeSymlink:
			if e.Target == "" || len(e.Target) > 4096 || strings.ContainsRune(e.Target, 0) || !utf8.ValidString(e.Target) {
				return invalidf("symlink %q has an invalid target", e.Path)
			}
		case TypeFile:
			if e.Size < 0 {
				return invalidf("file %q has a negative size", e.Path)
			}
			if (withHash || e.Hash != "") && !validHash(e.Hash) {
				return invalidf("file %q has an invalid hash %q", e.Path, e.Hash)
			}
			if stored {
				if err := validLocation(e); err != nil {
					return err
				}
			}
		default:
			return invalidf("%q has unknown type %q", e.Path, e.Type)
		}
	}
	return nil
}

// validLocation checks where a manifest says a file's content is.
func validLocation(e Entry) error {
	switch {
	case e.Size == 0:
		if e.Blob != "" {
			return invalidf("empty file %q names an object", e.Path)
		}
	case strings.HasPrefix(e.Blob, "sessions/"):
		if err := validSharedKey(e.Blob); err != nil || e.Offset < 0 {
			return invalidf("file %q is in an invalid shared location %q+%d", e.Path, e.Blob, e.Offset)
		}
	case strings.HasPrefix(e.Blob, "objects/"):
		if id := strings.TrimPrefix(e.Blob, "objects/"); !isHex(id) || e.Offset != 0 {
			return invalidf("file %q is in an invalid object location %q+%d", e.Path, e.Blob, e.Offset)
		}
	case strings.HasPrefix(e.Blob, "packs/"):
		if id := strings.TrimPrefix(e.Blob, "packs/"); !isHex(id) || e.Offset < 0 {
			return invalidf("file %q is in an invalid pack location %q+%d", e.Path, e.Blob, e.Offset)
		}
	default:
		return invalidf("file %q has an invalid object key %q", e.Path, e.Blob)
	}
	return nil
}

// validPath checks an entry path: relative, slash-separated, clean.
func validPath(p string) error {
	if p == "." || !fs.ValidPath(p) || len(p) > 4096 || strings.ContainsRune(p, 0) || !utf8.ValidString(p) {
		return invalidf("invalid path %q", p)
	}
	return nil
}

func validHash(h string) bool { return len(h) == 64 && isHex(h) }

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// validURL checks a presigned URL is plain http(s).
func validURL(u string) error {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return invalidf("invalid object URL")
	}
	return nil
}

// validUpload checks an upload plan before any file is read.
func validUpload(plan *UploadPlan) error {
	for _, u := range plan.Uploads {
		if err := blob.ValidKey(u.Key); err != nil {
			return invalidf("upload key: %v", err)
		}
		if u.URL != "" {
			if err := validURL(u.URL); err != nil {
				return err
			}
		}
		var sum int64
		for _, p := range u.Parts {
			if err := validPath(p.Path); err != nil {
				return err
			}
			if p.Size < 0 || !validHash(p.Hash) {
				return invalidf("upload %s: part %q has an invalid size or hash", u.Key, p.Path)
			}
			sum += p.Size
		}
		if sum != u.Size || len(u.Parts) == 0 {
			return invalidf("upload %s: size %d is not the sum of its %d parts", u.Key, u.Size, len(u.Parts))
		}
	}
	return nil
}

// validRestore checks a restore plan before anything is written.
func validRestore(plan *RestorePlan) error {
	if err := validEntries(plan.Entries, true, false); err != nil {
		return err
	}
	for _, d := range plan.Downloads {
		if err := blob.ValidKey(d.Key); err != nil {
			return invalidf("download key: %v", err)
		}
		if d.URL != "" {
			if err := validURL(d.URL); err != nil {
				return err
			}
		}
		end := int64(0)
		for _, x := range d.Extracts {
			if x.Offset < end || x.Size <= 0 || x.Offset+x.Size > d.Size || !validHash(x.Hash) {
				return invalidf("download %s: extract at %d+%d is out of order or out of bounds", d.Key, x.Offset, x.Size)
			}
			end = x.Offset + x.Size
		}
	}
	for _, k := range plan.Keep {
		if err := validPath(k.Path); err != nil {
			return err
		}
		if !validHash(k.Hash) {
			return invalidf("keep %q has an invalid hash", k.Path)
		}
	}
	return nil
}

// hexID returns n random bytes in hex.
func hexID(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
