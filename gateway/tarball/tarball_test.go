package tarball_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/atriumhq/atrium/gateway/tarball"
)

// archiveOf builds a tar.gz of hdrs, each regular file with its body.
func archiveOf(t *testing.T, entries ...any) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for i := 0; i < len(entries); i += 2 {
		hdr := entries[i].(*tar.Header)
		body := entries[i+1].(string)
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// tree makes a folder with a nested file, a private file, an executable,
// a symbolic link, an empty folder and a pipe.
func tree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "a/b"), 0o755))
	must(t, os.Mkdir(filepath.Join(src, "empty"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "a/b/c.txt"), []byte("c\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(src, "secret"), []byte("s"), 0o600))
	must(t, os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Symlink("a/b/c.txt", filepath.Join(src, "link")))
	must(t, syscall.Mkfifo(filepath.Join(src, "pipe"), 0o644))
	return src
}

func TestWrite_Entries(t *testing.T) {
	var buf bytes.Buffer
	must(t, tarball.Write(&buf, tree(t)))
	gz, err := gzip.NewReader(&buf)
	must(t, err)
	tr := tar.NewReader(gz)
	got := map[string]byte{}
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		got[hdr.Name] = hdr.Typeflag
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" {
			t.Errorf("%s carries its owner: %d:%d %q:%q", hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname)
		}
	}
	want := map[string]byte{
		"a/": tar.TypeDir, "a/b/": tar.TypeDir, "a/b/c.txt": tar.TypeReg, "empty/": tar.TypeDir,
		"secret": tar.TypeReg, "run.sh": tar.TypeReg, "link": tar.TypeSymlink,
	}
	if len(got) != len(want) {
		t.Errorf("entries = %v, want %v (no pipe)", got, want)
	}
	for name, typ := range want {
		if got[name] != typ {
			t.Errorf("entry %s has type %q, want %q", name, got[name], typ)
		}
	}
}

func TestExtract_RoundTrip(t *testing.T) {
	for name, tc := range map[string]struct {
		opt        tarball.ExtractOptions
		secretMode fs.FileMode
	}{
		"archive modes": {secretMode: 0o600},
		"plain modes":   {opt: tarball.ExtractOptions{PlainModes: true}, secretMode: 0o644},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			must(t, tarball.Write(&buf, tree(t)))
			dst := filepath.Join(t.TempDir(), "missing", "dst")
			must(t, tarball.Extract(&buf, dst, tc.opt))
			if b, err := os.ReadFile(filepath.Join(dst, "a/b/c.txt")); err != nil || string(b) != "c\n" {
				t.Errorf("a/b/c.txt = %q, %v", b, err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("run.sh: %v %v, want mode 0755", fi, err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "secret")); err != nil || fi.Mode().Perm() != tc.secretMode {
				t.Errorf("secret: %v %v, want mode %v", fi, err, tc.secretMode)
			}
			if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "a/b/c.txt" {
				t.Errorf("link = %q, %v", l, err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || !fi.IsDir() {
				t.Errorf("empty folder: %v %v", fi, err)
			}
			if _, err := os.Lstat(filepath.Join(dst, "pipe")); !os.IsNotExist(err) {
				t.Errorf("the pipe was unpacked: %v", err)
			}
		})
	}
}

func TestExtract_Skip(t *testing.T) {
	archive := archiveOf(t,
		&tar.Header{Name: "keep/x", Typeflag: tar.TypeReg, Mode: 0o644}, "x",
		&tar.Header{Name: "./drop/y", Typeflag: tar.TypeReg, Mode: 0o644}, "y")
	var asked []string
	dst := t.TempDir()
	must(t, tarball.Extract(archive, dst, tarball.ExtractOptions{Skip: func(name string) bool {
		asked = append(asked, name)
		return strings.HasPrefix(name, "drop/")
	}}))
	if strings.Join(asked, ",") != "keep/x,drop/y" {
		t.Errorf("Skip was asked about %q, want the cleaned names keep/x, drop/y", asked)
	}
	if _, err := os.Stat(filepath.Join(dst, "keep/x")); err != nil {
		t.Errorf("keep/x: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "drop")); !os.IsNotExist(err) {
		t.Errorf("drop/ was unpacked: %v", err)
	}
}

// TestExtract_Escapes: no entry writes outside the folder, whether by "..",
// an absolute name or a symbolic link leading out; each is an error naming
// the entry.
func TestExtract_Escapes(t *testing.T) {
	outside := t.TempDir()
	cases := map[string]struct {
		archive *bytes.Buffer
		entry   string
	}{
		"dotdot": {archiveOf(t, &tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}, "x"), "../evil"},
		"dotdot inside": {archiveOf(t, &tar.Header{Name: "a/../../evil", Typeflag: tar.TypeReg, Mode: 0o644}, "x"),
			"a/../../evil"},
		"absolute": {archiveOf(t, &tar.Header{Name: outside + "/evil", Typeflag: tar.TypeReg, Mode: 0o644}, "x"),
			outside + "/evil"},
		"link out then write through it": {archiveOf(t,
			&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside}, "",
			&tar.Header{Name: "out/evil", Typeflag: tar.TypeReg, Mode: 0o644}, "x"), "out/evil"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			err := tarball.Extract(tc.archive, dst, tarball.ExtractOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.entry) {
				t.Errorf("Extract = %v, want an error naming %q", err, tc.entry)
			}
			for _, p := range []string{filepath.Join(outside, "evil"), filepath.Join(filepath.Dir(dst), "evil")} {
				if _, err := os.Stat(p); err == nil {
					t.Fatalf("an entry was written at %s", p)
				}
			}
		})
	}
}

func TestExtract_Damaged(t *testing.T) {
	if err := tarball.Extract(strings.NewReader("not gzip"), t.TempDir(), tarball.ExtractOptions{}); err == nil || !strings.Contains(err.Error(), "not gzip") {
		t.Errorf("not gzip: %v", err)
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	_, _ = gz.Write([]byte(strings.Repeat("x", 700)))
	must(t, gz.Close())
	if err := tarball.Extract(&buf, t.TempDir(), tarball.ExtractOptions{}); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("gzip of no tar: %v", err)
	}
}
