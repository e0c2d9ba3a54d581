package task

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tarGz builds a tar.gz of hdrs, each regular file with its body.
func tarGz(t *testing.T, entries ...any) *bytes.Buffer {
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

// TestArchive_RoundTrip: a tree packed by writeTarGz unpacks by
// extractTarGz to the same files, modes and links, without .git.
func TestArchive_RoundTrip(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a/b"), 0o755))
	must(os.MkdirAll(filepath.Join(src, ".git/refs"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a/b/c.txt"), []byte("c\n"), 0o644))
	must(os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(os.WriteFile(filepath.Join(src, ".git/config"), []byte("[core]\n"), 0o644))
	must(os.Symlink("a/b/c.txt", filepath.Join(src, "link")))

	var buf bytes.Buffer
	must(writeTarGz(&buf, src))
	dst := t.TempDir()
	must(extractTarGz(&buf, dst))

	if b, err := os.ReadFile(filepath.Join(dst, "a/b/c.txt")); err != nil || string(b) != "c\n" {
		t.Errorf("a/b/c.txt = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "run.sh")); err != nil || fi.Mode()&0o100 == 0 {
		t.Errorf("run.sh lost its executable bit: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "a/b/c.txt" {
		t.Errorf("link = %q, %v", l, err)
	}
	if _, err := os.Stat(filepath.Join(dst, ".git")); !os.IsNotExist(err) {
		t.Errorf("the workspace's .git was unpacked: %v", err)
	}
}

// TestArchive_Escapes: no entry of a workspace archive writes outside the
// clone, whether by "..", an absolute name or a symbolic link leading out.
func TestArchive_Escapes(t *testing.T) {
	outside := t.TempDir()
	cases := map[string]*bytes.Buffer{
		"dotdot": tarGz(t, &tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}, "x"),
		"link out then write through it": tarGz(t,
			&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside}, "",
			&tar.Header{Name: "out/evil", Typeflag: tar.TypeReg, Mode: 0o644}, "x"),
		"git hook": tarGz(t, &tar.Header{Name: ".git/hooks/pre-commit", Typeflag: tar.TypeReg, Mode: 0o755}, "#!/bin/sh\ntouch "+outside+"/evil\n"),
		"nested repository": tarGz(t,
			&tar.Header{Name: "sub/.git/config", Typeflag: tar.TypeReg, Mode: 0o644}, "[core]\n\tfsmonitor = touch "+outside+"/evil\n",
			&tar.Header{Name: "sub/.GIT", Typeflag: tar.TypeReg, Mode: 0o644}, "gitdir: /\n"),
	}
	for name, archive := range cases {
		t.Run(name, func(t *testing.T) {
			dst := t.TempDir()
			_ = extractTarGz(archive, dst) // an error or a skip, never a write outside
			if _, err := os.Stat(filepath.Join(outside, "evil")); err == nil {
				t.Fatal("an entry was written outside the clone")
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(dst), "evil")); err == nil {
				t.Fatal("an entry was written next to the clone")
			}
			for _, p := range []string{".git", "sub/.git", "sub/.GIT"} {
				if _, err := os.Stat(filepath.Join(dst, p)); err == nil {
					t.Fatalf("%s was unpacked", p)
				}
			}
		})
	}
	if err := extractTarGz(strings.NewReader("not gzip"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "not gzip") {
		t.Errorf("a damaged archive: %v", err)
	}
}
