package vmhost_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/vmhost"
)

// imageVersion is the version the test image and servers agree on: that
// of atrium built from source (sandboxagent.DefaultVersion), which the
// `atrium vmhost` of the network-namespace test reports too.
const imageVersion = "devel"

// testImageState is the guest image, built once per test binary into a
// cache directory (rebuilt only when its inputs change).
var testImageState struct {
	once sync.Once
	dir  string
	err  error
	// bin is the static atrium the image holds, which the tests also run
	// as `atrium vmhost`; binDir is removed by TestMain.
	bin, binDir string
}

// VMTestsLock is the file whose lock every test binary running QEMU VMs
// (this package's, cmd/atrium's VM end-to-end tests) holds while its VMs
// run: on a shared machine, one VM test at a time.
var vmTestsLock = filepath.Join(os.TempDir(), "atrium-vm-tests.lock")

func TestMain(m *testing.M) {
	// Every test here runs VMs (or is quick): hold the lock for the run.
	if f, err := os.OpenFile(vmTestsLock, os.O_CREATE|os.O_RDWR, 0o666); err == nil {
		syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		defer f.Close()
	}
	code := m.Run()
	if testImageState.binDir != "" {
		os.RemoveAll(testImageState.binDir)
	}
	os.Exit(code)
}

// cacheDir is where the test image is kept: $ATRIUM_VM_CACHE, default
// /var/cache/atrium-vm.
func cacheDir() string {
	if d := os.Getenv("ATRIUM_VM_CACHE"); d != "" {
		return d
	}
	return "/var/cache/atrium-vm"
}

// testImage returns the guest image's directory (see buildTestImage).
func testImage(t *testing.T) string {
	t.Helper()
	dir, err := buildTestImage()
	if err != nil {
		t.Fatalf("guest image: %v", err)
	}
	return dir
}

// buildTestImage builds, once per test binary, a static atrium from this
// repository and the guest image around it, in the cache directory.
func buildTestImage() (string, error) {
	if _, err := exec.LookPath(vmhost.DefaultQEMU); err != nil {
		return "", errors.New("QEMU is not installed: run .ci/deps")
	}
	testImageState.once.Do(func() {
		tmp, err := os.MkdirTemp("", "vmhost-test-bin-")
		if err != nil {
			testImageState.err = err
			return
		}
		testImageState.binDir = tmp
		bin := filepath.Join(tmp, "atrium")
		testImageState.bin = bin
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
	return testImageState.dir, testImageState.err
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
	if cfg.Atrium == "" {
		cfg.Atrium = testImageState.bin // the relay to the outbound proxy
	}
	if cfg.StateDir == "" {
		cfg.StateDir = stateDir(t)
	}
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

// TestContract runs the compute contract suite against `atrium vmhost`
// running in a network namespace of its own: a second host on a veth
// link, reached by the node (this test) over that link only.
// stateDir is a VM state directory, short: QMP's unix socket path must
// fit in 108 bytes.
func stateDir(t *testing.T) string {
	state, err := os.MkdirTemp("", "vmh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	return state
}

func TestContract(t *testing.T) {
	url := netnsVMHost(t)
	computetest.TestProvider(t, func(t *testing.T) compute.Provider {
		hook := &remote.HTTPHook{URL: url, Header: http.Header{"Authorization": {"Bearer " + hostToken}}}
		p, err := remote.New(remote.Config{Hook: hook, StartTimeout: 90 * time.Second, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := p.Close(ctx); err != nil {
				t.Errorf("close provider: %v", err)
			}
			// One VM at a time: the provider leaves the VMs it did not
			// destroy (a node that restarts cannot find them).
			for _, v := range hostStatus(t, url).VMs {
				if err := hook.DestroyVM(ctx, remote.HookRequest{SandboxID: v.ID}); err != nil {
					t.Errorf("destroy %s: %v", v.ID, err)
				}
			}
		})
		return p
	})
}

// hostStatus is GET /status of the VM host at url.
func hostStatus(t *testing.T, url string) vmhost.Status {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/status", nil)
	req.Header.Set("Authorization", "Bearer "+hostToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st vmhost.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// netnsVMHost starts `atrium vmhost` in a network namespace joined to this
// host by a veth pair with a /30 of its own, and returns its API's URL.
func netnsVMHost(t *testing.T) string {
	t.Helper()
	img := testImage(t)
	if os.Geteuid() != 0 {
		t.Fatal("the VM host test makes a network namespace (ip netns) and needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("iproute2 (ip) is not installed: run .ci/deps")
	}
	n := os.Getpid() % 250
	ns := fmt.Sprintf("atvmh%d", os.Getpid())
	veth, peer := fmt.Sprintf("vmh%dh", os.Getpid()%100000), fmt.Sprintf("vmh%dn", os.Getpid()%100000)
	hostIP, nsIP := fmt.Sprintf("10.231.%d.1", n), fmt.Sprintf("10.231.%d.2", n)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", ns)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", ns).Run()
		exec.Command("ip", "link", "del", veth).Run()
	})
	run("link", "add", veth, "type", "veth", "peer", "name", peer)
	run("link", "set", peer, "netns", ns)
	run("addr", "add", hostIP+"/30", "dev", veth)
	run("link", "set", veth, "up")
	run("-n", ns, "addr", "add", nsIP+"/30", "dev", peer)
	run("-n", ns, "link", "set", peer, "up")
	run("-n", ns, "link", "set", "lo", "up")

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(hostToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state, err := os.MkdirTemp("", "vmh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	listen := nsIP + ":7000"
	cmd := exec.Command("ip", "netns", "exec", ns, testImageState.bin, "vmhost", "--listen", listen,
		"--token-file", tokenFile, "--dir", img, "--state-dir", state, "--max-vms", "2")
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Error("atrium vmhost did not stop within 30s of SIGTERM")
		}
	})
	url := "http://" + listen
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := (&http.Client{Timeout: time.Second}).Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-exited:
			t.Fatal("atrium vmhost exited at start")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("atrium vmhost does not answer at %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := hostStatus(t, url); st.Accel == "" {
		t.Fatalf("status: %+v", st)
	} else {
		t.Logf("VM host in network namespace %s at %s, accelerator %s", ns, url, st.Accel)
	}
	return url
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
	state := stateDir(t)
	srv, url := newServer(t, vmhost.Config{MaxVMs: 1, MemoryMiB: 384, StateDir: state})

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
	// Saving fails as on a full disk: the VM keeps running, the error is
	// said.
	if err := os.Symlink("/dev/full", filepath.Join(state, "sb-a", "sleep.mem")); err != nil {
		t.Fatal(err)
	}
	code, m = call(t, url, "/sleep", hostToken, remote.HookRequest{SandboxID: "sb-a"})
	if code != http.StatusInternalServerError || !strings.Contains(fmt.Sprint(m["error"]), "keeps running") {
		t.Fatalf("sleep onto a full disk: %d %v, want 500 saying the VM keeps running", code, m)
	}
	if st := srv.Status(); st.VMs[0].State != "running" || !healthy(addr) {
		t.Fatalf("after a failed sleep: %+v, healthy %v", st, healthy(addr))
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

// TestNeverHealthy: a guest whose agent does not answer within the start
// timeout is destroyed, and create fails within that timeout.
func TestNeverHealthy(t *testing.T) {
	srv, url := newServer(t, vmhost.Config{NoSnapshots: true, StartTimeout: 1500 * time.Millisecond})
	start := time.Now()
	code, m := call(t, url, "/create", hostToken, remote.HookRequest{Session: "s1", SandboxID: "sb-slow"})
	took := time.Since(start)
	if code != http.StatusInternalServerError || !strings.Contains(fmt.Sprint(m["error"]), "did not become healthy") {
		t.Fatalf("create: %d %v, want 500 saying the agent did not become healthy", code, m)
	}
	if took > 10*time.Second {
		t.Fatalf("create failed after %v, want about the 1.5s start timeout", took)
	}
	if st := srv.Status(); len(st.VMs) != 0 {
		t.Fatalf("the VM is still there: %+v", st)
	}
	out, _ := exec.Command("ps", "-eo", "args").Output()
	if strings.Contains(string(out), "sb-slow") {
		t.Fatal("its QEMU still runs")
	}
}

// guestUptime is the guest kernel's uptime in seconds.
func guestUptime(t *testing.T, sb compute.Sandbox) float64 {
	t.Helper()
	out := computetest.ShOK(t, sb, "cut -d' ' -f1 /proc/uptime")
	var up float64
	if _, err := fmt.Sscan(strings.TrimSpace(out), &up); err != nil {
		t.Fatalf("/proc/uptime: %q", out)
	}
	return up
}
