package vmhost_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/vmhost"
)

// agentsCache is where .ci/deps installs the pinned agents
// ($ATRIUM_AGENTS_CACHE, default /var/cache/atrium-agents).
func agentsCache() string {
	if d := os.Getenv("ATRIUM_AGENTS_CACHE"); d != "" {
		return d
	}
	return "/var/cache/atrium-agents"
}

// TestImageWithAgents builds the image with the installed agents (a tools
// disk with them and node) and checks that a VM's sandbox sees them: node
// runs, and each agent's program is at ToolsPath/NAME/VERSION.
func TestImageWithAgents(t *testing.T) {
	ents, err := os.ReadDir(agentsCache())
	if err != nil || len(ents) == 0 {
		msg := "SKIPPING: no agents installed in " + agentsCache() + " (run .ci/deps)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := buildTestImage(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cacheDir(), "test-image-agents")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	m, err := vmhost.Build(ctx, vmhost.BuildConfig{Dir: dir, Atrium: testImageState.bin, Version: imageVersion,
		Agents: agentsCache(), Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	if m.Node == "" || len(m.Agents) == 0 {
		t.Fatalf("manifest without node or agents: %+v", m)
	}
	srv, err := vmhost.New(vmhost.Config{Dir: dir, StateDir: stateDir(t), Token: hostToken, Version: imageVersion,
		MaxVMs: 1, NoSnapshots: true, StartTimeout: 90 * time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	p, err := remote.New(remote.Config{Hook: &inProcessHook{srv: srv}, StartTimeout: 2 * time.Minute, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	sb := computetest.Open(t, p, compute.Spec{})
	if out := strings.TrimSpace(computetest.ShOK(t, sb, "node --version")); out != m.Node {
		t.Errorf("node --version in the VM's sandbox: %q; want %q", out, m.Node)
	}
	for _, a := range m.Agents {
		if out := computetest.ShOK(t, sb, "ls "+vmhost.ToolsPath+"/"+a); !strings.Contains(out, "node_modules") && strings.TrimSpace(out) == "" {
			t.Errorf("agent %s in the VM: %q", a, out)
		}
	}
	r := computetest.Sh(t, sb, "touch "+vmhost.ToolsPath+"/x")
	if r.Exit.Code == 0 {
		t.Errorf("the tools disk is writable from a sandbox")
	}
}

// inProcessHook is the VM host's API without HTTP.
type inProcessHook struct{ srv *vmhost.Server }

func (h *inProcessHook) CreateVM(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	return h.srv.Create(ctx, req)
}

func (h *inProcessHook) DestroyVM(_ context.Context, req remote.HookRequest) error {
	h.srv.Destroy(req.SandboxID)
	return nil
}
