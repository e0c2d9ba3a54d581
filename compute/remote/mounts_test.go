package remote_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
)

// TestSandbox_Mounts: an agent's program (below Config.AgentsDir) is
// mounted from the VM's copy, read-only; its home becomes a directory the
// VM keeps, seeded with the node's files, where the agent's writes stay.
func TestSandbox_Mounts(t *testing.T) {
	root := t.TempDir()
	agentsDir := filepath.Join(root, "agents")
	prog := filepath.Join(agentsDir, "tool", "1.0")
	home := filepath.Join(root, "homes", "s1")
	for _, f := range []struct {
		path, body string
		mode       os.FileMode
	}{
		{filepath.Join(prog, "prog.sh"), "#!/bin/sh\necho prog ran\n", 0o755},
		{filepath.Join(home, "settings.json"), `{"mode":"auto"}`, 0o644},
		{filepath.Join(home, "sub", "x"), "y", 0o644},
	} {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.path, []byte(f.body), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	// The in-process "VM" is this host: its copy of the agents is the
	// node's.
	p := newProvider(t, newRecorder(t, newInProcessHook(t, false)), remote.Config{AgentsDir: agentsDir, VMAgentsDir: agentsDir})
	mounts := []compute.Mount{
		{Host: prog, Sandbox: "/opt/tool", ReadOnly: true},
		{Host: home, Sandbox: "/home/agent"},
	}
	sb := computetest.Open(t, p, compute.Spec{Mounts: mounts})
	if out := computetest.ShOK(t, sb, "/opt/tool/prog.sh"); out != "prog ran\n" {
		t.Errorf("the program: %q", out)
	}
	if out := computetest.ShOK(t, sb, "cat /home/agent/settings.json /home/agent/sub/x"); out != `{"mode":"auto"}y` {
		t.Errorf("the home's files: %q", out)
	}
	computetest.ShOK(t, sb, "echo t > /home/agent/transcript")
	if out := computetest.ShOK(t, sb, "cat /home/agent/transcript"); out != "t\n" {
		t.Errorf("a file the agent wrote in its home: %q", out)
	}
	if _, err := os.Stat(filepath.Join(home, "transcript")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent's write reached the node's home directory: %v", err)
	}
	if r := computetest.Sh(t, sb, "touch /opt/tool/x"); r.Exit.Code == 0 {
		t.Error("the program's mount is writable")
	}

	// A VM without the agent's program is refused with what to do.
	p2 := newProvider(t, newRecorder(t, newInProcessHook(t, false)), remote.Config{AgentsDir: agentsDir, VMAgentsDir: filepath.Join(root, "none")})
	_, err := p2.Open(t.Context(), compute.Spec{Session: session.NewID(), Mounts: mounts})
	if !errors.Is(err, session.ErrBadRequest) || !strings.Contains(err.Error(), "--agents") {
		t.Errorf("open without the program in the VM: %v; want bad request naming --agents", err)
	}
}
