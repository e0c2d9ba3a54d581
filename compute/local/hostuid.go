package local

import (
	"fmt"
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
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for d := abs; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return nil, err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm()&0o001 == 0 && (st == nil || int(st.Uid) != uid) {
			return nil, fmt.Errorf("sandbox host uid %d cannot reach %s: %s has mode %v; make it searchable (chmod o+x %s)",
				uid, dir, d, fi.Mode().Perm(), d)
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	return &hostIdentity{uid: uid, setpriv: setpriv}, nil
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
