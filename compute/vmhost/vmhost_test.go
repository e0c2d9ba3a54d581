package vmhost_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/vmhost"
)

// imageVersion is the version the test image and servers agree on.
const imageVersion = "test"

// testImageState is the guest image, built once per test binary into a
// cache directory (rebuilt only when its inputs change).
var testImageState struct {
	once sync.Once
	dir  string
	err  error
}

// cacheDir is where the test image is kept: $ATRIUM_VM_CACHE, default
// /var/cache/atrium-vm.
func cacheDir() string {
	if d := os.Getenv("ATRIUM_VM_CACHE"); d != "" {
		return d
	}
	return "/var/cache/atrium-vm"
}

// testImage builds a static atrium from this repository and the guest
// image around it, and returns the image's directory.
func testImage(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath(vmhost.DefaultQEMU); err != nil {
		t.Fatal("QEMU is not installed: run .ci/deps")
	}
	testImageState.once.Do(func() {
		tmp, err := os.MkdirTemp("", "vmhost-test-bin-")
		if err != nil {
			testImageState.err = err
			return
		}
		defer os.RemoveAll(tmp)
		bin := filepath.Join(tmp, "atrium")
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/atriumhq/atrium/cmd/atrium")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			testImageState.err = fmt.Errorf("build a static atrium: %v: %s", err, out)
			return
		}
		dir := filepath.Join(cacheDir(), "test-image")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_, err = vmhost.Build(ctx, vmhost.BuildConfig{Dir: dir, Atrium: bin, Version: imageVersion, Progress: os.Stderr})
		testImageState.dir, testImageState.err = dir, err
	})
	if testImageState.err != nil {
		t.Fatalf("guest image: %v", testImageState.err)
	}
	return testImageState.dir
}

func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

const hostToken = "vmhost-test-token"

// newServer starts a VM host on loopback and stops its VMs when the test
// ends.
func newServer(t *testing.T, cfg vmhost.Config) (*vmhost.Server, string) {
	t.Helper()
	cfg.Dir = testImage(t)
	// Short: QMP's unix socket path must fit in 108 bytes.
	state, err := os.MkdirTemp("", "vmh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	cfg.StateDir = state
	cfg.Token = hostToken
	cfg.Version = imageVersion
	cfg.Logger = testLogger(t)
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	srv, err := vmhost.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
	})
	return srv, hs.URL
}

func TestContract(t *testing.T) {
	srv, url := newServer(t, vmhost.Config{MaxVMs: 2})
	t.Logf("accelerator: %s", srv.Accel())
	computetest.TestProvider(t, func(t *testing.T) compute.Provider {
		p, err := remote.New(remote.Config{
			Hook:         &remote.HTTPHook{URL: url, Header: http.Header{"Authorization": {"Bearer " + hostToken}}},
			StartTimeout: 90 * time.Second,
			Logger:       testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := p.Close(ctx); err != nil {
				t.Errorf("close provider: %v", err)
			}
			// One VM at a time: the provider leaves VMs it did not
			// destroy (a node that restarts cannot find them).
			for _, v := range srv.Status().VMs {
				srv.Destroy(v.ID)
			}
		})
		return p
	})
}

// call posts body to url+path with token and decodes the JSON answer.
func call(t *testing.T, url, path, token string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	raw, _ := io.ReadAll(resp.Body)
	json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// healthy tells whether the agent at addr answers within a second.
func healthy(addr string) bool {
	c := &http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestHostAPI drives the API by hand: authentication, capacity, the
// token's private channel, status, metrics, sleep and wake, destroy.
func TestHostAPI(t *testing.T) {
	srv, url := newServer(t, vmhost.Config{MaxVMs: 1, MemoryMiB: 384})

	if code, m := call(t, url, "/create", "wrong", remote.HookRequest{Session: "s1", SandboxID: "sb-a"}); code != http.StatusUnauthorized {
		t.Fatalf("create with a wrong token: %d %v, want 401", code, m)
	}
	if code, m := call(t, url, "/create", hostToken, remote.HookRequest{Session: "s1", SandboxID: "Bad ID"}); code != http.StatusBadRequest {
		t.Fatalf("create with a bad sandbox id: %d %v, want 400", code, m)
	}

	start := time.Now()
	code, m := call(t, url, "/create", hostToken, remote.HookRequest{Session: "s1", SandboxID: "sb-a"})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, m)
	}
	t.Logf("VM booted to a healthy agent in %v (%s)", time.Since(start).Round(time.Millisecond), srv.Accel())
	addr, token := m["addr"].(string), m["token"].(string)
	if m["id"] != "sb-a" || addr == "" || len(token) < 32 {
		t.Fatalf("create answered %v", m)
	}
	if !healthy(addr) {
		t.Fatal("the agent is not healthy after create")
	}
	// The same session gets the VM it has.
	if code, m2 := call(t, url, "/create", hostToken, remote.HookRequest{Session: "s1", SandboxID: "sb-b"}); code != http.StatusCreated || m2["id"] != "sb-a" {
		t.Fatalf("create again for the session: %d %v, want sb-a", code, m2)
	}
	// Beyond capacity: refused, clearly.
	code, m2 := call(t, url, "/create", hostToken, remote.HookRequest{Session: "s2", SandboxID: "sb-c"})
	if code != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(m2["error"]), "1 of 1 VMs") {
		t.Fatalf("create beyond capacity: %d %v, want 503 naming the capacity", code, m2)
	}

	// The token never reaches a command line.
	out, err := exec.Command("ps", "-eo", "args").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), token) {
		t.Fatal("the agent's token is on a command line")
	}
	if !strings.Contains(string(out), "microvm") {
		t.Fatal("no QEMU microVM process is running")
	}

	// The agent accepts the token it was given (and only it).
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/files/x", nil)
	req.Header.Set("Authorization", "Bearer wrong")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("agent with a wrong token: %v %v", resp, err)
	}

	st := srv.Status()
	if len(st.VMs) != 1 || st.VMs[0].State != "running" || st.VMs[0].RSSBytes == 0 {
		t.Fatalf("status: %+v", st)
	}
	t.Logf("host memory of the idle VM: %d MiB", st.VMs[0].RSSBytes>>20)
	if mt := get(t, url+"/metrics"); !strings.Contains(mt, `atrium_vmhost_vms{state="running"} 1`) {
		t.Fatalf("metrics:\n%s", mt)
	}

	// Sleep saves the VM to disk and stops it: the agent stops
	// answering; wake restores it, with the same agent process (its
	// uptime goes on: no reboot, no restart).
	up := agentUptime(t, addr)
	if code, m := call(t, url, "/sleep", hostToken, remote.HookRequest{SandboxID: "sb-a"}); code != http.StatusOK {
		t.Fatalf("sleep: %d %v", code, m)
	}
	if srv.Status().VMs[0].State != "sleeping" {
		t.Fatalf("status after sleep: %+v", srv.Status())
	}
	if healthy(addr) {
		t.Fatal("the agent answers while its VM sleeps")
	}
	wake := time.Now()
	if code, m := call(t, url, "/wake", hostToken, remote.HookRequest{SandboxID: "sb-a"}); code != http.StatusOK {
		t.Fatalf("wake: %d %v", code, m)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !healthy(addr) {
		if time.Now().After(deadline) {
			t.Fatal("the agent does not answer after wake")
		}
	}
	t.Logf("wake to a healthy agent: %v", time.Since(wake).Round(time.Millisecond))
	if up2 := agentUptime(t, addr); up2 < up {
		t.Fatalf("the agent's uptime went from %d ms before sleep to %d ms after wake: the process was not kept", up, up2)
	}
	if code, _ := call(t, url, "/sleep", hostToken, remote.HookRequest{SandboxID: "nope"}); code != http.StatusNotFound {
		t.Fatalf("sleep of an unknown VM: %d, want 404", code)
	}

	if code, m := call(t, url, "/destroy", hostToken, remote.HookRequest{SandboxID: "sb-a"}); code != http.StatusOK {
		t.Fatalf("destroy: %d %v", code, m)
	}
	if len(srv.Status().VMs) != 0 || healthy(addr) {
		t.Fatalf("after destroy: %+v", srv.Status())
	}
	if code, _ := call(t, url, "/destroy", hostToken, remote.HookRequest{SandboxID: "sb-a"}); code != http.StatusOK {
		t.Fatalf("destroy again: %d, want 200", code)
	}
}

// TestRefusedAtStart: no QEMU, no image, an image of another version.
func TestRefusedAtStart(t *testing.T) {
	img := testImage(t)
	for _, tc := range []struct {
		name string
		cfg  vmhost.Config
		want string
	}{
		{"NoQEMU", vmhost.Config{Dir: img, QEMU: "qemu-system-none"}, "apt-get install qemu-system-x86"},
		{"NoImage", vmhost.Config{Dir: t.TempDir()}, "atrium vmhost image build --dir"},
		{"OtherVersion", vmhost.Config{Dir: img, Version: "v0.0.1-other"}, "rebuild it with atrium vmhost image build"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Token = "x"
			tc.cfg.StateDir = t.TempDir()
			_, err := vmhost.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// agentUptime is the uptime the agent at addr reports.
func agentUptime(t *testing.T, addr string) int64 {
	t.Helper()
	var h struct {
		UptimeMs int64 `json:"uptime_ms"`
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+addr+"/healthz")), &h); err != nil {
		t.Fatal(err)
	}
	return h.UptimeMs
}
