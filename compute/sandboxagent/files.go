package sandboxagent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"

	"github.com/atriumhq/atrium/session"
)

// defaultFileMode is the mode of an uploaded file without a mode query.
const defaultFileMode = 0o644

// filePath validates the path of a file request: a relative, clean,
// slash-separated path inside the workspace.
func filePath(r *http.Request) (string, error) {
	p := r.PathValue("path")
	if p == "" || !fs.ValidPath(p) || p == "." {
		return "", session.Errorf(session.CodeBadRequest,
			"file path %q must be relative to the workspace, without '.', '..' or empty elements", p)
	}
	return p, nil
}

// openWorkspace opens the open sandbox's workspace as an os.Root, which
// refuses any path that leaves it, through '..' or a symbolic link.
func (s *Server) openWorkspace() (*os.Root, error) {
	dir, err := s.workspace()
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return root, nil
}

// fileError converts an error of an os.Root operation on name into one for
// the caller.
func fileError(name string, err error) error {
	var pe *fs.PathError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return session.Errorf(session.CodeNotFound, "%s does not exist in the workspace", name)
	case errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes"):
		return session.Errorf(session.CodeBadRequest, "%s leads out of the workspace (through '..' or a symbolic link)", name)
	case errors.Is(err, syscall.EISDIR) || errors.Is(err, fs.ErrExist):
		return session.Errorf(session.CodeConflict, "%s is a directory", name)
	case errors.Is(err, syscall.ENOTDIR):
		return session.Errorf(session.CodeConflict, "a parent of %s is not a directory", name)
	case errors.Is(err, fs.ErrPermission):
		return session.Errorf(session.CodeForbidden, "%s: permission denied", name)
	}
	return err
}

// handlePutFile writes the request body to a file of the workspace,
// creating its parent directories. The file appears complete or not at all.
func (s *Server) handlePutFile(w http.ResponseWriter, r *http.Request, _ int64) {
	name, err := filePath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	mode := os.FileMode(defaultFileMode)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o777 {
			writeError(w, session.Errorf(session.CodeBadRequest, "mode %q must be octal permission bits from 0 to 0777, such as 0644", m))
			return
		}
		mode = os.FileMode(v)
	}
	root, err := s.openWorkspace()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer root.Close()
	if err := writeFile(root, name, mode, r.Body); err != nil {
		s.fail(w, r, fmt.Errorf("write %s: %w", name, fileError(name, err)))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeFile writes name in root from body, through a temporary file renamed
// into place.
func writeFile(root *os.Root, name string, mode os.FileMode, body io.Reader) error {
	dir := path.Dir(name)
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(dir, ".atrium-upload-"+hex.EncodeToString(rnd[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		_ = root.Remove(tmp)
	}
	return err
}

// handleGetFile answers with the bytes of a regular file of the workspace.
func (s *Server) handleGetFile(w http.ResponseWriter, r *http.Request, _ int64) {
	name, err := filePath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	root, err := s.openWorkspace()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer root.Close()
	f, err := root.Open(name)
	if err != nil {
		s.fail(w, r, fileError(name, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		s.fail(w, r, fmt.Errorf("stat %s: %w", name, err))
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, session.Errorf(session.CodeBadRequest, "%s is not a regular file", name))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Atrium-Mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
	http.ServeContent(w, r, "", fi.ModTime(), f)
}
