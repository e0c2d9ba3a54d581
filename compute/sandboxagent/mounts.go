package sandboxagent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// maxMountFiles bounds the files the node may seed a mount with.
const maxMountFiles = 4 << 20

// makeMounts turns the node's mounts into directories of this VM: a VM
// directory as it is (it must exist), or the agent's own directory for the
// sandbox path, Dir/<session>.mounts/<hash>, with the node's files written
// into it.
func (s *Server) makeMounts(id session.ID, ms []compute.AgentMount) ([]compute.Mount, error) {
	var out []compute.Mount
	var total int
	for _, m := range ms {
		if !path.IsAbs(m.Sandbox) || path.Clean(m.Sandbox) != m.Sandbox || m.Sandbox == "/" {
			return nil, session.Errorf(session.CodeBadRequest, "mount: %q is not a clean absolute sandbox path", m.Sandbox)
		}
		if m.VM != "" {
			if fi, err := os.Stat(m.VM); err != nil || !fi.IsDir() {
				return nil, session.Errorf(session.CodeBadRequest,
					"mount %s: %s is not a directory of this VM (is the image built with --agents?)", m.Sandbox, m.VM)
			}
			out = append(out, compute.Mount{Host: m.VM, Sandbox: m.Sandbox, ReadOnly: m.ReadOnly})
			continue
		}
		dir := s.mountDir(id, m.Sandbox)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("mount %s: %w", m.Sandbox, err)
		}
		for name, b := range m.Files {
			total += len(b)
			if total > maxMountFiles {
				return nil, session.Errorf(session.CodePayloadTooLarge, "mount %s: more than %d bytes of files", m.Sandbox, maxMountFiles)
			}
			if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") {
				return nil, session.Errorf(session.CodeBadRequest, "mount %s: file %q is not a clean relative path", m.Sandbox, name)
			}
			p := filepath.Join(dir, filepath.FromSlash(name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, fmt.Errorf("mount %s: %w", m.Sandbox, err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				return nil, fmt.Errorf("mount %s: %w", m.Sandbox, err)
			}
		}
		out = append(out, compute.Mount{Host: dir, Sandbox: m.Sandbox, ReadOnly: m.ReadOnly})
	}
	return out, nil
}

// mountDir is the agent's own directory for session id's mount at the
// sandbox path sandboxPath.
func (s *Server) mountDir(id session.ID, sandboxPath string) string {
	sum := sha256.Sum256([]byte(sandboxPath))
	return filepath.Join(s.cfg.Dir, string(id)+".mounts", hex.EncodeToString(sum[:8]))
}

// keptMount returns the agent's own directory of the open sandbox's mount
// at sandboxPath (an agent's home), which the node saves and restores like
// the workspace (POST /v1/workspace/{scan,upload,restore}?mount=PATH). A path the sandbox was
// not opened with as such a mount is refused.
func (s *Server) keptMount(sandboxPath string) (string, error) {
	_, id, err := s.current()
	if err != nil {
		return "", err
	}
	if !path.IsAbs(sandboxPath) || path.Clean(sandboxPath) != sandboxPath || sandboxPath == "/" {
		return "", session.Errorf(session.CodeBadRequest, "mount %q is not a clean absolute sandbox path", sandboxPath)
	}
	dir := s.mountDir(id, sandboxPath)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", session.Errorf(session.CodeNotFound,
			"the sandbox has no mount at %s that this agent keeps: open the sandbox with it first", sandboxPath)
	}
	return dir, nil
}
