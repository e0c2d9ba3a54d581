package local

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// testHostUID is an unprivileged host uid no account uses.
const testHostUID = 231072

// searchableDir returns a fresh directory that testHostUID can search, in a
// parent it can search too (t.TempDir's parents are 0700).
func searchableDir(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "atrium-hostuid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "sandboxes")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Issue 20 finding 8: with HostUID, the sandbox's user is an unprivileged
// uid on the host: a setuid file made in the sandbox is not root's, and no
// uid in the sandbox maps to host root.
func TestSandbox_HostUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	dir := searchableDir(t)
	id := session.NewID()
	// A workspace left by a node that ran sandboxes as root is given to
	// the host uid.
	ws := filepath.Join(dir, string(id), "workspace")
	if err := os.MkdirAll(filepath.Join(ws, "old"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "old", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newTestProvider(t, Config{Dir: dir, HostUID: testHostUID})
	sb := computetest.Open(t, p, compute.Spec{Session: id})
	got := computetest.ShOK(t, sb, "id -u; cp /bin/true suid && chmod 4755 suid && echo more >> old/f && cat /proc/self/uid_map")
	lines := strings.Fields(got)
	if len(lines) < 1 || lines[0] != "1000" {
		t.Fatalf("sandbox output %q", got)
	}
	for _, name := range []string{"suid", "old/f", "old", "."} {
		fi, err := os.Stat(filepath.Join(ws, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != testHostUID || st.Gid != testHostUID {
			t.Errorf("%s belongs to %d:%d on the host, want %d", name, st.Uid, st.Gid, testHostUID)
		}
		if name == "suid" && fi.Mode()&os.ModeSetuid == 0 {
			t.Errorf("suid mode %v: the test made no setuid file", fi.Mode())
		}
	}
	// Nothing in the sandbox is host root: becoming uid 0 there fails, and
	// a file of host root's stays out of reach.
	if r := computetest.Sh(t, sb, "su -c true root 2>/dev/null || setpriv --reuid=0 true 2>/dev/null && echo became-root; echo done"); strings.Contains(r.Stdout, "became-root") {
		t.Errorf("the sandbox user became root: %+v", r)
	}
}

func TestHostUID_Refusals(t *testing.T) {
	parent, err := os.MkdirTemp("", "atrium-hostuid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(parent) })
	// MkdirTemp makes 0700: the host uid cannot reach below it.
	_, err = New(Config{Dir: filepath.Join(parent, "sandboxes"), HostUID: testHostUID})
	if err == nil || !strings.Contains(err.Error(), "chmod o+x "+parent) {
		t.Fatalf("got %v", err)
	}
}

// TestSandbox_HostUIDModelGateway: a sandbox run as the host uid reaches the
// node's model gateway, whose socket is 0600 and the node's: the provider
// gives the socket to the host uid.
func TestSandbox_HostUIDModelGateway(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	dir := searchableDir(t)
	// The gateway's socket beside the sandboxes, as the node's is in its
	// data dir, and only the node's, as the node makes it.
	gw, up, sock := modelGatewayAt(t, filepath.Join(filepath.Dir(dir), "model.sock"))
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	up.SetDefault(modeltest.Text("hello host uid"))
	p := newTestProvider(t, Config{Dir: dir, HostUID: testHostUID})
	sb := computetest.Open(t, p, compute.Spec{Session: session.NewID(), ModelSocket: sock})
	tok := gw.Issue("s1", "")
	if err := gw.Activate(tok, 1, "ann"); err != nil {
		t.Fatal(err)
	}
	e := gw.Endpoints()
	env := []string{"ANTHROPIC_BASE_URL=" + e.Anthropic, "ANTHROPIC_API_KEY=" + tok}
	r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"bash", "-c", askModel}, Env: env}), "")
	if !strings.Contains(r.Stdout, "HTTP/1.1 200") || !strings.Contains(r.Stdout, "hello host uid") {
		t.Fatalf("answer %q (stderr %q)", r.Stdout, r.Stderr)
	}
}

// TestSandbox_HostUIDWritableMount: a writable mount the node made (an
// agent's home) is given to the host uid, so the sandbox can write it; a
// read-only one is left as it is.
func TestSandbox_HostUIDWritableMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	dir := searchableDir(t)
	home := filepath.Join(filepath.Dir(dir), "home")
	ro := filepath.Join(filepath.Dir(dir), "ro")
	for _, d := range []string{filepath.Join(home, ".config"), ro} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := newTestProvider(t, Config{Dir: dir, HostUID: testHostUID})
	sb := computetest.Open(t, p, compute.Spec{Session: session.NewID(), Mounts: []compute.Mount{
		{Host: home, Sandbox: "/home/agent"}, {Host: ro, Sandbox: "/opt/ro", ReadOnly: true}}})
	if got := computetest.ShOK(t, sb, "echo x > /home/agent/.config/f && cat /home/agent/.config/f"); got != "x\n" {
		t.Errorf("writing the agent's home: %q", got)
	}
	for d, want := range map[string]uint32{filepath.Join(home, ".config"): testHostUID, ro: 0} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != want {
			t.Errorf("%s belongs to %d, want %d", d, uid, want)
		}
	}
}
