package remote_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http/httptest"
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

	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/sandboxagent"
)

// agentEnv makes the test binary run as a sandbox agent: the provisioning
// hook of the tests starts it that way inside network namespaces, with the
// flags of `atrium sandbox-agent`.
const agentEnv = "ATRIUM_TEST_AGENT"

// agentHeartbeatEnv sets the agent's heartbeat (a Go duration).
const agentHeartbeatEnv = "ATRIUM_TEST_AGENT_HEARTBEAT"

// hookState is the state directory of the netns hook, shared by the whole
// test binary so that its address allocation never repeats.
var hookState struct {
	once sync.Once
	dir  string
	err  error
	// prefix and tag keep concurrent test binaries apart.
	prefix, tag string
}

func TestMain(m *testing.M) {
	if egress.IsForwarder(os.Args) {
		// Sandboxes with a model gateway reach it through this binary.
		syscall.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
	}
	if os.Getenv(agentEnv) != "" {
		os.Exit(agentMain(os.Args[1:]))
	}
	code := m.Run()
	if hookState.dir != "" {
		os.RemoveAll(hookState.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// agentMain is `atrium sandbox-agent` for the tests.
func agentMain(args []string) int {
	fs := flag.NewFlagSet("sandbox-agent", flag.ContinueOnError)
	listen := fs.String("listen", "", "")
	dir := fs.String("dir", "", "")
	unsafe := fs.Bool("unsafe-no-sandbox", false, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fail := func(err error) int {
		log.Error("test agent", "err", err)
		return 1
	}
	lp, err := local.New(local.Config{Dir: *dir, Unsafe: *unsafe, Logger: log})
	if err != nil {
		return fail(err)
	}
	hb, _ := time.ParseDuration(os.Getenv(agentHeartbeatEnv))
	srv, err := sandboxagent.New(sandboxagent.Config{
		Token: os.Getenv("ATRIUM_AGENT_TOKEN"), Provider: lp, Dir: *dir,
		Version: "test", Heartbeat: hb, Logger: log,
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

// testLogger logs to the test's output.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// requireNetns fails the test unless this host can make network
// namespaces.
func requireNetns(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Fatal("iproute2 (ip) is not installed: run .ci/deps")
	}
	if _, err := exec.LookPath("flock"); err != nil {
		tb.Fatal("flock is not installed: install util-linux")
	}
	if os.Geteuid() != 0 {
		tb.Fatal("the remote sandbox tests make network namespaces (ip netns) and need root")
	}
}

// requireBwrap fails the test unless bubblewrap is installed.
func requireBwrap(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		tb.Fatal("bubblewrap (bwrap) is not installed: run .ci/deps")
	}
}

// hookDir returns the netns hook's shared state directory.
func hookDir(tb testing.TB) string {
	tb.Helper()
	hookState.once.Do(func() {
		hookState.dir, hookState.err = os.MkdirTemp("", "atrium-netns-hook-")
		n, _ := rand.Int(rand.Reader, big.NewInt(150))
		hookState.prefix = "10." + strconv.FormatInt(100+n.Int64(), 10)
		b := make([]byte, 2)
		_, _ = rand.Read(b)
		hookState.tag = "a" + hex.EncodeToString(b)
	})
	if hookState.err != nil {
		tb.Fatalf("hook state dir: %v", hookState.err)
	}
	return hookState.dir
}

// vmRecord is a VM a test hook created.
type vmRecord struct {
	req       remote.HookRequest
	vm        remote.VM
	destroyed bool
}

// recorder is a Hook that records the VMs of another and destroys those
// left over when the test ends.
type recorder struct {
	hook remote.Hook

	mu  sync.Mutex
	vms []*vmRecord // guarded by mu
}

// newRecorder wraps h; when the test ends (after the provider's cleanup,
// so register this first) it destroys the VMs h created and did not
// destroy, and shows the agents' logs if the test failed.
func newRecorder(tb testing.TB, h remote.Hook) *recorder {
	r := &recorder{hook: h}
	tb.Cleanup(func() {
		r.mu.Lock()
		vms := append([]*vmRecord(nil), r.vms...)
		r.mu.Unlock()
		for _, v := range vms {
			if hookState.dir != "" {
				// The agents run in processes of their own: their data
				// races show only in their logs.
				b, err := os.ReadFile(filepath.Join(hookState.dir, v.vm.ID+".log"))
				if err == nil && strings.Contains(string(b), "DATA RACE") {
					tb.Errorf("the agent of %s reported a data race", v.vm.ID)
				}
				if err == nil && tb.Failed() {
					tb.Logf("log of the agent of %s:\n%s", v.vm.ID, b)
				}
			}
			if !v.destroyed {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				req := v.req
				req.SandboxID = v.vm.ID
				if err := h.DestroyVM(ctx, req); err != nil {
					tb.Errorf("destroy VM %s left by the test: %v", v.vm.ID, err)
				}
				cancel()
			}
		}
	})
	return r
}

func (r *recorder) CreateVM(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	vm, err := r.hook.CreateVM(ctx, req)
	if err == nil {
		if vm.ID == "" {
			vm.ID = req.SandboxID
		}
		r.mu.Lock()
		r.vms = append(r.vms, &vmRecord{req: req, vm: vm})
		r.mu.Unlock()
	}
	return vm, err
}

func (r *recorder) DestroyVM(ctx context.Context, req remote.HookRequest) error {
	err := r.hook.DestroyVM(ctx, req)
	if err == nil {
		r.mu.Lock()
		for _, v := range r.vms {
			if v.vm.ID == req.SandboxID {
				v.destroyed = true
			}
		}
		r.mu.Unlock()
	}
	return err
}

// created returns the VMs created so far.
func (r *recorder) created() []vmRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []vmRecord
	for _, v := range r.vms {
		out = append(out, *v)
	}
	return out
}

// isDestroyed reports whether VM id was destroyed.
func (r *recorder) isDestroyed(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.vms {
		if v.vm.ID == id {
			return v.destroyed
		}
	}
	return false
}

// scriptHook returns the CommandHook running testdata/netns-hook.sh, whose
// VMs are network namespaces running this test binary as the agent with
// agentArgs.
func scriptHook(tb testing.TB, agentArgs ...string) *remote.CommandHook {
	tb.Helper()
	requireNetns(tb)
	state := hookDir(tb)
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	script, err := filepath.Abs("testdata/netns-hook.sh")
	if err != nil {
		tb.Fatal(err)
	}
	return &remote.CommandHook{
		Create:  []string{script, "create"},
		Destroy: []string{script, "destroy"},
		Env: []string{
			"NETNS_HOOK_STATE=" + state,
			"NETNS_HOOK_PREFIX=" + hookState.prefix,
			"NETNS_HOOK_TAG=" + hookState.tag,
			// The race detector sleeps a second at exit unless told not to.
			"NETNS_HOOK_AGENT=env " + agentEnv + "=1 GORACE=atexit_sleep_ms=0 " + exe,
			"NETNS_HOOK_ARGS=" + strings.Join(agentArgs, " "),
			"NETNS_HOOK_KEEP_LOGS=1",
		},
		Logger: testLogger(tb),
	}
}

// newNetnsHook returns a recorded script hook; see scriptHook.
func newNetnsHook(tb testing.TB, agentArgs ...string) *recorder {
	return newRecorder(tb, scriptHook(tb, agentArgs...))
}

// inProcessHook runs each "VM" as a sandbox agent in this process, served on
// loopback, with a local provider of its own.
type inProcessHook struct {
	tb     testing.TB
	unsafe bool
	// egressDial is the agents' local.Config.EgressDial; nil: the default.
	egressDial func(ctx context.Context, network, address string) (net.Conn, error)

	mu   sync.Mutex
	vms  map[string]*inProcessVM // guarded by mu
	next int                     // guarded by mu
}

type inProcessVM struct {
	srv   *httptest.Server
	agent *sandboxagent.Server
	local *local.Provider
}

// newInProcessHook returns an in-process hook whose VMs are stopped when
// the test ends.
func newInProcessHook(tb testing.TB, unsafe bool) *inProcessHook {
	if !unsafe {
		requireBwrap(tb)
	}
	h := &inProcessHook{tb: tb, unsafe: unsafe, vms: make(map[string]*inProcessVM)}
	tb.Cleanup(func() {
		h.mu.Lock()
		ids := make([]string, 0, len(h.vms))
		for id := range h.vms {
			ids = append(ids, id)
		}
		h.mu.Unlock()
		for _, id := range ids {
			_ = h.DestroyVM(context.Background(), remote.HookRequest{SandboxID: id})
		}
	})
	return h
}

func (h *inProcessHook) CreateVM(_ context.Context, req remote.HookRequest) (remote.VM, error) {
	dir := h.tb.TempDir()
	log := testLogger(h.tb).With("vm", req.SandboxID)
	lp, err := local.New(local.Config{Dir: dir, Unsafe: h.unsafe, EgressDial: h.egressDial, Logger: log})
	if err != nil {
		return remote.VM{}, err
	}
	token := rand.Text()
	agent, err := sandboxagent.New(sandboxagent.Config{Token: token, Provider: lp, Dir: dir, Logger: log})
	if err != nil {
		return remote.VM{}, err
	}
	srv := httptest.NewServer(agent)
	h.mu.Lock()
	h.vms[req.SandboxID] = &inProcessVM{srv: srv, agent: agent, local: lp}
	h.mu.Unlock()
	return remote.VM{ID: req.SandboxID, Addr: srv.URL, Token: token}, nil
}

func (h *inProcessHook) DestroyVM(ctx context.Context, req remote.HookRequest) error {
	h.mu.Lock()
	vm := h.vms[req.SandboxID]
	delete(h.vms, req.SandboxID)
	h.mu.Unlock()
	if vm == nil {
		return nil
	}
	vm.srv.CloseClientConnections()
	vm.srv.Close()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := vm.agent.Close(ctx); err != nil {
		return err
	}
	return vm.local.Close(ctx)
}

// agentOf returns the in-process agent of VM id.
func (h *inProcessHook) agentOf(id string) *inProcessVM {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.vms[id]
}

// newProvider returns a provider with hook, closed when the test ends.
func newProvider(tb testing.TB, hook remote.Hook, cfg remote.Config) *remote.Provider {
	tb.Helper()
	cfg.Hook = hook
	if cfg.Logger == nil {
		cfg.Logger = testLogger(tb)
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	p, err := remote.New(cfg)
	if err != nil {
		tb.Fatalf("new provider: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			tb.Errorf("close provider: %v", err)
		}
	})
	return p
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(delay)
	}
}

// discard is a logger that drops everything.
func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
