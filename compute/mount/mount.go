// Package mount persists a sandbox's /workspace in an object store, so it
// survives sleep, node loss and VM replacement. It owns the saved form of a
// workspace — a manifest plus content objects under one key prefix,
// sessions/<id>/workspace/ — and the two halves that move it:
//
//   - Volume, on the node, holds the object store (blob.Store). It reads and
//     writes the manifest, decides what must move, and hands the workspace a
//     plan.
//   - Workspace is the directory itself, wherever it lives. Dir implements it
//     for a directory on the machine it runs on: on the node for local
//     sandboxes, and inside a VM (behind the sandbox agent) for remote ones.
//     Dir scans the tree, hashing files where they are, and executes plans.
//
// Plans, scans and manifests are plain JSON values, so a remote Workspace is
// a thin client of the sandbox agent that forwards them; Code and FromCode
// carry error kinds across that boundary. A plan names each object by key
// and, when the workspace cannot reach the store itself (ScanResult.Direct
// is false), by a presigned URL: a VM moves bytes only through URLs for
// exactly the objects of its session and never holds store credentials.
//
// # Layout
//
// Under the volume's prefix:
//
//	manifest.json      the workspace: every entry with its metadata, SHA-256 and where its bytes are
//	objects/<id>       the content of one file of at least SmallFile bytes
//	packs/<id>         the contents of many smaller files, concatenated (about PackSize each)
//
// Content is addressed by SHA-256: a save uploads only content whose hash
// the previous manifest does not already hold, so an incremental save after
// changing one small file writes one small pack and the manifest. Packing
// small files (like restic and borg) makes a 10,000-file workspace a handful
// of GETs. Each save packs its new small files together; once more than
// MaxSparsePacks packs hold less than a quarter of PackSize of live content,
// the next save repacks their files into full packs, so restore stays a
// handful of GETs however many small saves came before.
//
// Objects are written once, under fresh random ids, and never overwritten:
// a failed or losing upload can only leave garbage, never damage content a
// manifest references. (Keys derived from the hash would be rewritten by
// any save that uploads the same content again, and some S3 servers,
// versitygw among them, commit the truncated body of an unsigned-payload PUT
// that the client aborted.)
//
// # Consistency
//
// Save uploads the objects first and the manifest last, with a conditional
// write: IfMatch the manifest's ETag when the workspace was last restored or
// saved, IfNoneMatch when there was none. Two writers can never interleave:
// the loser fails with ErrConflict and its manifest is not written. Each
// manifest records the fencing token (DESIGN §5) of its writer; a caller
// with an older token gets ErrFenced, and Restore with a newer token first
// rewrites the manifest with it, so the previous owner can no longer save.
// The manifest is always written in one request (blob's conditional writes
// are single-part).
//
// Restore builds the tree in a staging directory next to the workspace,
// checking every file's SHA-256 while it streams, and swaps it in with one
// atomic rename only when it is complete, so a failed or partial restore
// leaves the workspace as it was. A Volume tracks what its workspace holds:
// Save refuses (ErrNotRestored) to write over a saved copy unless the
// workspace was restored from it or saved to it by this Volume, so a
// workspace whose restore failed is never saved over the good copy. Callers
// therefore: Restore when a sandbox is provisioned or resumed (this also
// works for a workspace that never had a saved copy), Save after turns, before
// sleep and periodically, and never Save after a failed Restore (it fails).
//
// # What is kept
//
// Regular files (content, permission bits, modification time), directories
// (permission bits, modification time, also when empty) and symbolic links
// (the target string, never followed: a link pointing outside the workspace
// is saved and restored as a link and never read through). Special files
// (FIFOs, sockets, devices), entries the scan cannot read, and names or link
// targets that are not valid UTF-8 (manifests are JSON) are skipped and
// listed in Stats.Skipped. Not kept: owners (restored files belong to the
// restoring process), setuid/setgid/sticky bits, extended attributes, and
// hard links (each link is a separate file after a restore; content is
// stored once).
//
// # Incremental scans
//
// A scan reuses the hash of a file whose size and modification time equal
// its entry in the previous manifest, unless the file was modified within
// RacyWindow before that manifest's scan began (so a change in the same
// clock tick is not missed, as in git's racy-clean check). Restore sets
// every file's modification time from the manifest, so the scan after a
// restore reads nothing.
//
// # Costs
//
// Transfers run DefaultParallel objects at a time. Files are streamed in
// 256 KiB buffers and never held whole in memory: through blob.S3 an object
// larger than the part size is uploaded in parts, which buffers one part
// (16 MiB by default), and at most two such uploads run at once; through a
// presigned URL every object is one streamed PUT, which limits a file in a
// remote workspace to the store's single-PUT size (5 GiB on AWS). A restore
// flushes the new tree to disk with one syncfs before swapping it in.
//
// Restoring a 100 MB, 10,000-file workspace from versitygw on loopback reads
// 12 objects (BenchmarkRestore); an incremental save after changing one file
// of it hashes that file, writes one pack and a 2.3 MB manifest
// (BenchmarkSaveIncremental). On the shared two-vCPU test machine the restore
// took 0.8 s when the machine was idle and 2.3–3.5 s while other test runs
// loaded it; fetching the 12 objects takes about 60 ms of that, the rest is
// the kernel creating 10,000 files (a bare loop creating them took 1.4–4 s
// under the same load). The incremental save took 65–115 ms.
//
// # Garbage
//
// Objects no manifest references (those of replaced or removed content,
// and those of a save whose manifest write failed) stay until a Collector
// pass deletes them. A pass keeps what any volume's current manifest, any
// kept manifest younger than Collector.KeepHistory, or any fork's base
// still names, and spares objects younger than a grace period and every
// object of a volume with a save in progress: Save writes a marker under
// pending/ before it uploads and removes it after its manifest is written,
// so an object whose manifest is not written yet is never collected however
// long its upload takes. A pass also measures what each session stores,
// which Quota uses to limit what each tenant stores (Limited).
package mount

import (
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// Sentinel errors. Errors of the object store match the blob package's
// sentinels (blob.ErrUnavailable when it cannot be reached).
var (
	// ErrConflict means another writer saved the workspace since this
	// Volume restored or saved it; nothing was written. Restore, then
	// redo the work, or give up the sandbox.
	ErrConflict = errors.New("mount: workspace was saved by another writer")
	// ErrFenced means the saved workspace belongs to a newer owner (its
	// fencing token is greater than the caller's).
	ErrFenced = errors.New("mount: workspace was saved by a newer owner")
	// ErrNotRestored means Save was asked to write over a saved copy the
	// workspace was not restored from (or whose restore failed).
	ErrNotRestored = errors.New("mount: workspace was not restored from its saved copy")
	// ErrCorrupt means the saved workspace is damaged: an object is missing
	// or its content does not match the manifest's hash.
	ErrCorrupt = errors.New("mount: saved workspace is corrupt")
	// ErrChanged means a file changed while it was being saved; Save
	// retries a few times before returning it.
	ErrChanged = errors.New("mount: workspace changed during the save")
	// ErrInvalid means a manifest, scan or plan breaks the format's rules
	// (for instance a path with ".." or an entry below a symlink).
	ErrInvalid = errors.New("mount: invalid workspace data")
)

// Version is the manifest format written by this package.
const Version = 1

// RacyWindow is how long before a scan began a file must have been modified
// for a later scan to trust its size and modification time.
const RacyWindow = 2 * time.Second

// Prefix returns the key prefix of session id's saved workspace.
func Prefix(id session.ID) string { return "sessions/" + string(id) + "/workspace/" }

// ManifestKey is the manifest's key below a Volume's prefix.
const ManifestKey = "manifest.json"

// Type is the kind of a workspace entry.
type Type string

// Entry types.
const (
	TypeFile    Type = "file"
	TypeDir     Type = "dir"
	TypeSymlink Type = "symlink"
)

// Entry is one file, directory or symbolic link of a workspace.
type Entry struct {
	// Path is slash-separated and relative to the workspace root, e.g.
	// "src/main.go"; never ".", never with "." or ".." segments.
	Path string `json:"path"`
	Type Type   `json:"type"`
	// Mode holds the permission bits (0o777) only.
	Mode fs.FileMode `json:"mode"`
	// Size is a file's length in bytes.
	Size int64 `json:"size,omitempty"`
	// MTime is the modification time in Unix nanoseconds.
	MTime int64 `json:"mtime"`
	// Hash is the hex SHA-256 of a file's content.
	Hash string `json:"hash,omitempty"`
	// Target is a symbolic link's target, as stored in the link.
	Target string `json:"target,omitempty"`
	// Blob is the key, relative to the volume's prefix, of the object
	// holding a file's content: "objects/<id>" (the whole object) or
	// "packs/<id>" (Size bytes at Offset). Empty for empty files and in
	// scans.
	Blob   string `json:"blob,omitempty"`
	Offset int64  `json:"offset,omitempty"`
}

// Manifest is a saved workspace: manifest.json under the volume's prefix.
type Manifest struct {
	Version int `json:"version"`
	// ID is a random identifier of the write that stored this manifest.
	ID string `json:"id"`
	// Fence is the fencing token of the owner that wrote it.
	Fence int64 `json:"fence"`
	// Saved is when it was written, by the node's clock.
	Saved time.Time `json:"saved"`
	// Scanned is when the scan it comes from began, in Unix nanoseconds by
	// the workspace's clock; see RacyWindow.
	Scanned int64 `json:"scanned"`
	// Entries are sorted by Path; a directory comes before its contents.
	Entries []Entry `json:"entries"`
	// Base, when set, is the full key of a kept manifest of another
	// volume whose entries are this one's (Entries is then empty), their
	// content where that volume keeps it: how a fork names its parent's
	// workspace without copying it (see ForkTo). Reading resolves it.
	Base string `json:"base,omitempty"`
}

// Skipped is an entry a scan left out, and why.
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"` // "fifo", "socket", "device", "unreadable: ..."
}

// Stats describes one Save or Restore.
type Stats struct {
	// Files, Dirs, Symlinks and Bytes describe the workspace saved or
	// restored (Bytes: total file content).
	Files    int   `json:"files"`
	Dirs     int   `json:"dirs"`
	Symlinks int   `json:"symlinks"`
	Bytes    int64 `json:"bytes"`
	// Hashed files (HashedBytes) were read by the scan; the others kept
	// the previous manifest's hash.
	Hashed      int   `json:"hashed"`
	HashedBytes int64 `json:"hashed_bytes"`
	// ObjectsWritten and BytesWritten count content objects uploaded (packs
	// and large files), not the manifest.
	ObjectsWritten int   `json:"objects_written"`
	BytesWritten   int64 `json:"bytes_written"`
	// ObjectsRead and BytesRead count content objects downloaded.
	ObjectsRead int   `json:"objects_read"`
	BytesRead   int64 `json:"bytes_read"`
	// Reused files were restored from the workspace's current content
	// instead of the store.
	Reused int `json:"reused"`
	// ManifestBytes is the size of the manifest written (Save; 0 when
	// nothing changed) or read (Restore).
	ManifestBytes int64 `json:"manifest_bytes"`
	// Skipped lists special and unreadable files left out.
	Skipped  []Skipped     `json:"skipped,omitempty"`
	Duration time.Duration `json:"duration"`
}

// Codes of error kinds, for carrying errors across a process boundary.
const (
	CodeConflict    = "conflict"
	CodeFenced      = "fenced"
	CodeNotRestored = "not_restored"
	CodeCorrupt     = "corrupt"
	CodeChanged     = "changed"
	CodeInvalid     = "invalid"
	CodeUnavailable = "unavailable"
	CodeNotFound    = "not_found"
)

var codes = []struct {
	code string
	err  error
}{
	{CodeConflict, ErrConflict},
	{CodeFenced, ErrFenced},
	{CodeNotRestored, ErrNotRestored},
	{CodeCorrupt, ErrCorrupt},
	{CodeChanged, ErrChanged},
	{CodeInvalid, ErrInvalid},
	{CodeUnavailable, blob.ErrUnavailable},
	{CodeNotFound, blob.ErrNotFound},
}

// Code returns the code of err's kind (CodeCorrupt for an error matching
// ErrCorrupt...), or "" for other errors. A remote workspace sends it with
// the error's message, and its client rebuilds the error with FromCode.
func Code(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return ""
}

// FromCode returns an error with message msg that matches the sentinel code
// names (see Code); an unknown or empty code gives a plain error.
func FromCode(code, msg string) error {
	for _, c := range codes {
		if c.code == code {
			return &codedError{msg: msg, kind: c.err}
		}
	}
	return errors.New(msg)
}

type codedError struct {
	msg  string
	kind error
}

func (e *codedError) Error() string        { return e.msg }
func (e *codedError) Is(target error) bool { return target == e.kind }

// invalidf returns an error matching ErrInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
