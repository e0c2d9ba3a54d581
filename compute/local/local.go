package local

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

// Defaults of Config.
const (
	// DefaultMemoryBytes is a sandbox's memory limit when neither the
	// Spec nor the Config sets one.
	DefaultMemoryBytes int64 = 2 << 30
	// DefaultPids is a sandbox's limit on processes and threads.
	DefaultPids = 512
	// DefaultTmpBytes is the size of a sandbox's /tmp (a tmpfs, whose pages
	// also count against the sandbox's memory limit).
	DefaultTmpBytes int64 = 1 << 30
	// DefaultCgroupParent is the parent of the sandboxes' cgroups on
	// cgroup v2, from the root of the hierarchy.
	DefaultCgroupParent = "/atrium"
	// DefaultEgressPort is the port of the egress proxy on the loopback of
	// a sandbox with an egress allowlist (HTTP_PROXY=http://127.0.0.1:3128).
	DefaultEgressPort = 3128
)

// Bounds of a CPU limit, in CPUs.
const (
	minCPUs = float64(minCPUQuota) / cpuPeriod
	maxCPUs = 4096
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
	// CPUs is the default CPU limit of a sandbox, in CPUs (0.5 is half of
	// one CPU's time), used when its compute.Spec leaves CPUs zero; zero
	// means no limit.
	CPUs float64
	// Forwarder is the executable that is bound into sandboxes with an
	// egress allowlist and run there as the in-sandbox end of the egress
	// proxy (compute/egress): its main must start with the
	// egress.IsForwarder check. Default: this process's own executable.
	Forwarder string
	// EgressPort is the port of the egress proxy on a sandbox's loopback;
	// default DefaultEgressPort.
	EgressPort int
	// EgressDial connects the egress proxies to allowed destinations
	// (egress.Config.Dial). Default: resolve with the host's resolver and
	// refuse loopback and link-local addresses. Tests map names to
	// servers on loopback with it.
	EgressDial func(ctx context.Context, network, address string) (net.Conn, error)
	// CgroupParent is the cgroup under which the per-sandbox cgroups are
	// made, as a path from the root of the cgroup hierarchy. Default: on
	// cgroup v1, "atrium" inside the cgroup this process runs in, so
	// sandboxes count against any limit on atrium itself; on cgroup v2,
	// DefaultCgroupParent (v2 forbids controllers below a cgroup that holds
	// processes, such as atrium's own).
	CgroupParent string
	// TmpBytes is the size of each sandbox's /tmp: a write past it fails
	// with ENOSPC in the sandbox. Default DefaultTmpBytes.
	TmpBytes int64
	// WorkspaceBytes, if positive, is each sandbox's workspace quota: the
	// workspace is an ext4 image of that size loop-mounted (nosuid, nodev)
	// in the sandbox's directory, so a write past it fails with ENOSPC in
	// the sandbox. Needs root, mkfs.ext4 and mount. Zero: no quota. A
	// compute.Spec's DiskBytes replaces it for that sandbox (quota.go says
	// when a new size applies); without a quota DiskBytes is ignored.
	WorkspaceBytes int64
	// WorkspaceBestEffort runs a new sandbox without its quota, with a
	// warning, when its image cannot be mounted (no free loop device),
	// instead of failing it. A sandbox whose image exists always mounts it.
	WorkspaceBestEffort bool
	// HostUID, if positive, is the unprivileged host uid (and gid) that
	// sandboxes run as when atrium runs as root: bubblewrap is started as
	// it (setpriv), so the sandbox's user is that uid on the host and files
	// made in a sandbox (a setuid one included) are never root's.
	// Workspaces are given to it. Every directory above Dir must be
	// searchable by it. Zero: bubblewrap runs as atrium's own uid.
	HostUID int
	// Logger receives the provider's logs; default slog.Default().
	Logger *slog.Logger
}

// Provider runs sandboxes on this host. It implements compute.Provider.
// Its methods are safe for concurrent use.
type Provider struct {
	cfg      Config
	log      *slog.Logger
	stateDir string
	bwrap    string          // resolved path of bubblewrap; "" in unsafe mode
	layout   *layout         // nil in unsafe mode or without bubblewrap
	hostID   *hostIdentity   // nil: bubblewrap runs as atrium's uid
	quota    *workspaceQuota // nil: workspaces without a quota
	// unavailable says why sandboxes cannot start; nil when they can.
	unavailable error
	// cg is nil when the host has no usable cgroups. Fixed after New.
	cg *cgroups

	// pidns says whether bubblewrap's monitor runs as init of a pid
	// namespace of its own; it turns false if the kernel refuses.
	pidns atomic.Bool

	// forwarder is the host path of the egress forwarder; forwarderErr
	// says why there is none.
	forwarder    string
	forwarderErr error
	// unsafeEgress warns once that unsafe mode does not enforce egress
	// allowlists.
	unsafeEgress sync.Once

	// wg counts the goroutines that wait for commands.
	wg sync.WaitGroup

	mu       sync.Mutex
	machines map[session.ID]*machine // guarded by mu
	fences   map[session.ID]int64    // guarded by mu: highest fence seen per session
	closed   bool                    // guarded by mu
	probed   bool                    // guarded by mu: bubblewrap ran a sandbox once
	fwdOK    bool                    // guarded by mu: the forwarder answered its probe
	// zygote says whether the forwarder executable acts as a sandbox
	// zygote: 0 not probed yet, 1 yes, -1 no.
	zygote int // guarded by mu
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
	if err := checkCPUs(cfg.CPUs); err != nil {
		return nil, fmt.Errorf("local compute: %w", err)
	}
	if cfg.EgressPort < 0 || cfg.EgressPort > 65535 {
		return nil, errors.New("local compute: EgressPort must be a port number")
	}
	if cfg.EgressPort == 0 {
		cfg.EgressPort = DefaultEgressPort
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
		} else if p.layout, err = newLayout(p.stateDir, cmp.Or(cfg.TmpBytes, DefaultTmpBytes)); err != nil {
			return nil, fmt.Errorf("local compute: %w", err)
		}
		if cfg.HostUID > 0 && p.layout != nil {
			if err := searchable(dir); err != nil {
				return nil, fmt.Errorf("local compute: %w", err)
			}
			if p.hostID, err = newHostIdentity(cfg.HostUID, p.stateDir); err != nil {
				return nil, fmt.Errorf("local compute: %w", err)
			}
		}
		if cfg.WorkspaceBytes > 0 && p.layout != nil {
			if p.quota, err = newWorkspaceQuota(cfg.WorkspaceBytes, max(cfg.HostUID, 0)); err != nil {
				return nil, fmt.Errorf("local compute: %w", err)
			}
		}
	}
	p.forwarder = cfg.Forwarder
	if p.forwarder == "" {
		if p.forwarder, err = os.Executable(); err != nil {
			p.forwarderErr = fmt.Errorf("find atrium's executable: %w", err)
		}
	}
	if p.forwarder, err = p.hostID.forwarder(p.forwarder, p.stateDir); err != nil {
		return nil, fmt.Errorf("local compute: give the forwarder to the sandbox host uid: %w", err)
	}
	cg, warn, err := setupCgroups(cfg.CgroupParent)
	switch {
	case err != nil:
		p.log.Warn("cgroups are unavailable: sandboxes run without memory, process and CPU limits", "reason", err.Error())
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
	lim, err := p.limitsOf(spec)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	err = p.admitLocked(spec.Session, spec.Fence)
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
	if lim.egress != nil {
		if err := p.probeForwarder(ctx); err != nil {
			return nil, err
		}
		if p.layout == nil {
			p.unsafeEgress.Do(func() {
				p.log.Warn("egress allowlists are not enforced with --unsafe-no-sandbox: commands have the host's network; " +
					"HTTP_PROXY and HTTPS_PROXY point them at the allowlist's proxy, which only programs that honour them use")
			})
		}
	}
	if lim.model != "" && p.layout != nil {
		if err := p.probeForwarder(ctx); err != nil {
			return nil, err
		}
	}
	if err := m.open(ctx, spec.Fence, lim); err != nil {
		return nil, err
	}
	return &Sandbox{m: m, fence: spec.Fence}, nil
}

// limitsOf validates spec and returns the sandbox's resources, with the
// provider's defaults for what spec leaves zero.
func (p *Provider) limitsOf(spec compute.Spec) (limits, error) {
	if err := spec.Session.Validate(); err != nil {
		return limits{}, err
	}
	if spec.MemoryBytes < 0 || spec.Pids < 0 {
		return limits{}, session.Errorf(session.CodeBadRequest, "sandbox limits must not be negative")
	}
	if err := checkCPUs(spec.CPUs); err != nil {
		return limits{}, session.Errorf(session.CodeBadRequest, "sandbox %s", err.Error())
	}
	lim := limits{memory: spec.MemoryBytes, pids: spec.Pids, cpus: spec.CPUs, network: spec.Network}
	if lim.memory == 0 {
		lim.memory = p.cfg.MemoryBytes
	}
	if lim.pids == 0 {
		lim.pids = p.cfg.Pids
	}
	if lim.cpus == 0 {
		lim.cpus = p.cfg.CPUs
	}
	switch {
	case spec.DiskBytes < 0:
		return limits{}, session.Errorf(session.CodeBadRequest, "sandbox disk_bytes must not be negative")
	case spec.DiskBytes > 0 && spec.DiskBytes < session.MinDiskBytes:
		return limits{}, session.Errorf(session.CodeBadRequest, "sandbox disk_bytes %d is too small: at least %d (16 MiB)", spec.DiskBytes, session.MinDiskBytes)
	case spec.DiskBytes > 0 && p.quota != nil:
		lim.disk = spec.DiskBytes
	default:
		lim.disk = p.cfg.WorkspaceBytes // ignored without a quota
	}
	if len(spec.Egress) > 0 {
		if spec.Network {
			return limits{}, session.Errorf(session.CodeBadRequest,
				"a sandbox has either the network or an egress allowlist, not both")
		}
		a, err := egress.ParseAllowlist(spec.Egress)
		if err != nil {
			return limits{}, session.Errorf(session.CodeBadRequest, "%s", err.Error())
		}
		lim.egress = a
	}
	mounts, err := checkMounts(spec.Mounts)
	if err != nil {
		return limits{}, err
	}
	lim.mounts = mounts
	for _, mt := range mounts {
		// A writable mount (an agent's home) must be writable by the
		// sandbox's user: the host uid, when there is one.
		if !mt.ReadOnly {
			if err := p.hostID.ownTree(mt.Host); err != nil {
				return limits{}, fmt.Errorf("give the mount %s to the sandbox host uid: %w", mt.Host, err)
			}
		}
	}
	if spec.ModelSocket != "" {
		if err := checkModelSocket(spec.ModelSocket); err != nil {
			return limits{}, err
		}
		lim.model = filepath.Clean(spec.ModelSocket)
		// Sandboxes run as the host uid must be able to connect to it
		// (it is 0600); they all share that uid, and the gateway checks
		// each sandbox's own token.
		if err := p.hostID.ownFile(lim.model); err != nil {
			return limits{}, fmt.Errorf("give the model gateway's socket to the sandbox host uid: %w", err)
		}
	}
	return lim, nil
}

// checkCPUs validates a CPU limit; zero means none.
func checkCPUs(cpus float64) error {
	switch {
	case math.IsNaN(cpus) || cpus < 0:
		return errors.New("CPU limit must not be negative")
	case cpus != 0 && cpus < minCPUs:
		return fmt.Errorf("CPU limit must be at least %g CPUs", minCPUs)
	case cpus > maxCPUs:
		return fmt.Errorf("CPU limit must be at most %d CPUs", maxCPUs)
	}
	return nil
}

// probeForwarder checks once that the forwarder executable acts as one, so
// that a binary without the egress.IsForwarder check fails at Open with the
// reason instead of at every command (or worse, runs its own main inside
// the sandbox). In unsafe mode there is nothing to check: the proxy
// listens on the host's loopback.
func (p *Provider) probeForwarder(ctx context.Context) error {
	if p.layout == nil {
		return nil
	}
	p.mu.Lock()
	done := p.fwdOK
	p.mu.Unlock()
	if done {
		return nil
	}
	unavailable := func(reason string) error {
		return session.Errorf(session.CodeUnavailable,
			"egress allowlists and the model gateway are unavailable: %s; the forwarder must be the atrium executable, or a program whose main starts with egress.IsForwarder",
			reason)
	}
	if p.forwarderErr != nil {
		return unavailable(p.forwarderErr.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, forwarderProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.forwarder, "-probe")
	cmd.Args[0] = egress.ForwarderName
	cmd.Env = []string{}
	cmd.Dir = "/"
	out, err := cmd.Output()
	if string(out) != egress.ForwarderProbeOutput {
		if errors.Is(ctx.Err(), context.Canceled) {
			return fmt.Errorf("probe egress forwarder: %w", ctx.Err())
		}
		reason := "it did not answer its probe"
		if err != nil {
			reason += " (" + err.Error() + ")"
		}
		return unavailable(fmt.Sprintf("%s does not act as the egress forwarder: %s", p.forwarder, reason))
	}
	p.mu.Lock()
	p.fwdOK = true
	p.mu.Unlock()
	return nil
}

// zygoteUsable reports whether sandboxes can run their commands through a
// zygote: the executable bound in as the egress forwarder must also act as
// a zygote (every binary linking this package does). It probes once.
func (p *Provider) zygoteUsable() bool {
	p.mu.Lock()
	z := p.zygote
	p.mu.Unlock()
	if z != 0 {
		return z > 0
	}
	ok := p.forwarderErr == nil
	if ok {
		ctx, cancel := context.WithTimeout(context.Background(), forwarderProbeTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, p.forwarder, "-probe")
		cmd.Args[0] = ZygoteName
		cmd.Env = []string{}
		cmd.Dir = "/"
		out, _ := cmd.Output()
		ok = string(out) == zygoteProbeOutput
	}
	if !ok {
		p.log.Info("sandboxes start a bubblewrap per command: the executable does not act as a sandbox zygote", "executable", p.forwarder)
	}
	p.mu.Lock()
	p.zygote = -1
	if ok {
		p.zygote = 1
	}
	p.mu.Unlock()
	return ok
}

// forwarderProbeTimeout bounds the forwarder's probe.
const forwarderProbeTimeout = 10 * time.Second

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
	args := p.layout.args(p.stateDir, Workspace, sandboxOptions{}, []string{"true"})
	cmd := exec.CommandContext(ctx, p.bwrap, args...)
	cmd.Env = environ(Workspace)
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
		} else if err := p.quota.detach(m.dir); err != nil { // its image is mounted again at the next Open
			errs = append(errs, fmt.Errorf("close sandbox %s: %w", m.id, err))
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
// extras in order, whose entries win over earlier ones.
func environ(home string, extras ...[]string) []string {
	env := []string{"PATH=" + sandboxPath, "HOME=" + home, "LANG=C.UTF-8", "TERM=dumb"}
	for _, e := range extras {
		env = append(env, e...)
	}
	return lastWins(env)
}
