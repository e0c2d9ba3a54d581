package main

import (
	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

// sandboxDefaults applies sandbox.host_uid and sandbox.workspace_disk_bytes
// (hostUID, diskBytes): 0 turns the protection on where the host supports it
// (the server says at start-up what it could not turn on), -1 turns it off,
// any other value is used as given (and fails start-up if the host cannot).
func sandboxDefaults(sb *server.Sandbox, hostUID int, diskBytes int64) {
	switch hostUID {
	case 0:
		sb.HostUID, sb.HostUIDAuto = config.DefaultHostUID, true
	case -1:
		sb.HostUID = 0
	}
	switch diskBytes {
	case 0:
		sb.WorkspaceDiskBytes, sb.WorkspaceDiskAuto = config.DefaultWorkspaceDiskBytes, true
	case -1:
		sb.WorkspaceDiskBytes = 0
	}
}
