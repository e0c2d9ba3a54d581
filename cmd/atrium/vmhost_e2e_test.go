package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/vmhost"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// vmTurnWait bounds a turn whose sandbox is a QEMU VM under software
// emulation: the first one boots the VM host's snapshot template.
const vmTurnWait = 3 * time.Minute

// vmCacheDir is where the guest image is kept between runs:
// $ATRIUM_VM_CACHE, default /var/cache/atrium-vm (shared with the
// compute/vmhost tests: the same inputs give the same image).
func vmCacheDir() string {
	if d := os.Getenv("ATRIUM_VM_CACHE"); d != "" {
		return d
	}
	return "/var/cache/atrium-vm"
}

// lockVMTests holds, until the test ends, the lock every test binary
// running QEMU VMs takes (compute/vmhost's too): one VM test at a time on
// a shared machine.
func lockVMTests(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "atrium-vm-tests.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
}

// staticAtrium is a static atrium, built once per test binary.
var staticAtrium struct {
	once sync.Once
	bin  string
	err  error
}

// staticAtriumAndImage builds a static atrium and the guest image around
// it, and returns the binary and the image's directory.
func staticAtriumAndImage(t *testing.T) (string, string) {
	return staticAtriumAndImageWith(t, "")
}

// staticAtriumAndImageWith is staticAtriumAndImage with the agents install
// agentsDir on the image's tools disk ("" none).
func staticAtriumAndImageWith(t *testing.T, agentsDir string) (string, string) {
	t.Helper()
	if _, err := exec.LookPath(vmhost.DefaultQEMU); err != nil {
		t.Fatal("QEMU is not installed: run .ci/deps")
	}
	lockVMTests(t)
	staticAtrium.once.Do(func() {
		bin := atriumBinary(t) + "-static"
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticAtrium.err = fmt.Errorf("build a static atrium: %v: %s", err, out)
		}
		staticAtrium.bin = bin
	})
	if staticAtrium.err != nil {
		t.Fatal(staticAtrium.err)
	}
	bin := staticAtrium.bin
	dir := filepath.Join(vmCacheDir(), "test-image")
	if agentsDir != "" {
		dir += "-agents"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := vmhost.Build(ctx, vmhost.BuildConfig{Dir: dir, Atrium: bin, Version: "devel", Agents: agentsDir, Progress: os.Stderr}); err != nil {
		t.Fatalf("guest image: %v", err)
	}
	return bin, dir
}

// hostAddress returns an IPv4 address of this machine that is not
// loopback: VMs reach the object store there (a guest's 127.0.0.1 is its
// own).
func hostAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("this machine has no IPv4 address besides loopback for the VMs to reach the object store at")
	return ""
}

// vmHostProc is a running `atrium vmhost`.
type vmHostProc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

// startVMHost runs `atrium vmhost` on listen and waits until it answers.
func startVMHost(t *testing.T, bin, image, state, listen, tokenFile string, extra ...string) *vmHostProc {
	t.Helper()
	p := &vmHostProc{out: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"vmhost", "--listen", listen, "--token-file", tokenFile, "--dir", image,
		"--state-dir", state, "--max-vms", "2"}, extra...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("atrium vmhost output:\n%s", p.out)
		}
	})
	deadline := time.Now().Add(e2eWait)
	for {
		resp, err := http.Get("http://" + listen + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("atrium vmhost exited at start:\n%s", p.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("atrium vmhost not answering within %v:\n%s", e2eWait, p.out)
		}
		time.Sleep(50 * time.Millisecond) // Polling interval.
	}
}

// vmsOf returns the VMs the VM host at listen runs for session id.
func vmsOf(t *testing.T, listen, token string, id session.ID) []remote.VMInfo {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+listen+"/status", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("vmhost status: %v", err)
	}
	defer resp.Body.Close()
	var st remote.VMHostStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("vmhost status: %v", err)
	}
	var out []remote.VMInfo
	for _, v := range st.VMs {
		if v.Session == string(id) {
			out = append(out, v)
		}
	}
	return out
}

// TestDev_VMHostKill9 runs `atrium dev` with its sandboxes on a real `atrium
// vmhost` (QEMU microVMs) and its workspaces in S3 (versitygw): a session's
// turns run in a VM; after the node's kill -9 a new node continues in the
// same VM; after the VM host's kill -9 (its VMs die with it) and restart,
// the next turn gets a fresh VM with the workspace restored from S3.
func TestDev_VMHostKill9(t *testing.T) {
	bin, image := staticAtriumAndImage(t)
	dir := t.TempDir()
	s3 := blobtest.StartS3On(t, hostAddress(t))
	vmh, vh := newVMHost(t, bin, image, dir, "vmhost-e2e-", "--allow", s3.Endpoint)
	listen, token := vmh.listen, vmh.token
	cfg := writeConfig(t, vmh.config(s3, ""))
	data := filepath.Join(dir, "data")
	p := startDev(t, data, "--config", cfg)
	a := api{t: t, base: p.url, user: "ann"}
	s := a.create("in a VM")
	turn := func(a api, n int64, prompt string) string {
		t.Helper()
		a.prompt(s.ID, prompt)
		fin := waitTurnFor(a, s.ID, n, vmTurnWait)
		evs := a.events(s.ID)
		out := stdoutOf(evs, n)
		if fin.field("status") != string(session.TurnOK) {
			var why []string
			for _, ev := range evs {
				if ev.Kind == session.KindError || ev.Kind == session.KindSandbox || ev.Kind == session.KindOutput {
					why = append(why, string(ev.raw))
				}
			}
			t.Fatalf("turn %d: %s; stdout %q\n%s", n, fin.raw, out, strings.Join(why, "\n"))
		}
		return out
	}
	begin := time.Now()
	if out := turn(a, 1, "echo kept > note && uname -r && cat /proc/sys/kernel/random/boot_id"); !strings.Contains(out, "cloud") {
		t.Fatalf("turn 1 did not run in the VM's kernel (Debian's cloud kernel): %q", out)
	}
	t.Logf("turn 1 (VM host's template, then a clone) took %v", time.Since(begin).Round(time.Millisecond))
	vms := vmsOf(t, listen, token, s.ID)
	if len(vms) != 1 {
		t.Fatalf("VMs of the session after turn 1: %+v", vms)
	}
	first := vms[0].ID

	// The node dies; a new one on the same data dir continues in the same
	// VM (the VM host still runs it for the session).
	p.signal(syscall.SIGKILL)
	p.wait()
	p2 := startDev(t, data, "--config", cfg)
	a2 := api{t: t, base: p2.url, user: "ann"}
	begin = time.Now()
	if out := turn(a2, 2, "cat note"); out != "kept\n" {
		t.Fatalf("turn 2 on the new node: %q", out)
	}
	t.Logf("turn 2 after the node's kill -9 took %v", time.Since(begin).Round(time.Millisecond))
	if vms := vmsOf(t, listen, token, s.ID); len(vms) != 1 || vms[0].ID != first {
		t.Fatalf("after the node's kill -9 the session's VMs are %+v; want the same VM %s", vms, first)
	}

	// The VM host dies (its VMs with it) and comes back empty: the next
	// turn gets a fresh VM and the workspace saved in S3.
	vh.cmd.Process.Signal(syscall.SIGKILL)
	<-vh.exited
	vmh.start(t)
	begin = time.Now()
	if out := turn(a2, 3, "cat note"); out != "kept\n" {
		t.Fatalf("turn 3 after the VM host's kill -9: %q", out)
	}
	t.Logf("turn 3 after the VM host's kill -9 took %v", time.Since(begin).Round(time.Millisecond))
	vms = vmsOf(t, listen, token, s.ID)
	if len(vms) != 1 || vms[0].ID == first {
		t.Fatalf("after the VM host's kill -9 the session's VMs are %+v; want a fresh one", vms)
	}
}

// TestDev_VMHostClaude runs the real Claude Code as a session's agent in a
// VM: `atrium dev` with its sandboxes on `atrium vmhost`, the image built
// with the agents install (node and the agents on its tools disk), the
// model a scripted Anthropic API behind the node's model gateway (reached
// from the VM through the agent's model tunnel).
func TestDev_VMHostClaude(t *testing.T) {
	requireClaude(t)
	bin, image := staticAtriumAndImageWith(t, agentsCacheDir())
	up := modeltest.New(t)
	up.Match(modeltest.HasTools)
	dir := t.TempDir()
	s3 := blobtest.StartS3On(t, hostAddress(t))
	vmh, _ := newVMHost(t, bin, image, dir, "vmhost-claude-token-", "--memory", "1024", "--allow", s3.Endpoint)
	data := agentDataDir(t, dir)
	cfg := writeConfig(t, anthropicModels(t, up.URL, "sk-vm-upstream")+vmh.config(s3, ""))
	p := startDev(t, data, "--config", cfg)
	a := api{t: t, base: p.url, user: "ann"}
	var s session.Session
	a.must(http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": "claude in a VM", "agent": "claude"}, &s)
	up.Push(modeltest.Text("Hello from a VM."))
	begin := time.Now()
	a.prompt(s.ID, "Say hello.")
	fin := waitTurnFor(a, s.ID, 1, 8*time.Minute)
	if fin.field("status") != string(session.TurnOK) {
		var errs []string
		for _, ev := range a.events(s.ID) {
			if ev.Kind == session.KindError || ev.Kind == session.KindOutput {
				errs = append(errs, string(ev.raw))
			}
		}
		t.Fatalf("turn 1: %s\n%s", fin.raw, strings.Join(errs, "\n"))
	}
	t.Logf("claude's first turn in a VM (TCG) took %v", time.Since(begin).Round(time.Millisecond))
	var got string
	for _, ev := range a.events(s.ID) {
		if ev.Kind == session.KindAgentMessage {
			got += ev.field("text")
		}
	}
	if !strings.Contains(got, "Hello from a VM.") {
		t.Fatalf("agent messages %q", got)
	}
	for _, r := range up.Requests() {
		if got := r.Header.Get("X-Api-Key"); got != "sk-vm-upstream" {
			t.Errorf("upstream request %s carried key %q, want the configured key", r.Path, got)
		}
	}
}
