package local

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// hostIdentity is how a node running as root keeps sandbox files from being
// root's on the host: bubblewrap runs as an unprivileged host uid and gid
// (through setpriv), so the sandbox's user (SandboxUID) is that uid outside
// and nothing in the sandbox maps to host root. A setuid file made in the
// sandbox is that uid's on the host, not root's.
type hostIdentity struct {
	uid     int
	setpriv string
}

// newHostIdentity checks that uid can be used: atrium runs as root, setpriv
// is installed, and every directory above dir can be searched by uid (it
// binds the workspaces and the account files from there).
func newHostIdentity(uid int, dir string) (*hostIdentity, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("sandbox host uid %d needs atrium to run as root (it runs bubblewrap as that uid)", uid)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return nil, fmt.Errorf("sandbox host uid %d needs setpriv (util-linux): %w", uid, err)
	}
	if err := reachable(uid, dir); err != nil {
		return nil, err
	}
	return &hostIdentity{uid: uid, setpriv: setpriv}, nil
}

// CheckHostUID reports whether sandboxes under dir can run as host uid
// (Config.HostUID): atrium runs as root, setpriv is installed, and uid can
// search every directory above dir. The error says what is missing.
func CheckHostUID(uid int, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := searchable(dir); err != nil {
		return err
	}
	_, err := newHostIdentity(uid, dir)
	return err
}

// searchable lets everyone search (not list) dir, the provider's own
// directory, so the sandbox host uid reaches the workspaces below it.
func searchable(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&0o011 != 0o011 {
		return os.Chmod(dir, m|0o011)
	}
	return nil
}

// reachable checks that uid can search every directory above and at dir.
func reachable(uid int, dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for d := abs; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm()&0o001 == 0 && (st == nil || int(st.Uid) != uid) {
			return fmt.Errorf("sandbox host uid %d cannot reach %s: %s has mode %v; make it searchable (chmod o+x %s)",
				uid, dir, d, fi.Mode().Perm(), d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// forwarder returns a path of the executable at exe that the host uid can
// reach: exe itself, or a link or copy of it in stateDir.
func (h *hostIdentity) forwarder(exe, stateDir string) (string, error) {
	if h == nil || exe == "" || reachable(h.uid, filepath.Dir(exe)) == nil {
		return exe, nil
	}
	dst := filepath.Join(stateDir, "forwarder")
	tmp := dst + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Link(exe, tmp); err != nil {
		in, err := os.Open(exe)
		if err != nil {
			return "", err
		}
		defer in.Close()
		out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
		if err != nil {
			return "", err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return "", err
		}
		if err := out.Close(); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp, dst)
}

// command returns the command line that runs bubblewrap at path bwrap as the
// host uid.
func (h *hostIdentity) command(bwrap string) []string {
	if h == nil {
		return []string{bwrap}
	}
	id := strconv.Itoa(h.uid)
	return []string{h.setpriv, "--reuid=" + id, "--regid=" + id, "--clear-groups", "--", bwrap}
}

// own gives the sandbox directory dir (searchable, not readable, by others)
// and its workspace (owned, recursively when it was someone else's) to the
// host uid.
func (h *hostIdentity) own(dir, workspace string) error {
	if h == nil {
		return nil
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	fi, err := os.Stat(workspace)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == h.uid && int(st.Gid) == h.uid {
		return nil
	}
	return filepath.WalkDir(workspace, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, h.uid, h.uid)
	})
}

// ownTree gives the tree at dir (a writable mount, such as an agent's
// home) to the host uid, unless dir is already its.
func (h *hostIdentity) ownTree(dir string) error {
	if h == nil {
		return nil
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == h.uid && int(st.Gid) == h.uid {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, h.uid, h.uid)
	})
}

// ownFile gives the file at path (a socket the sandbox connects to) to the
// host uid.
func (h *hostIdentity) ownFile(path string) error {
	if h == nil {
		return nil
	}
	return os.Lchown(path, h.uid, h.uid)
}
