package agents

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCatalog_Install installs the real claude-agent-acp with npm from the
// registry, then fails to install a version that does not exist, and
// checks that the failure left nothing behind.
func TestCatalog_Install(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatal("npm is not installed: run .ci/deps")
	}
	c := newCatalog(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	start := time.Now()
	in, err := c.Install(ctx, "claude", "", &progress)
	if err != nil {
		t.Fatalf("install claude: %v\n%s", err, progress.String())
	}
	size, _ := Size(in.Dir)
	t.Logf("installed claude %s in %v, %s", in.Version, time.Since(start).Round(time.Millisecond), FormatSize(size))
	if in.Version != "0.23.1" || !in.Current || !in.Pinned {
		t.Errorf("installed %+v", in)
	}
	if !strings.Contains(progress.String(), "installed claude 0.23.1") {
		t.Errorf("progress does not say it installed: %q", progress.String())
	}
	if got, err := c.Lookup("claude"); err != nil || got.Dir != in.Dir {
		t.Errorf("Lookup after install: %+v, %v", got, err)
	}
	// Installing again does nothing.
	progress.Reset()
	if _, err := c.Install(ctx, "claude", "", &progress); err != nil || !strings.Contains(progress.String(), "already installed") {
		t.Errorf("second install: %v, %q", err, progress.String())
	}

	progress.Reset()
	_, err = c.Install(ctx, "claude", "0.0.0-nosuch", &progress)
	if err == nil || !strings.Contains(err.Error(), "npm install @zed-industries/claude-agent-acp@0.0.0-nosuch failed") {
		t.Errorf("install of a missing version: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(c.cfg.Dir, "claude"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "0.23.1 current" {
		t.Errorf("after a failed install the agent's directory holds %q, want only the good version and its link", names)
	}
	if got, err := c.Lookup("claude"); err != nil || got.Version != "0.23.1" {
		t.Errorf("a failed install changed the current version: %+v, %v", got, err)
	}
}
