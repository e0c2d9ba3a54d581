package agents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/atriumhq/atrium/session"
)

// ErrNoNPM is returned by Install when npm cannot be found.
var ErrNoNPM = session.Errorf(session.CodeUnavailable,
	"npm is not installed: install Node.js and npm (on Debian and Ubuntu: apt-get install nodejs npm), then run the install again")

// staleInstall is how old a leftover temporary install directory (from a
// killed install) must be before an install removes it.
const staleInstall = time.Hour

// Install installs version of agent name ("" is the pinned version) with
// npm into Config.Dir/<name>/<version>, and makes it the version launches
// use. npm's progress and Install's own lines go to progress. The install
// is atomic: npm fills a temporary directory that is renamed into place
// only once the agent's executable is there, so a failed or cancelled
// install leaves nothing behind. An installed version is not installed
// again.
func (c *Catalog) Install(ctx context.Context, name, version string, progress io.Writer) (Installed, error) {
	if progress == nil {
		progress = io.Discard
	}
	s, err := c.Spec(name)
	if err != nil {
		return Installed{}, err
	}
	if version == "" {
		version = s.Version
	}
	if err := ValidVersion(version); err != nil {
		return Installed{}, session.Errorf(session.CodeBadRequest, "%s", err.Error())
	}
	agentDir := filepath.Join(c.cfg.Dir, name)
	dst := filepath.Join(agentDir, version)
	if c.complete(s, dst) {
		if err := setCurrent(agentDir, version); err != nil {
			return Installed{}, err
		}
		fmt.Fprintf(progress, "%s %s is already installed in %s\n", name, version, dst)
		return Installed{Spec: s, Name: name, Version: version, Dir: dst, Current: true, Pinned: version == s.Version}, nil
	}
	npm, err := exec.LookPath(c.cfg.NPM)
	if err != nil {
		return Installed{}, ErrNoNPM
	}
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", name, err)
	}
	removeStale(agentDir)
	tmp, err := os.MkdirTemp(agentDir, ".install-"+version+"-")
	if err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", name, err)
	}
	done := false
	defer func() {
		if !done {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", name, err)
	}
	pkg := s.Package + "@" + version
	fmt.Fprintf(progress, "installing %s: npm install %s ...\n", name, pkg)
	start := time.Now()
	cmd := exec.CommandContext(ctx, npm, "install", "--prefix", tmp, "--no-save", "--no-package-lock",
		"--no-audit", "--no-fund", "--no-update-notifier", "--loglevel", "warn", pkg)
	cmd.Stdout, cmd.Stderr = progress, progress
	cmd.Dir = tmp
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return Installed{}, fmt.Errorf("install %s: %w", name, ctx.Err())
		}
		return Installed{}, session.Errorf(session.CodeUnavailable,
			"install %s: npm install %s failed (%v): see npm's output above; check the version exists (npm view %s versions) and that the npm registry is reachable",
			name, pkg, err, s.Package)
	}
	if !c.complete(s, tmp) {
		return Installed{}, session.Errorf(session.CodeUnavailable,
			"install %s: npm installed %s but it has no executable %s: the agent's entry names the wrong bin for this version",
			name, pkg, c.bin(s))
	}
	if _, err := os.Lstat(dst); err == nil {
		if c.complete(s, dst) {
			// Another install of the same version finished first:
			// keep it (the deferred cleanup removes this one).
			fmt.Fprintf(progress, "%s %s was installed meanwhile in %s\n", name, version, dst)
			if err := setCurrent(agentDir, version); err != nil {
				return Installed{}, err
			}
			return Installed{Spec: s, Name: name, Version: version, Dir: dst, Current: true, Pinned: version == s.Version}, nil
		}
		// An incomplete directory not made by this code (which renames
		// only complete ones): replace it.
		if err := os.RemoveAll(dst); err != nil {
			return Installed{}, fmt.Errorf("install %s: %w", name, err)
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		if !c.complete(s, dst) {
			return Installed{}, fmt.Errorf("install %s: %w", name, err)
		}
		// Another install of the same version got there just before.
	} else {
		done = true
	}
	if err := setCurrent(agentDir, version); err != nil {
		return Installed{}, err
	}
	size, _ := Size(dst)
	fmt.Fprintf(progress, "installed %s %s in %s (%s, %.1fs)\n", name, version, dst, FormatSize(size), time.Since(start).Seconds())
	return Installed{Spec: s, Name: name, Version: version, Dir: dst, Current: true, Pinned: version == s.Version}, nil
}

// setCurrent points agentDir's current link at version, atomically.
func setCurrent(agentDir, version string) error {
	link := filepath.Join(agentDir, currentLink)
	if target, err := os.Readlink(link); err == nil && target == version {
		return nil
	}
	tmp := fmt.Sprintf("%s.tmp-%d-%d", link, os.Getpid(), time.Now().UnixNano())
	if err := os.Symlink(version, tmp); err != nil {
		return fmt.Errorf("select agent version: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("select agent version: %w", err)
	}
	return nil
}

// removeStale removes temporary install directories that a killed install
// left in agentDir.
func removeStale(agentDir string) {
	entries, err := os.ReadDir(agentDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".install-") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleInstall {
			_ = os.RemoveAll(filepath.Join(agentDir, e.Name()))
		}
	}
}

// Size returns the bytes of the regular files under dir, counting a file
// with several hard links once (npm packages link their platform binary).
func Size(dir string) (int64, error) {
	var n int64
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		n += fi.Size()
		return nil
	})
	return n, err
}

// FormatSize formats a byte count for people (85 MB).
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d MB", (n+(1<<19))>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KB", (n+(1<<9))>>10)
	}
	return fmt.Sprintf("%d B", n)
}
