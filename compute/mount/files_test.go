package mount_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

func TestUnifiedDiff_MatchesDiffU(t *testing.T) {
	cases := map[string][2]string{
		"one line changed":   {"a\nb\nc\nd\ne\nf\ng\nh\n", "a\nb\nc\nD\ne\nf\ng\nh\n"},
		"added at end":       {"a\nb\n", "a\nb\nc\n"},
		"removed at start":   {"a\nb\nc\n", "b\nc\n"},
		"two far hunks":      {strings.Repeat("x\n", 3) + "1\n" + strings.Repeat("y\n", 10) + "2\n", strings.Repeat("x\n", 3) + "one\n" + strings.Repeat("y\n", 10) + "two\n"},
		"from empty":         {"", "new\nfile\n"},
		"no final newline":   {"a\nb", "a\nc"},
		"everything changed": {"1\n2\n3\n", "4\n5\n"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := mount.UnifiedDiff("f.txt", []byte(c[0]), []byte(c[1]))
			if !ok {
				t.Fatal("no diff")
			}
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "a"), []byte(c[0]), 0o644)
			os.WriteFile(filepath.Join(dir, "b"), []byte(c[1]), 0o644)
			out, _ := exec.Command("diff", "-u", "--label", "a/f.txt", "--label", "b/f.txt", filepath.Join(dir, "a"), filepath.Join(dir, "b")).Output()
			// diff(1) may choose a different but equally short script;
			// both must apply: compare by patching.
			if string(out) != got {
				if !applies(t, c[0], got, c[1]) {
					t.Fatalf("diff does not patch a into b:\n%s\ndiff -u says:\n%s", got, out)
				}
			}
		})
	}
	if _, ok := mount.UnifiedDiff("bin", []byte{0, 1}, []byte{0, 2}); ok {
		t.Fatal("binary content was diffed")
	}
}

func applies(t *testing.T, old, diff, want string) bool {
	t.Helper()
	dir := t.TempDir()
	f := filepath.Join(dir, "f.txt")
	os.WriteFile(f, []byte(old), 0o644)
	cmd := exec.Command("patch", "-s", f)
	cmd.Stdin = strings.NewReader(diff)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Logf("patch: %v %s", err, out)
		return false
	}
	got, _ := os.ReadFile(f)
	return string(got) == want
}

func TestSaved_ReadEditFork(t *testing.T) {
	t.Run("dir", func(t *testing.T) { testSaved(t, &blob.Dir{Path: t.TempDir()}) })
	t.Run("s3", func(t *testing.T) { testSaved(t, blobtest.StartS3(t).Open(t, "")) })
}

// testSaved reads and changes a saved workspace without a sandbox, forks
// it, deletes the parent, and restores the fork.
func testSaved(t *testing.T, store blob.Store) {
	ctx := context.Background()
	prefix := "sessions/s1/workspace/"
	m, err := mount.Update(ctx, store, prefix, 5, func(es []mount.Entry) ([]mount.Entry, error) {
		e, err := mount.PutContent(ctx, store, prefix, strings.NewReader("hello"), 5)
		if err != nil {
			return nil, err
		}
		e.Path, e.Mode = "a/b/c.txt", 0o644
		return mount.SetEntry(es, e, 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mount.Update(ctx, store, prefix, 4, func(es []mount.Entry) ([]mount.Entry, error) { return es, nil }); err == nil {
		t.Fatal("older fence wrote")
	}
	got, _, err := mount.ReadManifest(ctx, store, prefix)
	if err != nil || got.ID != m.ID || len(got.Entries) != 3 {
		t.Fatalf("manifest %+v %v", got, err)
	}
	e, err := got.Resolve("a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := mount.Open(ctx, store, prefix, e)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "hello" {
		t.Fatalf("read %q %v", b, err)
	}
	// A link out of the workspace, and a write through a link.
	m2, err := mount.Update(ctx, store, prefix, 5, func(es []mount.Entry) ([]mount.Entry, error) {
		return mount.SetEntry(es, mount.Entry{Path: "out", Type: mount.TypeSymlink, Mode: 0o777, Target: "/etc"}, 2)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Resolve("out/passwd"); !errorsIs(err, mount.ErrOutside) {
		t.Fatalf("resolve through link out: %v", err)
	}
	if _, err := mount.SetEntry(m2.Entries, mount.Entry{Path: "out/x", Type: mount.TypeFile}, 3); !errorsIs(err, mount.ErrOutside) {
		t.Fatalf("write through link: %v", err)
	}
	if _, err := mount.SetEntry(m2.Entries, mount.Entry{Path: "a/b", Type: mount.TypeFile}, 3); !errorsIs(err, mount.ErrIsDir) {
		t.Fatalf("file over dir: %v", err)
	}
	for _, p := range []string{"../x", "/etc/passwd", "a/../../x"} {
		if _, err := mount.CleanPath(p); !errorsIs(err, mount.ErrOutside) {
			t.Fatalf("CleanPath(%q) = %v", p, err)
		}
	}
	ls, err := m2.List("", false)
	if err != nil || len(ls) != 2 || ls[0].Path != "a" || ls[1].Path != "out" {
		t.Fatalf("list root %+v %v", ls, err)
	}
	ls, err = m2.List("a", true)
	if err != nil || len(ls) != 2 {
		t.Fatalf("list a %+v %v", ls, err)
	}
	// Fork: the child names the parent's content; deleting the parent keeps it.
	if err := mount.ForkTo(ctx, store, prefix, m2, "sessions/s2/workspace/", "s2"); err != nil {
		t.Fatal(err)
	}
	child, _, err := mount.ReadManifest(ctx, store, "sessions/s2/workspace/")
	if err != nil {
		t.Fatal(err)
	}
	ce, _ := child.Lookup("a/b/c.txt")
	if !strings.HasPrefix(ce.Blob, "sessions/s1/workspace/objects/") {
		t.Fatalf("fork blob %q", ce.Blob)
	}
	if err := (&mount.Volume{Blob: store, Prefix: prefix}).Delete(ctx); err != nil {
		t.Fatal(err)
	}
	rc, err = mount.Open(ctx, store, "sessions/s2/workspace/", ce)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" {
		t.Fatalf("fork content %q", b)
	}
	// Restore the fork into a directory.
	dir := t.TempDir()
	ws := &mount.Dir{Path: filepath.Join(dir, "ws"), Blob: store}
	if _, err := (&mount.Volume{Blob: store, Prefix: "sessions/s2/workspace/"}).Restore(ctx, ws, 1); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "ws", "a/b/c.txt")); err != nil || !bytes.Equal(b, []byte("hello")) {
		t.Fatalf("restored fork %q %v", b, err)
	}
	ch := mount.Diff(m.Entries, child.Entries)
	if len(ch) != 1 || ch[0].Path != "out" || ch[0].Status != mount.Added {
		t.Fatalf("diff %+v", ch)
	}
}

func errorsIs(err, target error) bool { return err != nil && errorsIsStd(err, target) }

var errorsIsStd = errors.Is

// BenchmarkDiff10000 is the work a turn's end adds to the save: the
// difference between the manifests before and after a turn that changed one
// file of 10,000 (no scan of the workspace).
func BenchmarkDiff10000(b *testing.B) {
	var before []mount.Entry
	before = append(before, mount.Entry{Path: "d", Type: mount.TypeDir, Mode: 0o755})
	for i := range 10000 {
		before = append(before, mount.Entry{Path: fmt.Sprintf("d/f%05d", i), Type: mount.TypeFile, Mode: 0o644, Size: 10000,
			Hash: fmt.Sprintf("%064x", i)})
	}
	after := slices.Clone(before)
	after[43].Hash = fmt.Sprintf("%064x", 99999)
	for b.Loop() {
		if ch := mount.Diff(before, after); len(ch) != 1 {
			b.Fatalf("%d changes", len(ch))
		}
	}
}
