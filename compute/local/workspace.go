package local

import "github.com/atriumhq/atrium/compute/mount"

// Workspace returns the sandbox's /workspace as a mount.Workspace: the
// directory <Config.Dir>/<session>/workspace on this host, which a
// mount.Volume saves and restores directly. The caller sets the returned
// Dir's Blob to the Volume's store (a local workspace reaches the store
// itself, without presigned URLs).
//
// Restore it only while no command runs in the sandbox (between turns):
// each command binds the directory when it starts, so a command started
// after a Restore sees the restored tree, and one already running would
// keep the old one.
//
// With a host uid (Config.HostUID), what the Dir restores or writes is given
// to it, so the sandbox can change it.
func (s *Sandbox) Workspace() *mount.Dir {
	d := &mount.Dir{Path: s.m.workspace}
	if h := s.m.p.hostID; h != nil {
		d.Owner = h.uid
	}
	return d
}
