// Package tarball packs a folder of the local disk as a tar.gz and unpacks
// one into a folder: the body of the workspace archive endpoints (DESIGN §7
// "More REST") as the CLI (`atrium cp`) and agent tasks read and write it on
// their side. It owns the path checks: no entry of an archive is written
// outside the folder it is unpacked into.
package tarball

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Write writes dir's folders, regular files and symbolic links to w as a
// tar.gz in PAX format, names relative to dir (folders end in "/"), with no
// owner names or ids. Sockets, devices and pipes are left out.
func Write(w io.Writer, dir string) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case info.Mode().IsDir(), info.Mode().IsRegular():
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return nil // sockets, devices, pipes
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Format = filepath.ToSlash(rel), tar.FormatPAX
		hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
		if info.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// ExtractOptions says what Extract leaves out and which modes it writes.
// The zero value unpacks every entry with the archive's permissions.
type ExtractOptions struct {
	// Skip, when set, is asked about each entry's cleaned, slash-separated
	// name; an entry it answers true for is not written.
	Skip func(name string) bool
	// PlainModes writes files 0644, or 0755 when the archive gives any
	// executable bit, and folders 0755, whatever else the archive says
	// (what git keeps of a mode).
	PlainModes bool
}

// Extract unpacks the tar.gz r into dir, making dir if it is missing.
// Folders, regular files and symbolic links are written (a link replaces
// what stood at its name); other entries are left out. It refuses an
// entry whose name is absolute or climbs out with "..", and writes through
// an os.Root, so no entry (a symbolic link in the path included) can reach
// outside dir. Entries before a refused or damaged one stay written.
func Extract(r io.Reader, dir string, opt ExtractOptions) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("the archive is not gzip: %w", err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the archive is damaged: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." || (opt.Skip != nil && opt.Skip(name)) {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("the archive's entry %q leaves the folder it is unpacked into", hdr.Name)
		}
		if err := extractOne(root, tr, hdr, filepath.FromSlash(name), opt.PlainModes); err != nil {
			return fmt.Errorf("unpack %s: %w", hdr.Name, err)
		}
	}
}

// extractOne writes the entry hdr (its content the rest of tr) at name
// below root.
func extractOne(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string, plain bool) error {
	perm := fs.FileMode(hdr.Mode).Perm()
	switch hdr.Typeflag {
	case tar.TypeDir:
		if plain {
			perm = 0o755
		}
		return root.MkdirAll(name, max(perm, 0o700))
	case tar.TypeSymlink:
		if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		_ = root.Remove(name)
		return root.Symlink(hdr.Linkname, name)
	case tar.TypeReg:
		if plain {
			perm = 0o644
			if hdr.Mode&0o111 != 0 {
				perm = 0o755
			}
		}
		if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return nil
}
