package server

import (
	"log/slog"

	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/mount"
)

// resolveSandboxDefaults turns off, saying so, the local-sandbox protections
// that are on by default (HostUIDAuto, WorkspaceDiskAuto) but that this host
// cannot provide, and says which are on. A protection the operator asked for
// explicitly is left as it is: local.New fails with the reason.
func resolveSandboxDefaults(sb *Sandbox, dir string, unsafe bool, log *slog.Logger) {
	if unsafe {
		return // No sandbox at all: said loudly elsewhere.
	}
	if sb.HostUIDAuto && sb.HostUID > 0 {
		if err := local.CheckHostUID(sb.HostUID, dir); err != nil {
			log.Warn("sandbox host uid mapping OFF: this host cannot run sandboxes as an unprivileged uid, so files made "+
				"in a sandbox belong to atrium's own user on the host (root, if it runs as root); fix the reason or set "+
				"sandbox.host_uid: -1 to turn it off knowingly", "reason", err.Error())
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
		log.Info("sandbox workspaces have no disk quota: a turn can fill the node's disk (set sandbox.workspace_disk_bytes to limit it)")
	}
}
