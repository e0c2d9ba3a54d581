package mount_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// backend is an object store and how workspaces reach it.
type backend struct {
	name  string
	store blob.Store
	srv   *blobtest.S3Server // nil for a Dir store
	// presigned workspaces have no store of their own and move bytes
	// through presigned URLs only, as in a VM.
	presigned bool
	// remote workspaces are reached through JSON, as a sandbox agent's
	// client reaches a Dir in a VM.
	remote bool
}

// backends returns a Dir store, an S3 store reached directly, and an S3
// store reached through presigned URLs.
func backends(t *testing.T) []backend {
	t.Helper()
	srv := blobtest.StartS3(t)
	return []backend{
		{name: "dir", store: &blob.Dir{Path: filepath.Join(t.TempDir(), "store")}},
		{name: "s3", store: srv.Open(t, "direct/"), srv: srv},
		{name: "s3-presigned", store: srv.Open(t, "presigned/"), srv: srv, presigned: true},
		{name: "s3-remote", store: srv.Open(t, "remote/"), srv: srv, presigned: true, remote: true},
	}
}

// workspace returns the workspace at dir for b.
func (b backend) workspace(t testing.TB, dir string) mount.Workspace {
	if b.remote {
		return jsonWorkspace{b.dir(t, dir)}
	}
	return b.dir(t, dir)
}

// dir returns a Dir workspace at dir for b, with an HTTP client whose
// connections are closed when the test ends.
func (b backend) dir(t testing.TB, dir string) *mount.Dir {
	tr := &http.Transport{MaxIdleConnsPerHost: DefaultParallel}
	t.Cleanup(tr.CloseIdleConnections)
	d := &mount.Dir{Path: dir, Client: &http.Client{Transport: tr}}
	if !b.presigned {
		d.Blob = b.store
	}
	return d
}

// DefaultParallel is mount.DefaultParallel, for the tests' HTTP clients.
const DefaultParallel = mount.DefaultParallel

// jsonWorkspace passes every request, result and error through JSON, as
// between a sandbox agent's client on the node and a Dir in a VM: errors
// keep their kind through Code and FromCode only.
type jsonWorkspace struct{ inner mount.Workspace }

func viaJSON[T any](v T) T {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out T
	if err := json.Unmarshal(data, &out); err != nil {
		panic(err)
	}
	return out
}

func viaWire(err error) error {
	if err == nil {
		return nil
	}
	return mount.FromCode(mount.Code(err), err.Error())
}

func (j jsonWorkspace) Scan(ctx context.Context, req *mount.ScanRequest) (*mount.ScanResult, error) {
	res, err := j.inner.Scan(ctx, viaJSON(req))
	if err != nil {
		return nil, viaWire(err)
	}
	return viaJSON(res), nil
}

func (j jsonWorkspace) Upload(ctx context.Context, plan *mount.UploadPlan) (*mount.Transfer, error) {
	tr, err := j.inner.Upload(ctx, viaJSON(plan))
	if err != nil {
		return nil, viaWire(err)
	}
	return viaJSON(tr), nil
}

func (j jsonWorkspace) Restore(ctx context.Context, plan *mount.RestorePlan) (*mount.Transfer, error) {
	tr, err := j.inner.Restore(ctx, viaJSON(plan))
	if err != nil {
		return nil, viaWire(err)
	}
	return viaJSON(tr), nil
}

func (b backend) volume(prefix string) *mount.Volume {
	return &mount.Volume{Blob: b.store, Prefix: prefix, Logger: quiet}
}

// old is a modification time long before any scan, so files written by a
// test are not racy unless the test wants them to be.
var old = time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)

// writeFile writes a file with mode and mtime, making its directory.
func writeFile(tb testing.TB, root, rel string, data []byte, mode fs.FileMode, mtime time.Time) {
	tb.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tb.Fatal(err)
	}
	os.Remove(p)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chtimes(p, mtime, mtime); err != nil {
		tb.Fatal(err)
	}
}

// node is what a tree snapshot records of one entry.
type node struct {
	Type   string
	Mode   fs.FileMode
	MTime  int64
	Size   int64
	Hash   string
	Target string
}

// snapshot records a tree without following links; the root is left out.
func snapshot(tb testing.TB, root string) map[string]node {
	tb.Helper()
	out := make(map[string]node)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		n := node{Mode: info.Mode().Perm(), MTime: info.ModTime().UnixNano()}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			n.Type, n.Mode = "symlink", 0
			n.Target, _ = os.Readlink(p)
		case info.IsDir():
			n.Type = "dir"
		case info.Mode().IsRegular():
			n.Type, n.Size = "file", info.Size()
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			n.Hash = hex.EncodeToString(sum[:])
		default:
			n.Type = "special"
		}
		out[filepath.ToSlash(rel)] = n
		return nil
	})
	if err != nil {
		tb.Fatalf("snapshot %s: %v", root, err)
	}
	return out
}

// diff describes how two snapshots differ, or returns "".
func diff(want, got map[string]node) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[p]; !ok {
			fmt.Fprintf(&b, "missing %s\n", p)
		} else if g != want[p] {
			fmt.Fprintf(&b, "%s: got %+v, want %+v\n", p, g, want[p])
		}
	}
	for _, p := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[p]; !ok {
			fmt.Fprintf(&b, "unexpected %s\n", p)
		}
	}
	return b.String()
}

// fillWorkspace makes a workspace with every kind of entry; outside is a
// directory outside the workspace holding a secret the links point at.
func fillWorkspace(t *testing.T, root, outside string) {
	t.Helper()
	for i := range 120 {
		writeFile(t, root, fmt.Sprintf("src/pkg%d/file%d.txt", i%7, i), fmt.Appendf(nil, "small file %d\n", i), 0o644, old.Add(time.Duration(i)*time.Second))
	}
	writeFile(t, root, "bin/run.sh", []byte("#!/bin/sh\necho hi\n"), 0o755, old)
	writeFile(t, root, "data/random.bin", blobtest.Random(700<<10), 0o640, old)
	writeFile(t, root, "data/random-copy.bin", mustRead(t, filepath.Join(root, "data/random.bin")), 0o600, old)
	writeFile(t, root, "data/medium.bin", blobtest.Random(100<<10), 0o644, old)
	writeFile(t, root, "data/dup-small.txt", []byte("small file 3\n"), 0o644, old)
	writeFile(t, root, "empty", nil, 0o644, old)
	writeFile(t, root, "readonly.txt", []byte("read only"), 0o444, old)
	writeFile(t, root, "locked/inner.txt", []byte("in a read-only dir"), 0o644, old)
	mkdir(t, root, "empty-dir", 0o755)
	mkdir(t, root, "deep/a/b/c/empty", 0o700)
	must(t, os.Chmod(filepath.Join(root, "locked"), 0o555))
	must(t, os.Symlink("src/pkg0/file0.txt", filepath.Join(root, "link-inside")))
	must(t, os.Symlink("../../../../etc/passwd", filepath.Join(root, "src/link-up")))
	must(t, os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(root, "link-outside")))
	must(t, os.Symlink(outside, filepath.Join(root, "dir-outside")))
	must(t, os.Symlink("missing-target", filepath.Join(root, "dangling")))
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	writeFile(t, root, "latin1-\xe9t\xe9", []byte("not UTF-8"), 0o644, old)
	for _, d := range []string{"src", "data", "deep/a", "deep/a/b/c/empty", "empty-dir", "bin"} {
		must(t, os.Chtimes(filepath.Join(root, d), old, old))
	}
	for _, l := range []string{"link-inside", "src/link-up", "link-outside", "dir-outside", "dangling"} {
		must(t, lchtimes(filepath.Join(root, l), old))
	}
	must(t, os.Chtimes(filepath.Join(root, "locked"), old, old))
	must(t, os.Chtimes(filepath.Join(root, "src"), old, old))
}

func mkdir(tb testing.TB, root, rel string, mode fs.FileMode) {
	tb.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	must(tb, os.MkdirAll(p, 0o755))
	must(tb, os.Chmod(p, mode))
	must(tb, os.Chtimes(p, old, old))
}

func lchtimes(p string, t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func mustRead(tb testing.TB, p string) []byte {
	tb.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func mustSave(tb testing.TB, v *mount.Volume, ws mount.Workspace, fence int64) mount.Stats {
	tb.Helper()
	st, err := v.Save(context.Background(), ws, fence)
	if err != nil {
		tb.Fatalf("save: %v", err)
	}
	return st
}

func mustRestore(tb testing.TB, v *mount.Volume, ws mount.Workspace, fence int64) mount.Stats {
	tb.Helper()
	st, err := v.Restore(context.Background(), ws, fence)
	if err != nil {
		tb.Fatalf("restore: %v", err)
	}
	return st
}

func TestVolume_RoundTrip(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			outside := t.TempDir()
			secret := "host secret " + hex.EncodeToString(blobtest.Random(8))
			writeFile(t, outside, "secret.txt", []byte(secret), 0o600, old)
			src := filepath.Join(t.TempDir(), "workspace")
			fillWorkspace(t, src, outside)
			want := snapshot(t, src)
			delete(want, "fifo")
			delete(want, "latin1-\xe9t\xe9")

			v := b.volume("sessions/s1/workspace/")
			mustRestore(t, v, b.workspace(t, src), 1) // Nothing saved yet.
			st := mustSave(t, v, b.workspace(t, src), 1)
			if st.Files != 128 || st.Symlinks != 5 || st.Hashed != 128 {
				t.Errorf("save stats: %d files, %d symlinks, %d hashed; want 128, 5, 128", st.Files, st.Symlinks, st.Hashed)
			}
			// 700 KiB content twice is one object; the small files fit one pack.
			if st.ObjectsWritten != 2 {
				t.Errorf("save wrote %d objects, want 2 (one pack, one large file)", st.ObjectsWritten)
			}
			if len(st.Skipped) != 2 || st.Skipped[0] != (mount.Skipped{Path: "fifo", Reason: "fifo"}) ||
				st.Skipped[1].Reason != "name is not valid UTF-8" {
				t.Errorf("skipped = %+v, want the fifo and the name that is not UTF-8", st.Skipped)
			}
			// Nothing outside the workspace was read through the links.
			for info, err := range b.store.List(ctx, "") {
				if err != nil {
					t.Fatal(err)
				}
				if got, _ := blobtest.MustGet(t, b.store, info.Key); strings.Contains(string(got), secret) {
					t.Errorf("object %s holds the secret behind a link", info.Key)
				}
			}

			// Another node, another directory.
			dst := filepath.Join(t.TempDir(), "restored", "workspace")
			v2 := b.volume("sessions/s1/workspace/")
			rst := mustRestore(t, v2, b.workspace(t, dst), 1)
			if d := diff(want, snapshot(t, dst)); d != "" {
				t.Errorf("restored tree differs:\n%s", d)
			}
			if rst.Files != 128 || rst.ObjectsRead != 2 || rst.Reused != 0 {
				t.Errorf("restore stats: %+v", rst)
			}
			if fi, err := os.Lstat(filepath.Join(dst, "dir-outside")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("a link to a host directory was not restored as a link: %v", err)
			}
			if got, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(got) != secret {
				t.Error("the restore wrote through a link to outside the workspace")
			}

			// The restored workspace saves without reading anything.
			if st := mustSave(t, v2, b.workspace(t, dst), 1); st.Hashed != 0 || st.ObjectsWritten != 0 || st.ManifestBytes != 0 {
				t.Errorf("save right after a restore: %+v, want nothing hashed or written", st)
			}
			// Restoring over a workspace that holds it takes everything from there.
			rst = mustRestore(t, v2, b.workspace(t, dst), 1)
			if rst.ObjectsRead != 0 || rst.Reused != 127 { // 128 files, one of them empty
				t.Errorf("restore over an identical workspace read %d objects, reused %d files; want 0 and 127", rst.ObjectsRead, rst.Reused)
			}
			if d := diff(want, snapshot(t, dst)); d != "" {
				t.Errorf("tree after a restore in place differs:\n%s", d)
			}
			assertNoStaging(t, dst)
		})
	}
}

// assertNoStaging checks that no restore left a directory beside ws.
func assertNoStaging(tb testing.TB, ws string) {
	tb.Helper()
	entries, _ := os.ReadDir(filepath.Dir(ws))
	for _, e := range entries {
		if strings.Contains(e.Name(), ".atrium-restore-") {
			tb.Errorf("staging directory %s left behind", e.Name())
		}
	}
}

func TestVolume_Incremental(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ws := filepath.Join(t.TempDir(), "ws")
			for i := range 200 {
				writeFile(t, ws, fmt.Sprintf("d%d/f%d", i%10, i), blobtest.Random(1000+i), 0o644, old)
			}
			writeFile(t, ws, "big.bin", blobtest.Random(1<<20), 0o644, old)
			v := b.volume("inc/")
			mustRestore(t, v, b.workspace(t, ws), 0)
			st := mustSave(t, v, b.workspace(t, ws), 0)
			if st.Files != 201 || st.ObjectsWritten != 2 {
				t.Fatalf("first save: %+v", st)
			}

			st = mustSave(t, v, b.workspace(t, ws), 0)
			if st.Hashed != 0 || st.ObjectsWritten != 0 || st.ManifestBytes != 0 {
				t.Errorf("save without changes: %+v, want nothing read or written", st)
			}

			writeFile(t, ws, "d3/f3", []byte("changed content"), 0o644, old.Add(time.Hour))
			st = mustSave(t, v, b.workspace(t, ws), 0)
			if st.Hashed != 1 || st.ObjectsWritten != 1 || st.BytesWritten != int64(len("changed content")) || st.ManifestBytes == 0 {
				t.Errorf("save after changing one small file: hashed %d, wrote %d objects of %d bytes; want 1, 1, %d",
					st.Hashed, st.ObjectsWritten, st.BytesWritten, len("changed content"))
			}

			writeFile(t, ws, "big.bin", blobtest.Random(1<<20), 0o644, old.Add(time.Hour))
			must(t, os.Remove(filepath.Join(ws, "d4/f4")))
			st = mustSave(t, v, b.workspace(t, ws), 0)
			if st.Files != 200 || st.ObjectsWritten != 1 || st.BytesWritten != 1<<20 {
				t.Errorf("save after changing the large file: %+v", st)
			}

			// A mode change alone writes only the manifest.
			must(t, os.Chmod(filepath.Join(ws, "d5/f5"), 0o700))
			st = mustSave(t, v, b.workspace(t, ws), 0)
			if st.Hashed != 0 || st.ObjectsWritten != 0 || st.ManifestBytes == 0 {
				t.Errorf("save after a chmod: %+v", st)
			}

			dst := filepath.Join(t.TempDir(), "ws")
			mustRestore(t, b.volume("inc/"), b.workspace(t, dst), 0)
			if d := diff(snapshot(t, ws), snapshot(t, dst)); d != "" {
				t.Errorf("restored tree differs:\n%s", d)
			}
		})
	}
}

// TestVolume_Racy checks that a change in the same clock tick as the last
// scan, keeping size and mtime, is still saved.
func TestVolume_Racy(t *testing.T) {
	b := backend{name: "dir", store: &blob.Dir{Path: t.TempDir()}}
	ws := t.TempDir()
	now := time.Now()
	writeFile(t, ws, "f", []byte("version 1"), 0o644, now)
	v := b.volume("racy/")
	mustRestore(t, v, b.workspace(t, ws), 0)
	mustSave(t, v, b.workspace(t, ws), 0)
	writeFile(t, ws, "f", []byte("version 2"), 0o644, now) // Same size, same mtime.
	if st := mustSave(t, v, b.workspace(t, ws), 0); st.Hashed != 1 {
		t.Errorf("a file modified just before the last scan was not read again (hashed %d)", st.Hashed)
	}
	dst := t.TempDir()
	mustRestore(t, b.volume("racy/"), b.workspace(t, dst), 0)
	if got := mustRead(t, filepath.Join(dst, "f")); string(got) != "version 2" {
		t.Errorf("restored %q, want version 2", got)
	}
}

func TestVolume_Repack(t *testing.T) {
	b := backend{name: "dir", store: &blob.Dir{Path: t.TempDir()}}
	ws := t.TempDir()
	for i := range 20 {
		writeFile(t, ws, fmt.Sprintf("f%02d", i), blobtest.Random(1000), 0o644, old)
	}
	v := &mount.Volume{Blob: b.store, Prefix: "repack/", PackSize: 64 << 10, Logger: quiet}
	mustRestore(t, v, b.workspace(t, ws), 0)
	mustSave(t, v, b.workspace(t, ws), 0)
	// Each save changes one file: one small pack each.
	for i := range mount.MaxSparsePacks + 3 {
		writeFile(t, ws, fmt.Sprintf("f%02d", i), blobtest.Random(1000), 0o644, old.Add(time.Duration(i+1)*time.Hour))
		mustSave(t, v, b.workspace(t, ws), 0)
	}
	packs := make(map[string]bool)
	for _, e := range readManifest(t, b.store, "repack/").Entries {
		if strings.HasPrefix(e.Blob, "packs/") {
			packs[e.Blob] = true
		}
	}
	if len(packs) > mount.MaxSparsePacks+1 {
		t.Errorf("the manifest references %d packs after many small saves; want at most %d", len(packs), mount.MaxSparsePacks+1)
	}
	dst := t.TempDir()
	mustRestore(t, b.volume("repack/"), b.workspace(t, dst), 0)
	if d := diff(snapshot(t, ws), snapshot(t, dst)); d != "" {
		t.Errorf("restored tree differs:\n%s", d)
	}
}

func readManifest(tb testing.TB, s blob.Store, prefix string) *mount.Manifest {
	tb.Helper()
	data, _ := blobtest.MustGet(tb, s, prefix+mount.ManifestKey)
	var m mount.Manifest
	must(tb, json.Unmarshal(data, &m))
	return &m
}

func TestVolume_Conflict(t *testing.T) {
	for _, b := range backends(t)[:2] {
		t.Run(b.name, func(t *testing.T) {
			for _, first := range []bool{true, false} {
				prefix := fmt.Sprintf("conflict-%v/", first)
				if !first {
					seed := t.TempDir()
					writeFile(t, seed, "seed", []byte("seed"), 0o644, old)
					v := b.volume(prefix)
					mustRestore(t, v, b.workspace(t, seed), 0)
					mustSave(t, v, b.workspace(t, seed), 0)
				}
				// Two writers restore the same copy, change it, and save at once.
				wsA, wsB := t.TempDir(), t.TempDir()
				a, bv := b.volume(prefix), b.volume(prefix)
				mustRestore(t, a, b.workspace(t, wsA), 0)
				mustRestore(t, bv, b.workspace(t, wsB), 0)
				writeFile(t, wsA, "who", []byte("A"), 0o644, old)
				writeFile(t, wsB, "who", []byte("B"), 0o644, old)
				var errA, errB error
				var wg sync.WaitGroup
				wg.Go(func() { _, errA = a.Save(context.Background(), b.workspace(t, wsA), 0) })
				wg.Go(func() { _, errB = bv.Save(context.Background(), b.workspace(t, wsB), 0) })
				wg.Wait()
				if (errA == nil) == (errB == nil) {
					t.Fatalf("first=%v: both or neither of two racing saves won: %v, %v", first, errA, errB)
				}
				winner, winnerWS, loser, loserWS, lost, want := a, wsA, bv, wsB, errB, "A"
				if errA != nil {
					winner, winnerWS, loser, loserWS, lost, want = bv, wsB, a, wsA, errA, "B"
				}
				if !errors.Is(lost, mount.ErrConflict) || !strings.Contains(lost.Error(), "another writer") {
					t.Errorf("first=%v: the losing save: %v, want ErrConflict", first, lost)
				}
				// A third node restores the winner's workspace.
				dst := t.TempDir()
				mustRestore(t, b.volume(prefix), b.workspace(t, dst), 0)
				if got := string(mustRead(t, filepath.Join(dst, "who"))); got != want {
					t.Errorf("first=%v: restored %q, want the winner's %q", first, got, want)
				}
				// The loser keeps failing until it restores; the winner goes on.
				if _, err := loser.Save(context.Background(), b.workspace(t, loserWS), 0); !errors.Is(err, mount.ErrConflict) {
					t.Errorf("first=%v: the loser's next save: %v, want ErrConflict", first, err)
				}
				writeFile(t, winnerWS, "more", []byte("more"), 0o644, old)
				mustSave(t, winner, b.workspace(t, winnerWS), 0)
			}
		})
	}
}

func TestVolume_Fence(t *testing.T) {
	b := backend{name: "dir", store: &blob.Dir{Path: t.TempDir()}}
	wsOld, wsNew := t.TempDir(), t.TempDir()
	writeFile(t, wsOld, "f", []byte("old owner"), 0o644, old)
	oldOwner := b.volume("fence/")
	mustRestore(t, oldOwner, b.workspace(t, wsOld), 5)
	mustSave(t, oldOwner, b.workspace(t, wsOld), 5)

	// A new owner (greater token) restores: from now on the old one is fenced.
	newOwner := b.volume("fence/")
	mustRestore(t, newOwner, b.workspace(t, wsNew), 6)
	writeFile(t, wsOld, "f", []byte("zombie write"), 0o644, old.Add(time.Hour))
	_, err := oldOwner.Save(context.Background(), b.workspace(t, wsOld), 5)
	if !errors.Is(err, mount.ErrFenced) || !strings.Contains(err.Error(), "fence 6 > 5") {
		t.Errorf("save by the old owner: %v, want ErrFenced naming fence 6 > 5", err)
	}
	if _, err := b.volume("fence/").Restore(context.Background(), b.workspace(t, t.TempDir()), 5); !errors.Is(err, mount.ErrFenced) {
		t.Errorf("restore with a stale token: %v, want ErrFenced", err)
	}
	mustSave(t, newOwner, b.workspace(t, wsNew), 6)
	// A stale token on the new owner's own Volume is refused too.
	if _, err := newOwner.Save(context.Background(), b.workspace(t, wsNew), 4); !errors.Is(err, mount.ErrFenced) {
		t.Errorf("save with a token older than the manifest's: %v, want ErrFenced", err)
	}
	if m := readManifest(t, b.store, "fence/"); m.Fence != 6 || len(m.Entries) != 1 {
		t.Errorf("manifest: fence %d, %d entries", m.Fence, len(m.Entries))
	}
	dst := t.TempDir()
	mustRestore(t, b.volume("fence/"), b.workspace(t, dst), 6)
	if got := mustRead(t, filepath.Join(dst, "f")); string(got) != "old owner" {
		t.Errorf("restored %q: the fenced write got through", got)
	}
}

func TestVolume_NotRestored(t *testing.T) {
	b := backend{name: "dir", store: &blob.Dir{Path: t.TempDir()}}
	good := t.TempDir()
	writeFile(t, good, "precious", []byte("work"), 0o644, old)
	v := b.volume("nr/")
	mustRestore(t, v, b.workspace(t, good), 0)
	mustSave(t, v, b.workspace(t, good), 0)

	// A fresh sandbox whose Volume never restored must not save its
	// (empty) workspace over the good copy.
	fresh := b.volume("nr/")
	_, err := fresh.Save(context.Background(), b.workspace(t, t.TempDir()), 0)
	if !errors.Is(err, mount.ErrNotRestored) {
		t.Errorf("save without a restore: %v, want ErrNotRestored", err)
	}
	// Nor may one whose restore failed.
	for info, err := range b.store.List(context.Background(), "nr/packs/") {
		must(t, err)
		must(t, b.store.Delete(context.Background(), info.Key))
	}
	empty := t.TempDir()
	if _, err := fresh.Restore(context.Background(), b.workspace(t, empty), 0); !errors.Is(err, mount.ErrCorrupt) {
		t.Fatalf("restore with a missing pack: %v, want ErrCorrupt", err)
	}
	if _, err := fresh.Save(context.Background(), b.workspace(t, empty), 0); !errors.Is(err, mount.ErrNotRestored) {
		t.Errorf("save after a failed restore: %v, want ErrNotRestored", err)
	}
	if m := readManifest(t, b.store, "nr/"); len(m.Entries) != 1 {
		t.Errorf("the good manifest was replaced: %d entries", len(m.Entries))
	}
}

// hookWorkspace runs a function after the uploads of a save.
type hookWorkspace struct {
	mount.Workspace
	afterUpload func()
}

func (h hookWorkspace) Upload(ctx context.Context, plan *mount.UploadPlan) (*mount.Transfer, error) {
	tr, err := h.Workspace.Upload(ctx, plan)
	h.afterUpload()
	return tr, err
}

func TestVolume_S3Unavailable(t *testing.T) {
	srv := blobtest.StartS3(t)
	cfg := srv.Config("down/")
	cfg.MaxRetries = -1
	s, err := blob.OpenS3(context.Background(), cfg)
	must(t, err)
	t.Cleanup(func() { s.Close() })
	b := backend{name: "s3", store: s, srv: srv}

	ws := t.TempDir()
	writeFile(t, ws, "f", []byte("saved"), 0o644, old)
	v := b.volume("sessions/x/workspace/")
	mustRestore(t, v, b.workspace(t, ws), 0)
	mustSave(t, v, b.workspace(t, ws), 0)
	writeFile(t, ws, "f", []byte("newer, never saved"), 0o644, old.Add(time.Hour))
	writeFile(t, ws, "g", blobtest.Random(10<<10), 0o644, old)

	// The store dies between the uploads and the manifest write.
	_, err = v.Save(context.Background(), hookWorkspace{b.workspace(t, ws), srv.Stop}, 0)
	if !errors.Is(err, blob.ErrUnavailable) || mount.Code(err) != mount.CodeUnavailable {
		t.Fatalf("save with the store stopped: %v, want ErrUnavailable", err)
	}
	t.Logf("save error: %v", err)
	// The store is down from the start.
	if _, err := v.Save(context.Background(), b.workspace(t, ws), 0); !errors.Is(err, blob.ErrUnavailable) {
		t.Errorf("save with the store down: %v, want ErrUnavailable", err)
	}
	srv.Start()
	dst := t.TempDir()
	mustRestore(t, b.volume("sessions/x/workspace/"), b.workspace(t, dst), 0)
	if got := mustRead(t, filepath.Join(dst, "f")); string(got) != "saved" {
		t.Errorf("restored %q, want the last saved copy", got)
	}
	if _, err := os.Stat(filepath.Join(dst, "g")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file of the failed save was restored: %v", err)
	}
	// The first Volume still holds the saved copy and saves normally now.
	mustSave(t, v, b.workspace(t, ws), 0)
}

func TestVolume_Corrupt(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			src := t.TempDir()
			for i := range 30 {
				writeFile(t, src, fmt.Sprintf("f%d", i), blobtest.Random(2000), 0o644, old)
			}
			writeFile(t, src, "big", blobtest.Random(300<<10), 0o644, old)
			v := b.volume("corrupt/")
			mustRestore(t, v, b.workspace(t, src), 0)
			mustSave(t, v, b.workspace(t, src), 0)

			// The target workspace holds other work: it must survive a failed restore.
			dst := filepath.Join(t.TempDir(), "ws")
			writeFile(t, dst, "current", []byte("current work"), 0o644, old)
			before := snapshot(t, dst)
			m := readManifest(t, b.store, "corrupt/")
			var pack string
			for _, e := range m.Entries {
				if strings.HasPrefix(e.Blob, "packs/") {
					pack = "corrupt/" + e.Blob
				}
			}
			data, _ := blobtest.MustGet(t, b.store, pack)
			data[len(data)/2] ^= 0xff // One flipped bit, same size.
			blobtest.MustPut(t, b.store, pack, data, blob.PutOptions{})
			_, err := b.volume("corrupt/").Restore(ctx, b.workspace(t, dst), 0)
			if !errors.Is(err, mount.ErrCorrupt) || !strings.Contains(err.Error(), "does not match its hash") {
				t.Errorf("restore of a corrupted pack: %v, want ErrCorrupt", err)
			}
			if d := diff(before, snapshot(t, dst)); d != "" {
				t.Errorf("a failed restore changed the workspace:\n%s", d)
			}
			assertNoStaging(t, dst)

			// A missing large object too (with the pack mended first, so
			// the missing object is the only damage).
			data[len(data)/2] ^= 0xff
			blobtest.MustPut(t, b.store, pack, data, blob.PutOptions{})
			must(t, b.store.Delete(ctx, "corrupt/"+entry(t, m, "big").Blob))
			_, err = b.volume("corrupt/").Restore(ctx, b.workspace(t, dst), 0)
			if !errors.Is(err, mount.ErrCorrupt) || !strings.Contains(err.Error(), "missing") {
				t.Errorf("restore with a missing object: %v, want ErrCorrupt", err)
			}
			if d := diff(before, snapshot(t, dst)); d != "" {
				t.Errorf("a failed restore changed the workspace:\n%s", d)
			}
			assertNoStaging(t, dst)
		})
	}
}

func entry(tb testing.TB, m *mount.Manifest, path string) mount.Entry {
	tb.Helper()
	for _, e := range m.Entries {
		if e.Path == path {
			return e
		}
	}
	tb.Fatalf("no entry %s in the manifest", path)
	return mount.Entry{}
}

func TestVolume_Collect(t *testing.T) {
	b := backend{name: "dir", store: &blob.Dir{Path: t.TempDir()}}
	ctx := context.Background()
	ws := t.TempDir()
	writeFile(t, ws, "small", []byte("v1"), 0o644, old)
	writeFile(t, ws, "big", blobtest.Random(300<<10), 0o644, old)
	v := b.volume("gc/")
	mustRestore(t, v, b.workspace(t, ws), 0)
	mustSave(t, v, b.workspace(t, ws), 0)
	writeFile(t, ws, "small", []byte("v2"), 0o644, old.Add(time.Hour))
	writeFile(t, ws, "big", blobtest.Random(300<<10), 0o644, old.Add(time.Hour))
	mustSave(t, v, b.workspace(t, ws), 0)

	if n, err := v.Collect(ctx, time.Hour); err != nil || n != 0 {
		t.Errorf("collect with a long grace period deleted %d objects: %v", n, err)
	}
	n, err := v.Collect(ctx, time.Nanosecond)
	if err != nil || n != 2 {
		t.Errorf("collect deleted %d objects (%v), want 2: the old pack and the old large file", n, err)
	}
	dst := t.TempDir()
	mustRestore(t, b.volume("gc/"), b.workspace(t, dst), 0)
	if d := diff(snapshot(t, ws), snapshot(t, dst)); d != "" {
		t.Errorf("restore after collect differs:\n%s", d)
	}
	must(t, v.Delete(ctx))
	if keys := blobtest.Keys(t, b.store, "gc/"); len(keys) != 0 {
		t.Errorf("after Delete the store holds %q", keys)
	}
	mustSave(t, v, b.workspace(t, ws), 0) // A deleted copy may be saved afresh.
}

func TestCode(t *testing.T) {
	for _, sentinel := range []error{mount.ErrConflict, mount.ErrFenced, mount.ErrNotRestored, mount.ErrCorrupt, mount.ErrChanged, mount.ErrInvalid, blob.ErrUnavailable, blob.ErrNotFound} {
		err := fmt.Errorf("upload x: %w", sentinel)
		back := mount.FromCode(mount.Code(err), err.Error())
		if !errors.Is(back, sentinel) || back.Error() != err.Error() {
			t.Errorf("%v did not survive Code and FromCode: %v", sentinel, back)
		}
	}
	if mount.Code(errors.New("plain")) != "" || mount.FromCode("", "plain").Error() != "plain" {
		t.Error("a plain error gained a code")
	}
}
