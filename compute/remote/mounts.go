package remote

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// maxMountFiles bounds the files of the node's mounts sent to a VM (an
// agent's home holds settings, not work).
const maxMountFiles = 4 << 20

// agentMounts turns the node's mounts into the VM's (see
// Config.AgentsDir).
func (p *Provider) agentMounts(ms []compute.Mount) ([]compute.AgentMount, error) {
	var out []compute.AgentMount
	for _, m := range ms {
		if p.cfg.AgentsDir != "" {
			if rel, err := filepath.Rel(p.cfg.AgentsDir, m.Host); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
				out = append(out, compute.AgentMount{Sandbox: m.Sandbox, ReadOnly: true,
					VM: path.Join(p.cfg.VMAgentsDir, filepath.ToSlash(rel))})
				continue
			}
		}
		files := map[string][]byte{}
		total := 0
		err := filepath.WalkDir(m.Host, func(fp string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(fp)
			if err != nil {
				return err
			}
			if total += len(b); total > maxMountFiles {
				return session.Errorf(session.CodePayloadTooLarge,
					"mount %s: %s holds more than %d bytes, too much to send to a VM", m.Sandbox, m.Host, maxMountFiles)
			}
			rel, _ := filepath.Rel(m.Host, fp)
			files[filepath.ToSlash(rel)] = b
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("mount %s: %w", m.Sandbox, err)
		}
		out = append(out, compute.AgentMount{Sandbox: m.Sandbox, ReadOnly: m.ReadOnly, Files: files})
	}
	return out, nil
}
