package server

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/mount"
)

// resolveSandboxDefaults turns off, saying so, the local-sandbox protections
// that are on by default (HostUIDAuto, WorkspaceDiskAuto) but that this host
// cannot provide, and says which are on. A protection the operator asked for
// explicitly is left as it is: local.New fails with the reason. With a host
// uid, the data dir is first made passable by it (shareDataDir).
func resolveSandboxDefaults(sb *Sandbox, dataDir string, unsafe bool, log *slog.Logger) {
	if unsafe {
		return // No sandbox at all: said loudly elsewhere.
	}
	if sb.HostUIDAuto && sb.HostUID > 0 && os.Geteuid() != 0 {
		// The mapping keeps sandbox files from being root's; without root
		// they are this user's already, and nothing is lost.
		log.Info("sandboxes run as atrium's own user, which is not root (sandbox.host_uid applies when atrium runs as root)",
			"uid", os.Geteuid())
		sb.HostUID = 0
	}
	if sb.HostUID > 0 {
		if err := shareDataDir(dataDir, log); err != nil {
			log.Warn("could not make the data dir passable by the sandbox host uid", "dir", dataDir, "err", err.Error())
		}
	}
	if sb.HostUIDAuto && sb.HostUID > 0 {
		if err := local.CheckHostUID(sb.HostUID, filepath.Join(dataDir, "sandboxes")); err != nil {
			log.Warn("sandbox host uid mapping OFF: sandboxes run as atrium's own user, root, so a file a sandbox makes "+
				"(a setuid one too) is root's on the host. To turn it on, do what the reason says (or give --data / data_dir "+
				"a directory every user can pass through) and restart; to run without it knowingly, set sandbox.host_uid: -1 "+
				"(ATRIUM_SANDBOX_HOST_UID=-1)", "reason", err.Error())
			sb.HostUID = 0
		} else {
			log.Info("sandboxes run as an unprivileged host uid (sandbox.host_uid)", "uid", sb.HostUID)
		}
	}
	if sb.WorkspaceDiskAuto && sb.WorkspaceDiskBytes > 0 {
		if err := local.CheckWorkspaceQuota(); err != nil {
			log.Warn("sandbox workspace quota OFF: this host cannot give sandboxes a workspace file system of their own, "+
				"so a turn can fill the node's disk; fix the reason or set sandbox.workspace_disk_bytes: -1 to turn it off knowingly",
				"reason", err.Error())
			sb.WorkspaceDiskBytes = 0
		} else {
			log.Info("sandbox workspaces have a disk quota (sandbox.workspace_disk_bytes)", "bytes", sb.WorkspaceDiskBytes,
				"size", mount.Bytes(sb.WorkspaceDiskBytes))
		}
	}
	if sb.WorkspaceDiskBytes <= 0 && !sb.WorkspaceDiskAuto {
		log.Info("sandbox workspaces have no disk quota: a turn can fill the node's disk (set sandbox.workspace_disk_bytes, " +
			"or ATRIUM_SANDBOX_WORKSPACE_DISK_BYTES=1073741824, to limit each to 1 GiB)")
	}
}

// shareDataDir lets the sandbox host uid pass through the data dir to what
// its sandboxes use below it (their workspaces, the agent programs, the
// agents' homes, the model gateway's socket): the data dir, which Atrium
// makes 0700, becomes searchable but not listable by others (0711), as its
// sandboxes dir is. What else is in it keeps its own mode (histories, NATS
// and the object store 0700, keys 0600); the agents' homes, which the host
// uid must pass through too, become 0711 likewise, so no one else can list
// the sessions there.
func shareDataDir(dataDir string, log *slog.Logger) error {
	for _, d := range []string{dataDir, filepath.Join(dataDir, agents.HomesName)} {
		fi, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) && d != dataDir {
			if err := os.Mkdir(d, 0o711); err != nil {
				return err
			}
			fi, err = os.Stat(d)
		}
		if err != nil {
			return err
		}
		m := fi.Mode().Perm()
		want := m&^0o066 | 0o011
		if d == dataDir {
			want = m | 0o011 // only adds: the operator may have opened it more
		}
		if want == m {
			continue
		}
		if err := os.Chmod(d, want); err != nil {
			return err
		}
		log.Debug("made a directory passable by the sandbox host uid", "dir", d, "mode", want)
	}
	return nil
}
