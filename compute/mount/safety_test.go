package mount_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

func hashOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TestDir_RestoreRejectsEscapes feeds Restore plans a hostile node or a
// tampered manifest could hold: none may write outside the workspace.
func TestDir_RestoreRejectsEscapes(t *testing.T) {
	outside := t.TempDir()
	ws := filepath.Join(t.TempDir(), "ws")
	d := &mount.Dir{Path: ws}
	h := hashOf([]byte("x"))
	for name, entries := range map[string][]mount.Entry{
		"dot dot":        {{Path: "../escape", Type: mount.TypeFile, Size: 1, Hash: h}},
		"absolute":       {{Path: "/tmp/escape", Type: mount.TypeFile, Size: 1, Hash: h}},
		"through a link": {{Path: "l", Type: mount.TypeSymlink, Target: outside}, {Path: "l/escape", Type: mount.TypeFile, Size: 1, Hash: h}},
		"no parent":      {{Path: "a/escape", Type: mount.TypeFile, Size: 1, Hash: h}},
		"duplicate":      {{Path: "a", Type: mount.TypeDir}, {Path: "a", Type: mount.TypeDir}},
		"setuid":         {{Path: "s", Type: mount.TypeFile, Mode: 0o4755}},
	} {
		plan := &mount.RestorePlan{Entries: entries, Keep: []mount.Keep{{Hash: h, Path: "x"}}}
		if _, err := d.Restore(context.Background(), plan); !errors.Is(err, mount.ErrInvalid) {
			t.Errorf("%s: restore: %v, want ErrInvalid", name, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("a restore wrote outside the workspace: %v", entries)
	}
	if _, err := os.Stat(ws); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a rejected restore created the workspace: %v", err)
	}
}

// TestDir_UploadDoesNotFollowLinks swaps a directory for a link to a host
// directory between scan and upload, as a hostile sandbox could.
func TestDir_UploadDoesNotFollowLinks(t *testing.T) {
	store := &blob.Dir{Path: t.TempDir()}
	outside := t.TempDir()
	secret := []byte("host secret")
	writeFile(t, outside, "f", secret, 0o600, old)
	ws := t.TempDir()
	must(t, os.Symlink(outside, filepath.Join(ws, "d")))
	d := &mount.Dir{Path: ws, Blob: store}
	plan := &mount.UploadPlan{Uploads: []mount.Upload{{
		Key: "x/packs/00", Size: int64(len(secret)),
		Parts: []mount.Part{{Path: "d/f", Size: int64(len(secret)), Hash: hashOf(secret)}},
	}}}
	if _, err := d.Upload(context.Background(), plan); !errors.Is(err, mount.ErrChanged) {
		t.Errorf("upload through a link: %v, want ErrChanged", err)
	}
	if keys := blobtest.Keys(t, store, ""); len(keys) != 0 {
		t.Errorf("the upload stored %q", keys)
	}
}

// changeBefore runs change before each of the next left uploads.
type changeBefore struct {
	mount.Workspace
	change func()
	left   int
	calls  int
}

func (c *changeBefore) Upload(ctx context.Context, plan *mount.UploadPlan) (*mount.Transfer, error) {
	if c.calls++; c.left > 0 {
		c.left--
		c.change()
	}
	return c.Workspace.Upload(ctx, plan)
}

func TestVolume_ChangedDuringSave(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ws := t.TempDir()
			first := blobtest.Random(600 << 10)
			writeFile(t, ws, "big", first, 0o644, old)
			writeFile(t, ws, "small", []byte("small v1"), 0o644, old)
			v := b.volume("changed/")
			mustRestore(t, v, b.workspace(t, ws), 0)
			second := blobtest.Random(600 << 10)
			hook := &changeBefore{Workspace: b.workspace(t, ws), left: 1, change: func() {
				writeFile(t, ws, "big", second, 0o644, old.Add(time.Hour))
				writeFile(t, ws, "small", []byte("small v2"), 0o644, old.Add(time.Hour))
			}}
			st := mustSave(t, v, hook, 0)
			if hook.calls != 2 || st.Files != 2 {
				t.Errorf("save made %d upload attempts (%+v), want 2", hook.calls, st)
			}
			// The failed attempt wrote no object the manifest references.
			live := map[string]bool{"changed/" + mount.ManifestKey: true}
			for _, e := range readManifest(t, b.store, "changed/").Entries {
				live["changed/"+e.Blob] = true
			}
			var garbage []string
			for _, k := range blobtest.Keys(t, b.store, "changed/") {
				if !live[k] {
					garbage = append(garbage, k)
				}
			}
			// A server may commit the truncated body of an aborted presigned
			// PUT (versitygw does); the object is garbage under a fresh key.
			if len(garbage) > 0 && !b.presigned {
				t.Errorf("the failed upload committed %q", garbage)
			}
			t.Logf("garbage after the failed attempt: %q", garbage)
			dst := t.TempDir()
			mustRestore(t, b.volume("changed/"), b.workspace(t, dst), 0)
			if d := diff(snapshot(t, ws), snapshot(t, dst)); d != "" {
				t.Errorf("restored tree differs:\n%s", d)
			}

			// A file that changes before every attempt makes the save fail.
			n := 0
			always := &changeBefore{Workspace: b.workspace(t, ws), left: 100}
			always.change = func() {
				n++
				writeFile(t, ws, "big", blobtest.Random(600<<10), 0o644, old.Add(time.Duration(n+2)*time.Hour))
			}
			always.change() // Something to save.
			n = 0
			if _, err := v.Save(context.Background(), always, 0); !errors.Is(err, mount.ErrChanged) || n != 3 {
				t.Errorf("save of an ever-changing file: %v after %d attempts, want ErrChanged after 3", err, n)
			}
		})
	}
}

// TestDir_PresignedURLsStayOutOfErrors checks that a failed transfer does
// not put the URL's signature in the error.
func TestDir_PresignedURLsStayOutOfErrors(t *testing.T) {
	srv := blobtest.StartS3(t)
	s := srv.Open(t, "")
	url, err := s.PresignGet(context.Background(), "k", time.Minute)
	must(t, err)
	srv.Stop()
	h := hashOf([]byte("x"))
	plan := &mount.RestorePlan{
		Entries:   []mount.Entry{{Path: "f", Type: mount.TypeFile, Size: 1, Hash: h}},
		Downloads: []mount.Download{{Key: "k", URL: url, Size: 1, Extracts: []mount.Extract{{Offset: 0, Size: 1, Hash: h}}}},
	}
	d := backend{presigned: true}.dir(t, filepath.Join(t.TempDir(), "ws"))
	_, err = d.Restore(context.Background(), plan)
	if !errors.Is(err, blob.ErrUnavailable) {
		t.Errorf("restore with the store down: %v, want ErrUnavailable", err)
	}
	if err != nil && strings.Contains(err.Error(), "Signature") {
		t.Errorf("the error carries the presigned URL's signature: %v", err)
	}
}

// TestVolume_LargeFileMemory saves and restores a 64 MiB file and checks
// that the bytes allocated stay well below its size: the file is streamed,
// never held in memory. (Allocation, counted by runtime.MemStats.TotalAlloc,
// bounds the peak heap from above; minio-go's multipart upload accounts for
// one 16 MiB part buffer.)
func TestVolume_LargeFileMemory(t *testing.T) {
	const size = 64 << 20
	for _, b := range backends(t)[1:3] {
		t.Run(b.name, func(t *testing.T) {
			ws := t.TempDir()
			f, err := os.Create(filepath.Join(ws, "large.bin"))
			must(t, err)
			chunk := blobtest.Random(1 << 20)
			for range size >> 20 {
				_, err := f.Write(chunk)
				must(t, err)
			}
			must(t, f.Close())
			v := b.volume("large/")
			mustRestore(t, v, b.workspace(t, ws), 0)
			alloc := func(f func()) uint64 {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				f()
				runtime.ReadMemStats(&after)
				return after.TotalAlloc - before.TotalAlloc
			}
			saved := alloc(func() { mustSave(t, v, b.workspace(t, ws), 0) })
			dst := t.TempDir()
			restored := alloc(func() { mustRestore(t, b.volume("large/"), b.workspace(t, dst), 0) })
			t.Logf("allocated %d MiB to save and %d MiB to restore a %d MiB file", saved>>20, restored>>20, size>>20)
			if saved > 40<<20 || restored > 40<<20 {
				t.Errorf("allocated %d MiB to save and %d MiB to restore a %d MiB file; want under 40 MiB each", saved>>20, restored>>20, size>>20)
			}
			got, err := os.Open(filepath.Join(dst, "large.bin"))
			must(t, err)
			defer got.Close()
			hs := sha256.New()
			io.Copy(hs, got)
			want := mustRead(t, filepath.Join(ws, "large.bin"))
			if hex.EncodeToString(hs.Sum(nil)) != hashOf(want) {
				t.Error("the restored large file differs")
			}
		})
	}
}
