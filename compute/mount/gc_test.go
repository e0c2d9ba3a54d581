package mount_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// gcStores returns a Dir store and a versitygw S3 store.
func gcStores(t *testing.T) []backend {
	t.Helper()
	srv := blobtest.StartS3(t)
	return []backend{
		{name: "dir", store: &blob.Dir{Path: filepath.Join(t.TempDir(), "store")}},
		{name: "s3", store: srv.Open(t, "gc/"), srv: srv},
	}
}

// bigFile stands in for the 2 GiB file of issue 20: any file of at least
// SmallFile bytes gets an object of its own, collected the same way.
const bigFile = 2 << 20

// later returns a clock hours ahead, so every object is past any grace
// period without the test waiting.
func later(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

func contentKeys(tb testing.TB, s blob.Store, id session.ID) []string {
	tb.Helper()
	var out []string
	for _, k := range blobtest.Keys(tb, s, mount.Prefix(id)) {
		if strings.Contains(k, "/objects/") || strings.Contains(k, "/packs/") {
			out = append(out, k)
		}
	}
	return out
}

func TestCollector(t *testing.T) {
	for _, b := range gcStores(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			store := b.store

			// Session rm: a turn writes a big file (kept as the turn's
			// manifest), the next removes it.
			ws := t.TempDir()
			writeFile(t, ws, "notes.txt", []byte("keep me"), 0o644, old)
			writeFile(t, ws, "big.bin", blobtest.Random(bigFile), 0o644, old)
			v := &mount.Volume{Blob: store, Prefix: mount.Prefix("rm"), Logger: quiet}
			mustRestore(t, v, b.workspace(t, ws), 1)
			mustSave(t, v, b.workspace(t, ws), 1)
			_, turn1 := v.Mark()
			must(t, mount.KeepManifest(ctx, store, v.Prefix, turn1))
			bigKey := mount.BlobKey(v.Prefix, entry(t, turn1, "big.bin").Blob)
			must(t, removeFile(ws, "big.bin"))
			mustSave(t, v, b.workspace(t, ws), 1)
			_, turn2 := v.Mark()
			must(t, mount.KeepManifest(ctx, store, v.Prefix, turn2))

			// Session parent: a fork is made from its turn-1 manifest, then
			// the parent removes the big file and is deleted.
			pws := t.TempDir()
			writeFile(t, pws, "big.bin", blobtest.Random(bigFile), 0o644, old)
			pv := &mount.Volume{Blob: store, Prefix: mount.Prefix("parent"), Logger: quiet}
			mustRestore(t, pv, b.workspace(t, pws), 1)
			mustSave(t, pv, b.workspace(t, pws), 1)
			_, pm := pv.Mark()
			must(t, mount.ForkTo(ctx, store, pv.Prefix, pm, mount.Prefix("child"), "child"))
			must(t, removeFile(pws, "big.bin"))
			mustSave(t, pv, b.workspace(t, pws), 1)
			must(t, pv.Delete(ctx))

			// Within the grace period nothing goes.
			c := &mount.Collector{Blob: store, Grace: time.Hour, KeepHistory: 2 * time.Hour, Logger: quiet}
			st, err := c.Collect(ctx)
			must(t, err)
			if st.Deleted != 0 || st.Expired != 0 {
				t.Errorf("a pass within the grace period deleted %d objects and %d manifests", st.Deleted, st.Expired)
			}
			if st.Usage["rm"] < bigFile || st.Usage["parent"] < bigFile {
				t.Errorf("usage %v does not count the big files", st.Usage)
			}
			// Past the grace period but within the history: the turn-1
			// manifest still names the big file.
			c.Now = later(90 * time.Minute)
			if st, err = c.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Stat(ctx, bigKey); err != nil {
				t.Errorf("the big file of a kept manifest was collected: %v (stats %+v)", err, st)
			}
			// Past the history: the removed file's object goes, what the
			// current manifests and the fork use stays.
			c.Now = later(3 * time.Hour)
			if st, err = c.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Stat(ctx, bigKey); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("the removed big file's object is still stored after the pass: %v (stats %+v)", err, st)
			}
			if st.DeletedBytes < bigFile || st.Expired < 2 {
				t.Errorf("stats %+v: want the big file deleted and the expired manifests counted", st)
			}
			if st.Usage["rm"] >= bigFile {
				t.Errorf("session rm still counts %d bytes", st.Usage["rm"])
			}
			dst := t.TempDir()
			mustRestore(t, &mount.Volume{Blob: store, Prefix: mount.Prefix("rm"), Logger: quiet}, b.workspace(t, dst), 2)
			if d := diff(snapshot(t, ws), snapshot(t, dst)); d != "" {
				t.Errorf("restore after the pass differs:\n%s", d)
			}
			if _, err := mount.ReadKept(ctx, store, v.Prefix, turn1.ID); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("read an expired kept manifest: %v, want not found", err)
			}
			// The fork's workspace still restores from its deleted
			// parent's content.
			fdst := t.TempDir()
			mustRestore(t, &mount.Volume{Blob: store, Prefix: mount.Prefix("child"), Logger: quiet}, b.workspace(t, fdst), 1)
			if got := mustRead(t, filepath.Join(fdst, "big.bin")); len(got) != bigFile {
				t.Errorf("the fork's big file has %d bytes", len(got))
			}
			if keys := contentKeys(t, store, "parent"); len(keys) != 1 {
				t.Errorf("the deleted parent keeps %q, want only the object its fork uses", keys)
			}
			// Once the fork is deleted too, its parent's content goes.
			must(t, (&mount.Volume{Blob: store, Prefix: mount.Prefix("child"), Logger: quiet}).Delete(ctx))
			if _, err = c.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			if keys := blobtest.Keys(t, store, "sessions/parent/"); len(keys) != 0 {
				t.Errorf("after its fork was deleted the parent still holds %q", keys)
			}
		})
	}
}

// TestCollector_ConcurrentSave runs a pass while a save has uploaded its
// objects but not yet written its manifest, with a clock that makes every
// object look old: the pass must not take them.
func TestCollector_ConcurrentSave(t *testing.T) {
	for _, b := range gcStores(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			ws := t.TempDir()
			writeFile(t, ws, "a.bin", blobtest.Random(600<<10), 0o644, old)
			writeFile(t, ws, "b.txt", []byte("small"), 0o644, old)
			v := &mount.Volume{Blob: b.store, Prefix: mount.Prefix("busy"), Logger: quiet}
			mustRestore(t, v, b.workspace(t, ws), 1)
			c := &mount.Collector{Blob: b.store, Now: later(2 * time.Hour), Logger: quiet}
			var pass mount.CollectStats
			var passErr error
			hooked := hookWorkspace{Workspace: b.workspace(t, ws), afterUpload: func() {
				pass, passErr = c.Collect(ctx)
			}}
			mustSave(t, v, hooked, 1)
			must(t, passErr)
			if pass.Deleted != 0 || pass.Spared < 2 {
				t.Errorf("a pass during a save deleted %d objects, spared %d; want 0 deleted, the save's 2 spared", pass.Deleted, pass.Spared)
			}
			dst := t.TempDir()
			mustRestore(t, &mount.Volume{Blob: b.store, Prefix: mount.Prefix("busy"), Logger: quiet}, b.workspace(t, dst), 1)
			if d := diff(snapshot(t, ws), snapshot(t, dst)); d != "" {
				t.Errorf("restore after the concurrent pass differs:\n%s", d)
			}
			if keys := blobtest.Keys(t, b.store, mount.Prefix("busy")+"pending/"); len(keys) != 0 {
				t.Errorf("the save left its pending marker: %q", keys)
			}

			// A save that crashed after uploading leaves a marker and
			// objects no manifest names: after MaxSave both go.
			blobtest.MustPut(t, b.store, mount.Prefix("crash")+"objects/00ff", blobtest.Random(300<<10), blob.PutOptions{})
			blobtest.MustPut(t, b.store, mount.Prefix("crash")+"pending/deadbeef", nil, blob.PutOptions{})
			c.Now = later(time.Hour + 30*time.Minute)
			if _, err := c.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			if n := len(contentKeys(t, b.store, "crash")); n != 1 {
				t.Errorf("a pass within MaxSave of the crashed save's marker collected its object")
			}
			c.Now = later(7 * time.Hour)
			if _, err := c.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			if keys := blobtest.Keys(t, b.store, "sessions/crash/"); len(keys) != 0 {
				t.Errorf("after MaxSave the crashed save left %q", keys)
			}
		})
	}
}

func removeFile(root, rel string) error { return os.Remove(filepath.Join(root, rel)) }

func TestQuota(t *testing.T) {
	for _, b := range gcStores(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			tenants := map[session.ID]string{"a1": "acme", "a2": "acme", "g1": "globex"}
			q := &mount.Quota{Limit: 3 << 20, Logger: quiet, TenantOf: func(_ context.Context, id session.ID) (string, error) {
				if t, ok := tenants[id]; ok {
					return t, nil
				}
				return "", errors.New("no such session")
			}}
			store := &mount.Limited{Store: b.store, Quota: q}
			c := &mount.Collector{Blob: b.store, Logger: quiet}
			measure := func() {
				st, err := c.Collect(ctx)
				must(t, err)
				q.Measure(ctx, st.Usage)
			}
			save := func(id session.ID, ws string, fence int64) (*mount.Volume, error) {
				v := &mount.Volume{Blob: store, Prefix: mount.Prefix(id), Logger: quiet}
				if _, err := v.Restore(ctx, b.workspace(t, ws), fence); err != nil {
					return v, err
				}
				_, err := v.Save(ctx, b.workspace(t, ws), fence)
				return v, err
			}
			ws1 := t.TempDir()
			writeFile(t, ws1, "one.bin", blobtest.Random(2<<20), 0o644, old)
			if _, err := save("a1", ws1, 1); err != nil {
				t.Fatal(err)
			}
			measure()
			if used, _ := q.Used("acme"); used < 2<<20 {
				t.Fatalf("acme uses %d bytes after storing 2 MiB", used)
			}
			// acme's second session would take it past 3 MiB.
			ws2 := t.TempDir()
			writeFile(t, ws2, "two.bin", blobtest.Random(2<<20), 0o644, old)
			_, err := save("a2", ws2, 1)
			if !errors.Is(err, session.ErrInsufficientStorage) {
				t.Fatalf("a save beyond the tenant's quota: %v, want insufficient storage", err)
			}
			for _, want := range []string{`tenant "acme"`, "3.0 MiB", "storage.tenant_quota_bytes"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the quota error %q does not say %q", err, want)
				}
			}
			if keys := blobtest.Keys(t, b.store, "sessions/a2/"); len(keys) != 0 {
				t.Errorf("the refused save stored %q", keys)
			}
			if _, err := mount.PutContent(ctx, store, mount.Prefix("a2"), strings.NewReader(strings.Repeat("x", 2<<20)), 2<<20); !errors.Is(err, session.ErrInsufficientStorage) {
				t.Errorf("a file write beyond the quota: %v, want insufficient storage", err)
			}
			// Another tenant is not affected.
			if _, err := save("g1", ws2, 1); err != nil {
				t.Errorf("globex's save failed: %v", err)
			}
			// Removing the file and collecting frees the space.
			v1 := &mount.Volume{Blob: store, Prefix: mount.Prefix("a1"), Logger: quiet}
			mustRestore(t, v1, b.workspace(t, ws1), 1)
			must(t, removeFile(ws1, "one.bin"))
			mustSave(t, v1, b.workspace(t, ws1), 1)
			c.Now = later(2 * time.Hour)
			measure()
			if used, _ := q.Used("acme"); used >= 1<<20 {
				t.Errorf("acme still uses %d bytes after the pass", used)
			}
			if _, err := save("a2", ws2, 1); err != nil {
				t.Errorf("a save within the freed quota: %v", err)
			}
		})
	}
}

// TestCollector_Volumes: a pass collects the volumes it is told about
// (here an agent's home beside the workspace) and only measures the rest.
func TestCollector_Volumes(t *testing.T) {
	b := backend{name: "dir", store: &blob.Dir{Path: t.TempDir()}}
	ctx := context.Background()
	ws := t.TempDir()
	writeFile(t, ws, "transcript.bin", blobtest.Random(400<<10), 0o644, old)
	v := &mount.Volume{Blob: b.store, Prefix: "sessions/h1/agent-home/", Logger: quiet}
	mustRestore(t, v, b.workspace(t, ws), 1)
	mustSave(t, v, b.workspace(t, ws), 1)
	must(t, removeFile(ws, "transcript.bin"))
	mustSave(t, v, b.workspace(t, ws), 1)
	objects := func() int {
		n := 0
		for _, k := range blobtest.Keys(t, b.store, v.Prefix) {
			if strings.Contains(k, "/objects/") {
				n++
			}
		}
		return n
	}
	c := &mount.Collector{Blob: b.store, Now: later(3 * time.Hour), Logger: quiet}
	st, err := c.Collect(ctx)
	must(t, err)
	if objects() != 1 || st.Usage["h1"] < 400<<10 {
		t.Errorf("a pass not told about agent-home: %d objects left, usage %d; want it untouched and measured", objects(), st.Usage["h1"])
	}
	c.Volumes = []string{"workspace", "agent-home"}
	if _, err := c.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	if objects() != 0 {
		t.Errorf("a pass told about agent-home left %d objects of a removed file", objects())
	}
}
