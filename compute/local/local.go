package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// Defaults of Config.
const (
	// DefaultMemoryBytes is a sandbox's memory limit when neither the
	// Spec nor the Config sets one.
	DefaultMemoryBytes int64 = 2 << 30
	// DefaultPids is a sandbox's limit on processes and threads.
	DefaultPids = 512
	// DefaultCgroupParent is the parent of the sandboxes' cgroups on
	// cgroup v2, from the root of the hierarchy.
	DefaultCgroupParent = "/atrium"
)

// ErrNoBubblewrap is returned by Open when bubblewrap is not installed and
// Config.Unsafe is not set. It matches session.ErrUnavailable.
var ErrNoBubblewrap = session.Errorf(session.CodeUnavailable,
	"bubblewrap (bwrap) is not installed: install it with `apt-get install bubblewrap`, "+
		"or start atrium with --unsafe-no-sandbox to run harnesses without isolation")

// stateDirName is the directory in Config.Dir holding the provider's own
// files. Session IDs cannot start with a dot, so it never clashes with one.
const stateDirName = ".sandbox"

// Config configures a Provider.
type Config struct {
	// Dir is the root of the sandboxes' state on the host:
	// <Dir>/<session>/workspace is bound at /workspace. Required.
	Dir string
	// Bwrap is the path of bubblewrap; default "bwrap" looked up in PATH.
	Bwrap string
	// Unsafe runs commands directly on the host, without bubblewrap
	// (--unsafe-no-sandbox). See the package documentation.
	Unsafe bool
	// MemoryBytes and Pids are the default limits of a sandbox, used when
	// its compute.Spec leaves them zero; defaults DefaultMemoryBytes and
	// DefaultPids.
	MemoryBytes int64
	Pids        int
	// CgroupParent is the cgroup under which the per-sandbox cgroups are
	// made, as a path from the root of the cgroup hierarchy. Default: on
	// cgroup v1, "atrium" inside the cgroup this process runs in, so
	// sandboxes count against any limit on atrium itself; on cgroup v2,
	// DefaultCgroupParent (v2 forbids controllers below a cgroup that holds
	// processes, such as atrium's own).
	CgroupParent string
	// Logger receives the provider's logs; default slog.Default().
	Logger *slog.Logger
}

// Provider runs sandboxes on this host. It implements compute.Provider.
// Its methods are safe for concurrent use.
type Provider struct {
	cfg      Config
	log      *slog.Logger
	stateDir string
	bwrap    string  // resolved path of bubblewrap; "" in unsafe mode
	layout   *layout // nil in unsafe mode or without bubblewrap
	// unavailable says why sandboxes cannot start; nil when they can.
	unavailable error
	// cg is nil when the host has no usable cgroups. Fixed after New.
	cg *cgroups

	// pidns says whether bubblewrap's monitor runs as init of a pid
	// namespace of its own; it turns false if the kernel refuses.
	pidns atomic.Bool

	// wg counts the goroutines that wait for commands.
	wg sync.WaitGroup

	mu       sync.Mutex
	machines map[session.ID]*machine // guarded by mu
	fences   map[session.ID]int64    // guarded by mu: highest fence seen per session
	closed   bool                    // guarded by mu
	probed   bool                    // guarded by mu: bubblewrap ran a sandbox once
}

var _ compute.Provider = (*Provider)(nil)

// New returns a provider that keeps sandboxes under cfg.Dir. It fails only
// when cfg is invalid or Dir cannot be created: missing bubblewrap makes
// Open fail instead, and missing cgroups only remove the limits (both are
// logged here).
func New(cfg Config) (*Provider, error) {
	if cfg.Dir == "" {
		return nil, errors.New("local compute: Config.Dir is required")
	}
	if cfg.MemoryBytes < 0 || cfg.Pids < 0 {
		return nil, errors.New("local compute: limits must not be negative")
	}
	if cfg.MemoryBytes == 0 {
		cfg.MemoryBytes = DefaultMemoryBytes
	}
	if cfg.Pids == 0 {
		cfg.Pids = DefaultPids
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("local compute: resolve dir: %w", err)
	}
	cfg.Dir = dir
	p := &Provider{
		cfg:      cfg,
		log:      cfg.Logger,
		stateDir: filepath.Join(dir, stateDirName),
		machines: make(map[session.ID]*machine),
		fences:   make(map[session.ID]int64),
	}
	if err := os.MkdirAll(p.stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("local compute: create dir: %w", err)
	}
	if cfg.Unsafe {
		p.log.Warn("running harnesses without isolation (--unsafe-no-sandbox): they can read and change everything atrium can")
	} else {
		p.bwrap = findBwrap(cfg.Bwrap)
		if p.bwrap == "" {
			p.unavailable = ErrNoBubblewrap
			p.log.Warn(ErrNoBubblewrap.Message)
		} else if p.layout, err = newLayout(p.stateDir); err != nil {
			return nil, fmt.Errorf("local compute: %w", err)
		}
	}
	cg, warn, err := setupCgroups(cfg.CgroupParent)
	switch {
	case err != nil:
		p.log.Warn("cgroups are unavailable: sandboxes run without memory and process limits", "reason", err.Error())
	case warn != "":
		p.log.Warn("sandbox limits are incomplete", "reason", warn)
	}
	p.cg = cg
	p.pidns.Store(p.layout != nil && os.Geteuid() == 0)
	return p, nil
}

// findBwrap returns the path of bubblewrap, or "" if it is not installed.
func findBwrap(configured string) string {
	if configured == "" {
		p, err := exec.LookPath("bwrap")
		if err != nil {
			return ""
		}
		return p
	}
	fi, err := os.Stat(configured)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return ""
	}
	return configured
}

// Open provisions the sandbox of spec.Session, or resumes it: its workspace
// is kept across sleeps and provider restarts. It fails with an error
// matching session.ErrConflict when spec.Fence is older than one already
// seen for the session, and session.ErrUnavailable when sandboxes cannot run
// on this host.
func (p *Provider) Open(ctx context.Context, spec compute.Spec) (compute.Sandbox, error) {
	if err := spec.Session.Validate(); err != nil {
		return nil, err
	}
	if spec.MemoryBytes < 0 || spec.Pids < 0 {
		return nil, session.Errorf(session.CodeBadRequest, "sandbox limits must not be negative")
	}
	p.mu.Lock()
	err := p.admitLocked(spec.Session, spec.Fence)
	if err == nil {
		p.fences[spec.Session] = spec.Fence
	}
	m := p.machines[spec.Session]
	if err == nil && m == nil {
		m = newMachine(p, spec.Session)
		p.machines[spec.Session] = m
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := p.probe(ctx); err != nil {
		return nil, err
	}
	lim := limits{memory: spec.MemoryBytes, pids: spec.Pids, network: spec.Network}
	if lim.memory == 0 {
		lim.memory = p.cfg.MemoryBytes
	}
	if lim.pids == 0 {
		lim.pids = p.cfg.Pids
	}
	if err := m.open(ctx, spec.Fence, lim); err != nil {
		return nil, err
	}
	return &Sandbox{m: m, fence: spec.Fence}, nil
}

// admitLocked checks that the provider can run sandboxes and that fence is
// current for id.
func (p *Provider) admitLocked(id session.ID, fence int64) error {
	if p.closed {
		return session.Errorf(session.CodeUnavailable, "the local compute provider is closed")
	}
	if p.unavailable != nil {
		return p.unavailable
	}
	return p.checkFenceLocked(id, fence)
}

// checkFenceLocked fails with session.ErrConflict when fence is older than
// the newest seen for id.
func (p *Provider) checkFenceLocked(id session.ID, fence int64) error {
	if hi, ok := p.fences[id]; ok && fence < hi {
		return session.Errorf(session.CodeConflict,
			"sandbox of session %s belongs to a newer owner (fence %d, not %d)", id, hi, fence)
	}
	return nil
}

// checkFence is checkFenceLocked for callers without p.mu.
func (p *Provider) checkFence(id session.ID, fence int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.checkFenceLocked(id, fence)
}

// admit is admitLocked for callers without p.mu. When reserve is set and
// the call is admitted, it also counts a command goroutine about to start;
// the caller must call p.wg.Done if it does not start it.
func (p *Provider) admit(id session.ID, fence int64, reserve bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.admitLocked(id, fence); err != nil {
		return err
	}
	if reserve {
		p.wg.Add(1)
	}
	return nil
}

// probe runs a trivial command under bubblewrap once, so that a host where
// bubblewrap cannot create namespaces fails at Open with the reason instead
// of at every turn.
func (p *Provider) probe(ctx context.Context) error {
	if p.layout == nil {
		return nil
	}
	p.mu.Lock()
	done := p.probed
	p.mu.Unlock()
	if done {
		return nil
	}
	args := p.layout.args(p.stateDir, Workspace, false, []string{"true"})
	cmd := exec.CommandContext(ctx, p.bwrap, args...)
	cmd.Env = environ(Workspace, nil)
	cmd.Dir = "/"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("probe bubblewrap: %w", ctx.Err())
		}
		reason := strings.TrimSpace(stderr.String())
		if reason == "" {
			reason = err.Error()
		}
		return session.Errorf(session.CodeUnavailable,
			"bubblewrap cannot create a sandbox on this host (%s): check that user namespaces are enabled "+
				"(sysctl user.max_user_namespaces), or start atrium with --unsafe-no-sandbox to run harnesses without isolation",
			reason)
	}
	p.mu.Lock()
	p.probed = true
	p.mu.Unlock()
	return nil
}

// Close kills every running command of every sandbox and waits for them;
// the sandboxes' workspaces stay on disk. Open fails afterwards. Close is
// safe to call more than once; a call cut short by ctx can be repeated.
func (p *Provider) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	ms := slices.Collect(maps.Values(p.machines))
	p.mu.Unlock()
	var errs []error
	for _, m := range ms {
		if err := m.close(ctx); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("close local compute: %w", ctx.Err())
			}
			errs = append(errs, err)
		}
	}
	// Every command's done channel is closed: their goroutines are
	// returning.
	p.wg.Wait()
	if p.cg != nil {
		p.cg.removeParent()
	}
	return errors.Join(errs...)
}

// environ returns the environment of a command: the minimal base, then
// extra, whose entries win over the base's.
func environ(home string, extra []string) []string {
	env := []string{"PATH=" + sandboxPath, "HOME=" + home, "LANG=C.UTF-8", "TERM=dumb"}
	return append(env, extra...)
}
