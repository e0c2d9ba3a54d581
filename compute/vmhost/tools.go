package vmhost

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// toolsInput is what the tools disk is made of: a node's agents install and
// a node binary.
type toolsInput struct {
	agentsDir   string
	node        string
	nodeVersion string
	agents      []string // NAME/VERSION
	bytes       int64    // of every file
	files       int
	key         string // hashes names, sizes, modes and times of every file, and node's content
}

// readTools checks the agents install and node, and sums them up.
func readTools(ctx context.Context, agentsDir, node string) (*toolsInput, error) {
	t := &toolsInput{agentsDir: agentsDir}
	if node == "" {
		p, err := exec.LookPath("node")
		if err != nil {
			return nil, fmt.Errorf("vmhost image: the agents need node, which is not installed: apt-get install nodejs, or give --node")
		}
		node = p
	}
	node, err := filepath.EvalSymlinks(node)
	if err != nil {
		return nil, fmt.Errorf("vmhost image: node: %w", err)
	}
	f, err := elf.Open(node)
	if err != nil {
		return nil, fmt.Errorf("vmhost image: node %s: %w", node, err)
	}
	f.Close()
	t.node = node
	out, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("vmhost image: %s --version: %w", node, err)
	}
	t.nodeVersion = strings.TrimSpace(string(out))
	nodeSum, err := fileSHA256(node)
	if err != nil {
		return nil, fmt.Errorf("vmhost image: node: %w", err)
	}
	names, err := os.ReadDir(agentsDir)
	if err != nil {
		return nil, fmt.Errorf("vmhost image: agents: %w", err)
	}
	for _, n := range names {
		if !n.IsDir() || n.Name() == "bin" || strings.HasPrefix(n.Name(), ".") {
			continue
		}
		vs, err := os.ReadDir(filepath.Join(agentsDir, n.Name()))
		if err != nil {
			return nil, fmt.Errorf("vmhost image: agents: %w", err)
		}
		for _, v := range vs {
			if v.IsDir() && !strings.HasPrefix(v.Name(), ".") {
				t.agents = append(t.agents, n.Name()+"/"+v.Name())
			}
		}
	}
	if len(t.agents) == 0 {
		return nil, fmt.Errorf("vmhost image: no agents installed in %s: run atrium agents install NAME", agentsDir)
	}
	slices.Sort(t.agents)
	h := sha256.New()
	fmt.Fprintf(h, "node %s\n", nodeSum)
	err = filepath.WalkDir(agentsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(agentsDir, p)
		fmt.Fprintf(h, "%s %o %d %d\n", rel, fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		if fi.Mode().IsRegular() {
			t.bytes += fi.Size()
			t.files++
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("vmhost image: agents: %w", err)
	}
	if fi, err := os.Stat(node); err == nil {
		t.bytes += fi.Size()
	}
	t.key = hex.EncodeToString(h.Sum(nil))
	return t, nil
}

// make writes the tools disk to path: an ext4 file system labelled
// toolsLabel holding the agents install at its root and node at bin/node,
// made by mkfs.ext4 -d (no mount, no root needed) and debugfs, with a fixed
// UUID and hash seed.
func (t *toolsInput) make(ctx context.Context, path string) error {
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("vmhost image: %s is not installed: apt-get install e2fsprogs", tool)
		}
	}
	// Room for the files, their blocks' slack and the file system's own.
	size := t.bytes + int64(t.files)*4096 + t.bytes/8 + 64<<20
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	const uuid = "5d1c6f5e-6a2b-4c7e-9f1e-a7c1d0a0b0c1"
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", toolsLabel, "-U", uuid,
		"-E", "hash_seed="+uuid+",root_owner=0:0", "-O", "^has_journal", "-m", "0",
		"-d", t.agentsDir, path, fmt.Sprintf("%dk", size>>10))
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("vmhost image: mkfs.ext4 -d %s: %w: %s", t.agentsDir, err, out)
	}
	script := fmt.Sprintf("mkdir bin\nwrite %s bin/node\nsif bin/node mode 0100755\n", t.node)
	cmd = exec.CommandContext(ctx, "debugfs", "-w", "-f", "-", path)
	cmd.Stdin = strings.NewReader(script)
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "rror") {
		return fmt.Errorf("vmhost image: debugfs (node into the tools disk): %v: %s", err, out)
	}
	return nil
}
