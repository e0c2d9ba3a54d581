package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/sandboxagent"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// agentEnv makes the test binary run as a sandbox agent (see TestMain).
const agentEnv = "ATRIUM_SERVER_TEST_AGENT"

// agentMain is `atrium sandbox-agent` for the netns hook's VMs.
func agentMain(args []string) int {
	fs := flag.NewFlagSet("sandbox-agent", flag.ContinueOnError)
	listen := fs.String("listen", "", "")
	dir := fs.String("dir", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fail := func(err error) int {
		log.Error("test agent", "err", err)
		return 1
	}
	lp, err := local.New(local.Config{Dir: *dir, Logger: log})
	if err != nil {
		return fail(err)
	}
	srv, err := sandboxagent.New(sandboxagent.Config{
		Token: os.Getenv("ATRIUM_AGENT_TOKEN"), Provider: lp, Dir: *dir, Version: "test", Logger: log,
	})
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = srv.Serve(ctx, ln)
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cerr := lp.Close(cctx); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// netns is the state of the netns hook, shared by the test binary so that
// its address allocation never repeats.
var netns struct {
	once        sync.Once
	dir         string
	err         error
	prefix, tag string // keep concurrent test binaries apart
}

// cleanupNetns removes the hook's state directory and exits (goleak's
// cleanup of TestMain).
func cleanupNetns(code int) {
	if netns.dir != "" {
		os.RemoveAll(netns.dir)
	}
	os.Exit(code)
}

// netnsHook returns the provisioning hook of compute/remote's tests, whose
// VMs are network namespaces of this host running this test binary as the
// agent and reaching the object store at storeIP only. Every VM it creates
// is destroyed when the test ends.
func netnsHook(t *testing.T, storeIP string) *vmRecorder {
	t.Helper()
	netnsState(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("../../../../compute/remote/testdata/netns-hook.sh")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("the netns provisioning hook of compute/remote's tests: %v", err)
	}
	h := &remote.CommandHook{
		Create:  []string{script, "create"},
		Destroy: []string{script, "destroy"},
		Env: []string{
			"NETNS_HOOK_STATE=" + netns.dir,
			"NETNS_HOOK_PREFIX=" + netns.prefix,
			"NETNS_HOOK_TAG=" + netns.tag,
			"NETNS_HOOK_AGENT=env " + agentEnv + "=1 GORACE=atexit_sleep_ms=0 " + exe,
			"NETNS_HOOK_ROUTES=" + storeIP + "/32",
		},
		Logger: slog.New(slog.NewTextHandler(&testWriter{t: t}, nil)),
	}
	r := &vmRecorder{Hook: h}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, req := range r.live {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := h.DestroyVM(ctx, req); err != nil {
				t.Errorf("destroy VM %s left by the test: %v", req.SandboxID, err)
			}
			cancel()
		}
	})
	return r
}

// vmRecorder is a hook that remembers the VMs alive, so the test destroys
// those a stopped node left behind (the remote provider does not destroy
// VMs when it closes).
type vmRecorder struct {
	remote.Hook

	mu      sync.Mutex
	live    map[string]remote.HookRequest // guarded by mu
	created int                           // guarded by mu
}

func (r *vmRecorder) CreateVM(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	vm, err := r.Hook.CreateVM(ctx, req)
	if err == nil {
		r.mu.Lock()
		if r.live == nil {
			r.live = map[string]remote.HookRequest{}
		}
		req.SandboxID = vm.ID
		r.live[vm.ID] = req
		r.created++
		r.mu.Unlock()
	}
	return vm, err
}

func (r *vmRecorder) DestroyVM(ctx context.Context, req remote.HookRequest) error {
	err := r.Hook.DestroyVM(ctx, req)
	if err == nil {
		r.mu.Lock()
		delete(r.live, req.SandboxID)
		r.mu.Unlock()
	}
	return err
}

// netnsState sets up the hook's state once per test binary.
func netnsState(t *testing.T) {
	t.Helper()
	netns.once.Do(func() {
		netns.dir, netns.err = os.MkdirTemp("", "atrium-server-netns-")
		n, _ := rand.Int(rand.Reader, big.NewInt(150))
		netns.prefix = "10." + strconv.FormatInt(100+n.Int64(), 10)
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		netns.tag = "s" + hex.EncodeToString(b)
	})
	if netns.err != nil {
		t.Fatalf("hook state dir: %v", netns.err)
	}
}

// storeIP gives this host an address the netns VMs can reach and returns
// it.
func storeIP(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"ip", "flock", "bwrap"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run .ci/deps", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("the remote sandbox test makes network namespaces (ip netns) and needs root")
	}
	netnsState(t)
	addr := netns.prefix + ".255.1"
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add %s dev lo: %v: %s", addr, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").Run() })
	return addr
}

// TestServer_RemoteNodeLoss: a session runs on a remote sandbox (an agent
// in a network namespace, moving its workspace to and from S3 through
// presigned URLs); the node stops and a new one starts on the same history
// and store: the next turn gets a new VM with the workspace restored.
func TestServer_RemoteNodeLoss(t *testing.T) {
	t.Parallel()
	ip := storeIP(t)
	s3 := blobtest.StartS3On(t, ip)
	hook := netnsHook(t, ip)
	data := t.TempDir()
	mod := func(c *server.Config) {
		c.DataDir = data
		c.Storage = server.Storage{Type: server.StorageS3, S3: s3.Config("")}
		c.Sandbox = server.Sandbox{Provider: server.ProviderRemote, Hook: hook}
	}
	s := startStack(t, mod)
	alice := s.as("alice")
	sess := alice.create("remote", nil)
	alice.prompt(sess.ID, "mkdir -p src && echo 'package main' > src/main.go && echo done")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn 1 %+v: %s", fin, outputOf(alice.events(sess.ID, 0), 1, "stderr"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := s.srv.Close(ctx); err != nil {
		t.Fatalf("stop the first node: %v", err)
	}

	s = startStack(t, mod)
	alice = s.as("alice")
	last := alice.page(sess.ID, 0, 0).LastSeq
	alice.prompt(sess.ID, "cat src/main.go")
	if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
		t.Fatalf("turn 2 on the new node %+v", fin)
	}
	evs := alice.events(sess.ID, last)
	if out := outputOf(evs, 2, "stdout"); out != "package main\n" {
		t.Errorf("the workspace on the new node's VM: %q", out)
	}
	var states []string
	for _, ev := range evs {
		if ev.Kind == session.KindSandbox {
			var d session.SandboxData
			ev.decode(t, &d)
			states = append(states, string(d.State))
		}
	}
	if got := strings.Join(states, ","); got != "provisioning,restoring,ready" {
		t.Errorf("sandbox events on the new node: %s", got)
	}
	hook.mu.Lock()
	created := hook.created
	hook.mu.Unlock()
	if created != 2 {
		t.Errorf("VMs created: %d, want one per node", created)
	}
}
