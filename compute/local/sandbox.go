package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

// killTimeout bounds how long a SIGKILL waits for a command's processes to
// disappear.
const killTimeout = 10 * time.Second

// limits are a sandbox's resources.
type limits struct {
	memory  int64
	pids    int
	cpus    float64 // 0: no limit
	network bool
	egress  *egress.Allowlist // nil: no egress proxy
	mounts  []compute.Mount   // host directories bound into the sandbox
	model   string            // host path of the model gateway's socket; "" for none
	disk    int64             // workspace quota in bytes (with Config.WorkspaceBytes)
}

// Sandbox is a handle on one session's sandbox, carrying the fence of the
// Open that returned it. It implements compute.Sandbox. Every handle of a
// session shares the same sandbox; a handle whose fence is older than the
// newest Open's is refused with session.ErrConflict.
type Sandbox struct {
	m     *machine
	fence int64
}

var _ compute.Sandbox = (*Sandbox)(nil)

// machine is the state of one session's sandbox, shared by its handles.
type machine struct {
	p         *Provider
	id        session.ID
	dir       string // <Config.Dir>/<id>
	workspace string // dir/workspace, bound at /workspace

	// lock is the lifecycle lock, held to provision, start a command,
	// sleep and destroy. It is a channel so that waiting for it honours a
	// context.
	lock chan struct{}

	limits limits      // guarded by lock
	cg     *cgroup     // guarded by lock: the sandbox's cgroup while ready; nil without cgroups
	seq    int         // guarded by lock: numbers the commands' leaf cgroups
	gate   *egressGate // guarded by lock: the egress proxy while ready, once an allowlist was set
	zyg    *zygote     // guarded by lock: the sandbox's zygote, once started; nil while sleeping
	relay  *modelRelay // guarded by lock: in unsafe mode, the model gateway's loopback relay

	mu    sync.Mutex
	state session.SandboxState // guarded by mu
	procs map[*Process]bool    // guarded by mu: running commands

	// quotaBytes is the size of the workspace's mounted image, for the
	// exit of a command that filled it; 0 while none is mounted.
	quotaBytes atomic.Int64
}

func newMachine(p *Provider, id session.ID) *machine {
	dir := filepath.Join(p.cfg.Dir, string(id))
	ws := filepath.Join(dir, "workspace")
	if p.quota != nil {
		ws = quotaWorkspace(dir) // a directory inside the mounted image
	}
	return &machine{
		p:         p,
		id:        id,
		dir:       dir,
		workspace: ws,
		lock:      make(chan struct{}, 1),
		state:     session.SandboxNone,
		procs:     make(map[*Process]bool),
	}
}

// acquire takes the lifecycle lock.
func (m *machine) acquire(ctx context.Context) error {
	select {
	case m.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for sandbox %s: %w", m.id, ctx.Err())
	}
}

// release gives the lifecycle lock back.
func (m *machine) release() { <-m.lock }

func (m *machine) setState(s session.SandboxState) {
	m.mu.Lock()
	m.state = s
	m.mu.Unlock()
}

func (m *machine) getState() session.SandboxState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// open provisions the sandbox with lim, or updates the limits of a ready
// one.
func (m *machine) open(ctx context.Context, fence int64, lim limits) error {
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	// A newer owner may have opened the sandbox while this one waited.
	if err := m.p.admit(m.id, fence, false); err != nil {
		return err
	}
	m.limits = lim
	if err := m.provisionLocked(); err != nil {
		return fmt.Errorf("open sandbox %s: %w", m.id, err)
	}
	return nil
}

// provisionLocked makes the workspace and the cgroup with the current
// limits, and marks the sandbox ready.
func (m *machine) provisionLocked() error {
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return fmt.Errorf("create sandbox dir: %w", err)
	}
	if err := m.p.quota.attach(m.dir, m.limits.disk, &m.quotaBytes); err != nil {
		if !errors.Is(err, errNoLoop) || !m.p.cfg.WorkspaceBestEffort {
			return fmt.Errorf("mount the workspace quota: %w", err)
		}
		m.p.log.Warn("this sandbox runs WITHOUT its workspace quota: its image could not be mounted; "+
			"free loop devices (losetup -a) or raise the loop module's max_loop", "session", m.id, "err", err)
	}
	if old := filepath.Join(m.dir, "workspace"); old != m.workspace {
		// Running without the quota after all: a workspace of the layout
		// without one is moved to where this one is.
		if _, err := os.Stat(m.workspace); errors.Is(err, fs.ErrNotExist) {
			if err := os.Rename(old, m.workspace); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("move the workspace: %w", err)
			}
		}
	}
	if err := os.MkdirAll(m.workspace, 0o755); err != nil {
		return fmt.Errorf("create workspace: %w", err)
	}
	if err := m.p.hostID.own(m.dir, m.workspace); err != nil {
		return fmt.Errorf("give the workspace to the sandbox host uid: %w", err)
	}
	if cs := m.p.cg; cs != nil {
		cg, err := cs.createSession(string(m.id), m.limits.memory, m.limits.pids, m.limits.cpus)
		if err != nil {
			return err
		}
		m.cg = &cg
		m.mu.Lock()
		idle := len(m.procs) == 0
		m.mu.Unlock()
		if idle {
			// Commands left behind by an earlier provider process (one
			// that crashed) still count against the limits: end them.
			if err := m.sweepLocked(); err != nil {
				return err
			}
			if m.zyg == nil {
				if err := m.removeZygoteCgroupLocked(); err != nil {
					return err
				}
			}
		}
	}
	if err := m.egressLocked(); err != nil {
		return err
	}
	m.setState(session.SandboxReady)
	return nil
}

// sweepLocked kills every process in the sandbox's cgroup and its leaf
// cgroups and removes the leaves. No command may be running.
func (m *machine) sweepLocked() error {
	var errs []error
	for _, name := range m.cg.children() {
		leaf := m.cg.child(name)
		if err := killCgroup(leaf); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := leaf.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := killCgroup(*m.cg); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// stopLocked kills every running command, waits for them, and removes the
// sandbox's cgroup.
func (m *machine) stopLocked(ctx context.Context) error {
	m.mu.Lock()
	procs := make([]*Process, 0, len(m.procs))
	for pr := range m.procs {
		procs = append(procs, pr)
	}
	m.mu.Unlock()
	var errs []error
	for _, pr := range procs {
		if err := pr.Signal(syscall.SIGKILL); err != nil {
			errs = append(errs, err)
		}
	}
	for _, pr := range procs {
		select {
		case <-pr.done:
		case <-ctx.Done():
			return fmt.Errorf("stop sandbox %s: %w", m.id, ctx.Err())
		}
	}
	if m.zyg != nil {
		m.zyg.stop()
		m.zyg = nil
	}
	if err := m.removeZygoteCgroupLocked(); err != nil {
		errs = append(errs, err)
	}
	if err := m.closeEgressLocked(); err != nil {
		errs = append(errs, err)
	}
	m.closeModelRelayLocked()
	if m.cg != nil {
		if err := m.sweepLocked(); err != nil {
			errs = append(errs, err)
		} else if err := m.cg.remove(); err != nil {
			errs = append(errs, err)
		}
		m.cg = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", m.id, err)
	}
	return nil
}

// close is the provider's Close for one sandbox: it stops everything and
// leaves a ready sandbox sleeping.
func (m *machine) close(ctx context.Context) error {
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	err := m.stopLocked(ctx)
	if m.getState() == session.SandboxReady {
		m.setState(session.SandboxSleeping)
	}
	return err
}

// forget removes a finished command.
func (m *machine) forget(pr *Process) {
	m.mu.Lock()
	delete(m.procs, pr)
	m.mu.Unlock()
}

// State returns the sandbox's state: ready after Open, sleeping after Sleep
// (or the provider's Close), stopped after Destroy.
func (s *Sandbox) State() session.SandboxState { return s.m.getState() }

// Exec starts req in the sandbox, waking it if it sleeps. ctx bounds only
// the start; the command runs until it exits or is signalled. The sandbox's
// processes may run several commands at once.
func (s *Sandbox) Exec(ctx context.Context, req compute.ExecRequest) (compute.Process, error) {
	if err := validateExec(req); err != nil {
		return nil, err
	}
	m := s.m
	if err := m.acquire(ctx); err != nil {
		return nil, err
	}
	defer m.release()
	if err := m.p.admit(m.id, s.fence, true); err != nil {
		return nil, err
	}
	pr, err := m.execLocked(ctx, req)
	if err != nil {
		m.p.wg.Done()
		return nil, err
	}
	return pr, nil
}

// validateExec checks a request before anything starts.
func validateExec(req compute.ExecRequest) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return session.Errorf(session.CodeBadRequest, "exec: empty command")
	}
	for _, e := range req.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsRune(e, 0) {
			return session.Errorf(session.CodeBadRequest, "exec: environment entry %q is not KEY=VALUE", k)
		}
	}
	for _, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return session.Errorf(session.CodeBadRequest, "exec: argument contains a NUL byte")
		}
	}
	return nil
}

// execLocked starts req. The caller holds the lifecycle lock and has
// counted the command's goroutine in p.wg.
func (m *machine) execLocked(ctx context.Context, req compute.ExecRequest) (*Process, error) {
	switch m.getState() {
	case session.SandboxStopped:
		return nil, session.Errorf(session.CodeNotFound, "sandbox of session %s was destroyed", m.id)
	case session.SandboxSleeping:
		if err := m.provisionLocked(); err != nil {
			return nil, fmt.Errorf("wake sandbox %s: %w", m.id, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
	}
	if m.limits.egress != nil && m.gate == nil {
		// An Open that set the allowlist failed to start the proxy.
		if err := m.egressLocked(); err != nil {
			return nil, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
		}
	}
	p := m.p
	var leaf *cgroup
	if m.cg != nil {
		m.seq++
		l := m.cg.child("x" + strconv.Itoa(m.seq))
		if err := l.create(); err != nil {
			return nil, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
		}
		leaf = &l
	}
	var target, proxy []string
	var cmdDir, home string
	if p.layout != nil {
		dir := req.Dir
		if dir == "" {
			dir = Workspace
		} else if !path.IsAbs(dir) {
			dir = path.Join(Workspace, dir)
		}
		o := sandboxOptions{network: m.limits.network, mounts: m.limits.mounts}
		if m.limits.egress != nil {
			o.egress = &egressMount{socket: m.gate.socket, forwarder: p.forwarder, port: p.cfg.EgressPort}
			proxy = proxyEnv(egressListen(p.cfg.EgressPort))
		}
		if m.limits.model != "" {
			o.model = &modelMount{socket: m.limits.model, forwarder: p.forwarder}
		}
		if pr, ok, err := m.execInZygoteLocked(o, leaf, zygoteRequest{
			Argv: req.Argv, Env: environ(Workspace, proxy, req.Env), Dir: dir,
		}); ok {
			return pr, err
		}
		target = append(p.hostID.command(p.bwrap), p.layout.args(m.workspace, dir, o, req.Argv)...)
		// bubblewrap runs from / so that the inherited PWD does not name
		// a host path.
		cmdDir, home = "/", Workspace
	} else {
		target = unsafeMountPaths(m.limits.mounts, req.Argv)
		req.Env = unsafeMountPaths(m.limits.mounts, req.Env)
		cmdDir, home = m.hostDir(req.Dir), m.workspace
		if m.limits.egress != nil {
			proxy = proxyEnv(m.gate.addr)
		}
		if m.limits.model != "" {
			addr, err := m.modelRelayLocked()
			if err != nil {
				return nil, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
			}
			req.Env = unsafeModelAddr(addr, req.Env)
		}
	}
	var files []string
	if leaf != nil {
		files = leaf.procsFiles()
	}
	pr, err := start(m, leaf, wrapper(files, target), environ(home, proxy, req.Env), cmdDir)
	if err != nil {
		if leaf != nil {
			_ = leaf.remove() // Nothing entered it.
		}
		return nil, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
	}
	return pr, nil
}

// execInZygoteLocked runs req through the sandbox's zygote; ok is false
// when the command must start its own bubblewrap instead. The caller holds
// the lifecycle lock.
func (m *machine) execInZygoteLocked(o sandboxOptions, leaf *cgroup, req zygoteRequest) (pr *Process, ok bool, err error) {
	// A zygote found dead (a command may kill it) or hanging is replaced
	// once; if the new one fails too, the command starts its own
	// bubblewrap.
	for range 2 {
		z := m.zygoteLocked(o)
		if z == nil {
			return nil, false, nil
		}
		pr, err = startInZygote(m, z, leaf, req)
		if errors.Is(err, errZygoteGone) {
			m.p.log.Warn("sandbox zygote lost", "session", string(m.id), "error", err.Error())
			z.stop()
			m.zyg = nil
			continue
		}
		if err != nil {
			if leaf != nil {
				_ = leaf.remove() // Nothing ran in it.
			}
			return nil, true, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
		}
		return pr, true, nil
	}
	return nil, false, nil
}

// zygoteLocked returns the sandbox's zygote for a command with options o,
// starting it if needed, or nil when commands must start their own
// bubblewrap: the executable does not act as a zygote, the zygote cannot
// start, or commands still run in a zygote built with other options (the
// network or the egress proxy changed) or over a workspace directory that
// has since been replaced. The caller holds the lifecycle lock.
func (m *machine) zygoteLocked(o sandboxOptions) *zygote {
	p := m.p
	if !p.zygoteUsable() {
		return nil
	}
	if z := m.zyg; z != nil {
		// A restore swaps a new tree in at the workspace's path (see
		// compute/mount), or at a writable mount's (an agent's home):
		// the zygote's bind still shows the old one.
		ws, err := statID(m.workspace)
		if z.alive() && sameOptions(z.opts, o) && err == nil && ws == z.ws && slices.Equal(writableIDs(o.mounts), z.rw) {
			return z
		}
		m.mu.Lock()
		busy := len(m.procs) > 0
		m.mu.Unlock()
		if z.alive() && busy {
			return nil
		}
		z.stop()
		m.zyg = nil
	}
	z, err := m.startZygoteLocked(o)
	if err != nil {
		p.log.Warn("sandbox zygote unavailable: the command starts its own bubblewrap", "session", string(m.id), "error", err.Error())
		return nil
	}
	m.zyg = z
	return z
}

// sameOptions reports whether a and b build the same sandbox.
func sameOptions(a, b sandboxOptions) bool {
	if a.network != b.network || (a.egress == nil) != (b.egress == nil) || !slices.Equal(a.mounts, b.mounts) {
		return false
	}
	if (a.model == nil) != (b.model == nil) || (a.model != nil && *a.model != *b.model) {
		return false
	}
	return a.egress == nil || *a.egress == *b.egress
}

// hostDir maps a working directory of an unsafe command to the host: the
// workspace stands for /workspace.
func (m *machine) hostDir(dir string) string {
	switch {
	case dir == "" || dir == Workspace:
		return m.workspace
	case strings.HasPrefix(dir, Workspace+"/"):
		return filepath.Join(m.workspace, strings.TrimPrefix(dir, Workspace+"/"))
	case !filepath.IsAbs(dir):
		return filepath.Join(m.workspace, dir)
	}
	return dir
}

// Sleep kills every running command and releases the sandbox's cgroup,
// keeping the workspace. The next Exec wakes the sandbox.
func (s *Sandbox) Sleep(ctx context.Context) error {
	m := s.m
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	if err := m.p.checkFence(m.id, s.fence); err != nil {
		return err
	}
	if st := m.getState(); st == session.SandboxSleeping || st == session.SandboxStopped {
		return nil
	}
	if err := m.stopLocked(ctx); err != nil {
		return err
	}
	m.setState(session.SandboxSleeping)
	m.p.log.Debug("sandbox sleeping", "session", string(m.id))
	return nil
}

// Destroy kills every running command and deletes the sandbox's cgroup and
// workspace. A later Open of the session starts from an empty workspace.
func (s *Sandbox) Destroy(ctx context.Context) error {
	m := s.m
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	if err := m.p.checkFence(m.id, s.fence); err != nil {
		return err
	}
	if err := m.stopLocked(ctx); err != nil {
		return err
	}
	if err := m.p.quota.detach(m.dir); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", m.id, err)
	}
	if err := removeAll(m.dir); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", m.id, err)
	}
	m.setState(session.SandboxStopped)
	m.p.log.Debug("sandbox destroyed", "session", string(m.id))
	return nil
}

// removeAll deletes dir even where a command removed the write permission
// of a directory it created.
func removeAll(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// killCgroup kills every process in cg and waits until none is left.
func killCgroup(cg cgroup) error {
	deadline := time.Now().Add(killTimeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		pids, err := cg.procs()
		if err != nil {
			return err
		}
		if len(alive(pids)) == 0 {
			return nil
		}
		if err := cg.killAll(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v survive SIGKILL", slices.Clip(alive(pids)))
		}
		time.Sleep(delay)
	}
}
