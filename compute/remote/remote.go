// Package remote is the compute provider whose sandboxes are VMs: each
// session's sandbox is a VM running `atrium sandbox-agent`
// (compute/sandboxagent), which this provider drives over HTTP and
// WebSocket. A Hook creates and destroys the VMs (CommandHook runs
// commands, HTTPHook calls a service), so any VM platform plugs in; see
// docs/compute.md for worked examples.
//
// # Life of a sandbox
//
// Open asks the hook for a VM (once per session, or again after the VM
// died or was destroyed), waits until its agent answers the health check,
// and opens the sandbox on the agent with the caller's fence. Exec streams a
// command over one WebSocket connection with credit-based flow control, so a
// command whose output nobody reads is slowed down by its pipe in the VM and
// neither side buffers more than a window per stream. Sleep stops the
// commands and keeps the VM (and its workspace); Destroy deletes the
// workspace and the VM.
//
// # Sleep with a Sleeper hook
//
// When the hook is a Sleeper (VMHosts, for `atrium vmhost`), Sleep keeps
// everything running instead: the agent suspends each command's connection
// in agreement with the provider (nothing in flight is lost), the hook
// saves the VM's memory on its host and stops it, and the next Open, Exec
// or workspace call wakes it, after which each command gets a new
// connection and carries on where it was, its Process unchanged. A VM that
// cannot be woken (its host died) is replaced by a fresh one, and the
// commands that ran in it end with Exit.Lost.
//
// # When the VM dies
//
// A command whose connection to the agent breaks, or whose agent stops
// answering pings, ends with a compute.Exit that has Lost set and a Detail
// saying the sandbox died. The provider then destroys that VM through the
// hook (it may be unreachable rather than dead) and the next Open or Exec of
// the session provisions a fresh one. A VM that died while idle is found
// at the next Exec, which provisions a fresh one in the same call.
//
// The provider does not destroy VMs when it is closed: a node that restarts
// cannot find them again, so hooks should either return the VM they already
// run for a session from CreateVM, or let the platform expire idle VMs.
package remote

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// Defaults of Config.
const (
	// DefaultStartTimeout bounds the provisioning of a VM: the hook's
	// CreateVM and the wait for its agent's health.
	DefaultStartTimeout = 2 * time.Minute
	// DefaultDestroyTimeout bounds a hook's DestroyVM.
	DefaultDestroyTimeout = time.Minute
	// DefaultRequestTimeout bounds each API call to an agent (not the
	// streams of a command).
	DefaultRequestTimeout = 30 * time.Second
	// DefaultHeartbeat is how often a command's connection is pinged; an
	// agent that does not answer within the same time is considered dead.
	DefaultHeartbeat = 10 * time.Second
	// DefaultWindow is how many bytes of each output stream of a command
	// the provider buffers.
	DefaultWindow = 1 << 20
	// DefaultVMAgentsDir is where `atrium vmhost` images built with
	// --agents hold them (vmhost.ToolsPath).
	DefaultVMAgentsDir = "/usr/local/atrium"
)

// Config configures a Provider.
type Config struct {
	// Hook creates and destroys VMs. Required.
	Hook Hook
	// StartTimeout, DestroyTimeout, RequestTimeout and Heartbeat default to
	// the constants of the same names.
	StartTimeout   time.Duration
	DestroyTimeout time.Duration
	RequestTimeout time.Duration
	Heartbeat      time.Duration
	// Window is the per-stream output buffer of a command; default
	// DefaultWindow.
	Window int64
	// AgentsDir is the node's agents install (compute/agents): a mount of
	// a directory below it (an agent's program) is made in the VM from
	// VMAgentsDir, the image's copy. Other mounts (an agent's home) become
	// directories the VM's agent keeps, seeded with the node directory's
	// files at every open.
	AgentsDir string
	// VMAgentsDir is where VMs hold the agents install; default
	// DefaultVMAgentsDir.
	VMAgentsDir string
	// HTTPClient calls the agents, e.g. with a TLS configuration for
	// https:// addresses; default a client of its own.
	HTTPClient *http.Client
	// Logger receives the provider's logs; default slog.Default().
	Logger *slog.Logger
}

// Provider runs sandboxes in VMs. It implements compute.Provider. Its
// methods are safe for concurrent use.
type Provider struct {
	cfg     Config
	log     *slog.Logger
	client  *http.Client
	sleeper Sleeper // the hook's sleep and wake; nil if it has none

	// wg counts the goroutines of commands and of background VM
	// destruction.
	wg sync.WaitGroup

	mu       sync.Mutex
	machines map[session.ID]*machine // guarded by mu
	fences   map[session.ID]int64    // guarded by mu: highest fence seen per session
	closed   bool                    // guarded by mu
}

var _ compute.Provider = (*Provider)(nil)

// New returns a provider that provisions VMs through cfg.Hook.
func New(cfg Config) (*Provider, error) {
	if cfg.Hook == nil {
		return nil, errors.New("remote compute: Config.Hook is required")
	}
	if cfg.StartTimeout < 0 || cfg.DestroyTimeout < 0 || cfg.RequestTimeout < 0 || cfg.Heartbeat < 0 || cfg.Window < 0 {
		return nil, errors.New("remote compute: timeouts and Window must not be negative")
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.DestroyTimeout == 0 {
		cfg.DestroyTimeout = DefaultDestroyTimeout
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	cfg.Window = max(cfg.Window, compute.AgentMaxChunk)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.VMAgentsDir == "" {
		cfg.VMAgentsDir = DefaultVMAgentsDir
	}
	client := cfg.HTTPClient
	if client == nil {
		client = &http.Client{Transport: &http.Transport{
			Proxy:                 nil, // Agents are on the node's own network.
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: cfg.RequestTimeout,
		}}
	}
	return &Provider{
		cfg:      cfg,
		log:      cfg.Logger,
		client:   client,
		machines: make(map[session.ID]*machine),
		fences:   make(map[session.ID]int64),
		sleeper:  sleeperOf(cfg.Hook),
	}, nil
}

// Open provisions the sandbox of spec.Session, or resumes the one it has:
// the first Open of a session (and the first after its VM died or was
// destroyed) creates a VM through the hook and waits for its agent. It
// fails with an error matching session.ErrConflict when spec.Fence is older
// than one already seen for the session, and session.ErrUnavailable when no
// VM could be provisioned or reached.
func (p *Provider) Open(ctx context.Context, spec compute.Spec) (compute.Sandbox, error) {
	if err := spec.Session.Validate(); err != nil {
		return nil, err
	}
	if spec.MemoryBytes < 0 || spec.Pids < 0 {
		return nil, session.Errorf(session.CodeBadRequest, "sandbox limits must not be negative")
	}
	p.mu.Lock()
	err := p.admitLocked(spec.Session, spec.Fence)
	m := p.machines[spec.Session]
	if err == nil {
		p.fences[spec.Session] = spec.Fence
		if m == nil {
			m = newMachine(p, spec.Session)
			p.machines[spec.Session] = m
		}
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := m.open(ctx, spec); err != nil {
		return nil, err
	}
	return &Sandbox{m: m, fence: spec.Fence}, nil
}

// admitLocked checks that the provider is open and that fence is current
// for id.
func (p *Provider) admitLocked(id session.ID, fence int64) error {
	if p.closed {
		return session.Errorf(session.CodeUnavailable, "the remote compute provider is closed")
	}
	if hi, ok := p.fences[id]; ok && fence < hi {
		return session.Errorf(session.CodeConflict,
			"sandbox of session %s belongs to a newer owner (fence %d, not %d)", id, hi, fence)
	}
	return nil
}

// admit is admitLocked for callers without p.mu.
func (p *Provider) admit(id session.ID, fence int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.admitLocked(id, fence)
}

// Close ends every running command (the agents kill them when their
// connections drop) and waits for the provider's goroutines. VMs keep
// running; Open fails afterwards. Close is safe to call more than once.
func (p *Provider) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	ms := slices.Collect(maps.Values(p.machines))
	p.mu.Unlock()
	for _, m := range ms {
		m.closeProcs()
		m.stopModel()
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		if p.cfg.HTTPClient == nil {
			p.client.CloseIdleConnections()
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close remote compute: %w", ctx.Err())
	}
}

// SleepKeepsProcesses reports whether a sandbox's Sleep keeps its
// processes: the hook is a Sleeper (VMHosts), so the VM is paused and
// saved, and each running command's Process carries on after the wake
// (unless the VM could not be woken and was replaced: the command then
// ends with Exit.Lost).
func (p *Provider) SleepKeepsProcesses() bool { return p.sleeper != nil }

// KeepsMounts reports that the node's mounts outside Config.AgentsDir (an
// agent's home) are directories the VM's agent keeps, seeded with the
// node directory's files at every open: what the sandbox writes there
// stays in the VM, and the node saves and restores it through
// Sandbox.Mount.
func (p *Provider) KeepsMounts() bool { return true }

// newSandboxID returns a fresh VM name, valid as a DNS label.
func newSandboxID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "sb-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// machine is the state of one session's sandbox, shared by its handles.
type machine struct {
	p  *Provider
	id session.ID

	// lock is the lifecycle lock, held to provision, wake, sleep and
	// destroy. It is a channel so that waiting for it honours a context.
	lock chan struct{}
	spec compute.Spec // guarded by lock: the limits of the newest Open

	mu       sync.Mutex
	state    session.SandboxState // guarded by mu
	agent    *agent               // guarded by mu: the VM's agent; nil when there is none
	vmAsleep bool                 // guarded by mu: the hook put agent's VM to sleep (Sleeper)
	procs    map[*Process]bool    // guarded by mu: running commands
	model    *modelTunnels        // guarded by mu: tunnels to the model gateway (model.go); nil without
}

func newMachine(p *Provider, id session.ID) *machine {
	return &machine{
		p:     p,
		id:    id,
		lock:  make(chan struct{}, 1),
		state: session.SandboxNone,
		procs: make(map[*Process]bool),
	}
}

func (m *machine) acquire(ctx context.Context) error {
	select {
	case m.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for sandbox %s: %w", m.id, ctx.Err())
	}
}

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

func (m *machine) current() *agent {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.agent
}

// open is Open for one machine: it resumes the VM or provisions one.
func (m *machine) open(ctx context.Context, spec compute.Spec) error {
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	// A newer owner may have opened the sandbox while this one waited.
	if err := m.p.admit(m.id, spec.Fence); err != nil {
		return err
	}
	m.spec = spec
	if a := m.current(); a != nil && m.isVMAsleep() {
		err := m.wakeLocked(ctx, a, spec.Fence)
		if err == nil {
			return nil
		}
		m.p.log.Warn("sandbox VM could not be woken: provisioning a fresh VM", "session", string(m.id), "sandbox", a.req.SandboxID, "err", err)
		m.lost(a)
	} else if a != nil {
		err := m.openAgentLocked(ctx, a, spec.Fence)
		if err == nil || !isUnreachable(err) {
			return err
		}
		m.p.log.Warn("sandbox agent unreachable: provisioning a fresh VM", "session", string(m.id), "addr", a.vm.Addr, "err", err)
		m.lost(a)
	}
	return m.provisionLocked(ctx, spec.Fence)
}

// openAgentLocked opens the sandbox on a's agent with the current spec.
func (m *machine) openAgentLocked(ctx context.Context, a *agent, fence int64) error {
	mounts, err := m.p.agentMounts(m.spec.Mounts)
	if err != nil {
		return fmt.Errorf("open sandbox %s: %w", m.id, err)
	}
	var suspended []int64
	m.mu.Lock()
	for pr := range m.procs {
		if pr.agent == a && pr.suspendSeen.Load() {
			suspended = append(suspended, pr.id)
		}
	}
	m.mu.Unlock()
	err = a.call(ctx, http.MethodPost, "/v1/sandbox", fence, compute.AgentOpen{
		Session: m.id, MemoryBytes: m.spec.MemoryBytes, Pids: m.spec.Pids, Network: m.spec.Network,
		Model: m.spec.ModelSocket != "", Egress: m.spec.Egress, Mounts: mounts, Suspended: suspended,
	}, nil)
	if err != nil {
		return fmt.Errorf("open sandbox %s: %w", m.id, err)
	}
	m.startModelLocked(a, fence)
	m.setState(session.SandboxReady)
	return nil
}

// provisionLocked creates a VM, waits for its agent and opens the sandbox
// on it. On failure the VM is destroyed and the sandbox is failed.
func (m *machine) provisionLocked(ctx context.Context, fence int64) error {
	p := m.p
	m.setState(session.SandboxProvisioning)
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	req := HookRequest{
		Session: m.id, Fence: fence, SandboxID: newSandboxID(),
		MemoryBytes: m.spec.MemoryBytes, Pids: m.spec.Pids, Network: m.spec.Network,
	}
	start := time.Now()
	vm, err := p.cfg.Hook.CreateVM(ctx, req)
	if err != nil {
		m.setState(session.SandboxFailed)
		return session.Errorf(session.CodeUnavailable, "provision a VM for session %s: %v", m.id, err)
	}
	req.SandboxID = vm.ID
	a, err := newAgent(p, vm, req)
	if err == nil {
		var h compute.AgentHealth
		if h, err = a.waitHealthy(ctx); err == nil {
			p.log.Info("sandbox VM up", "session", string(m.id), "sandbox", vm.ID, "addr", vm.Addr,
				"agent_version", h.Version, "duration", time.Since(start).Round(time.Millisecond))
			err = m.openAgentLocked(ctx, a, fence)
		}
	}
	if err != nil {
		m.setState(session.SandboxFailed)
		m.destroyVM(context.WithoutCancel(ctx), req)
		return fmt.Errorf("provision sandbox %s: %w", m.id, err)
	}
	m.mu.Lock()
	m.agent = a
	m.mu.Unlock()
	return nil
}

// destroyVM asks the hook to destroy a VM, logging a failure.
func (m *machine) destroyVM(ctx context.Context, req HookRequest) error {
	ctx, cancel := context.WithTimeout(ctx, m.p.cfg.DestroyTimeout)
	defer cancel()
	if err := m.p.cfg.Hook.DestroyVM(ctx, req); err != nil {
		m.p.log.Warn("destroy sandbox VM", "session", string(m.id), "sandbox", req.SandboxID, "err", err)
		return fmt.Errorf("destroy VM %s of session %s: %w", req.SandboxID, m.id, err)
	}
	m.p.log.Info("sandbox VM destroyed", "session", string(m.id), "sandbox", req.SandboxID)
	return nil
}

// lost forgets a, whose VM died or cannot be reached, and destroys it in the
// background. It does nothing if a is no longer the machine's agent.
func (m *machine) lost(a *agent) {
	m.mu.Lock()
	if m.agent != a {
		m.mu.Unlock()
		return
	}
	m.agent = nil
	m.vmAsleep = false
	if m.state != session.SandboxStopped {
		m.state = session.SandboxFailed
	}
	var procs []*Process
	for pr := range m.procs {
		if pr.agent == a {
			procs = append(procs, pr)
		}
	}
	m.mu.Unlock()
	// Its commands are gone with it (suspended ones would wait forever).
	for _, pr := range procs {
		pr.abort(errVMLost)
	}
	m.stopModel()
	p := m.p
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if closed {
		p.log.Warn("sandbox VM lost while the provider closes: not destroying it", "session", string(m.id), "sandbox", a.req.SandboxID)
		return
	}
	go func() {
		defer p.wg.Done()
		_ = m.destroyVM(context.Background(), a.req)
	}()
}

// errVMLost ends the commands of a VM that died or could not be woken.
var errVMLost = errors.New("the sandbox's VM is gone")

func (m *machine) isVMAsleep() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vmAsleep
}

// sleepVMLocked puts a's VM to sleep through the hook, keeping its
// commands: they are suspended first and reattached after the wake. When
// that fails the VM keeps running and its commands are reattached.
func (m *machine) sleepVMLocked(ctx context.Context, a *agent, fence int64) error {
	if m.isVMAsleep() {
		return nil
	}
	if err := a.call(ctx, http.MethodPost, "/v1/sandbox/suspend", fence, nil, nil); err != nil {
		if isUnreachable(err) {
			m.lost(a)
		} else {
			m.resumeProcs(ctx, a, fence)
		}
		return fmt.Errorf("sleep sandbox %s: suspend its commands: %w", m.id, err)
	}
	m.stopModel()
	start := time.Now()
	if err := m.p.sleeper.SleepVM(ctx, a.req); err != nil {
		m.startModelLocked(a, fence)
		m.resumeProcs(context.WithoutCancel(ctx), a, fence)
		return fmt.Errorf("sleep sandbox %s: %w (the VM keeps running)", m.id, err)
	}
	m.mu.Lock()
	m.vmAsleep = true
	m.state = session.SandboxSleeping
	m.mu.Unlock()
	m.p.log.Info("sandbox VM asleep", "session", string(m.id), "sandbox", a.req.SandboxID,
		"duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// wakeLocked wakes a's sleeping VM through the hook, opens the sandbox on
// its agent again and reattaches its suspended commands.
func (m *machine) wakeLocked(ctx context.Context, a *agent, fence int64) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, m.p.cfg.StartTimeout)
	defer cancel()
	if err := m.p.sleeper.WakeVM(ctx, a.req); err != nil {
		return fmt.Errorf("wake VM %s: %w", a.req.SandboxID, err)
	}
	if _, err := a.waitHealthy(ctx); err != nil {
		return fmt.Errorf("wake VM %s: %w", a.req.SandboxID, err)
	}
	m.mu.Lock()
	m.vmAsleep = false
	m.mu.Unlock()
	if err := m.openAgentLocked(ctx, a, fence); err != nil {
		return err
	}
	m.resumeProcs(ctx, a, fence)
	m.p.log.Info("sandbox VM awake", "session", string(m.id), "sandbox", a.req.SandboxID,
		"duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// wakeFor wakes the sleeping VM of pr, so that pr can be signalled. A VM
// that cannot be woken is lost, and pr ends with it.
func (m *machine) wakeFor(pr *Process) {
	ctx := context.Background()
	if err := m.acquire(ctx); err != nil {
		return
	}
	defer m.release()
	if a := m.current(); a == pr.agent && m.isVMAsleep() && m.p.admit(m.id, pr.fence) == nil {
		if err := m.wakeLocked(ctx, a, pr.fence); err != nil {
			m.p.log.Warn("sandbox VM could not be woken to signal a command", "session", string(m.id), "err", err)
			m.lost(a)
		}
	}
}

// resumeProcs gives each suspended command of a a new connection; one that
// cannot get one ends as lost.
func (m *machine) resumeProcs(ctx context.Context, a *agent, fence int64) {
	m.mu.Lock()
	var procs []*Process
	for pr := range m.procs {
		if pr.agent == a && pr.suspendSeen.Load() {
			procs = append(procs, pr)
		}
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, pr := range procs {
		wg.Go(func() {
			if err := pr.reattach(ctx, a, fence); err != nil {
				m.p.log.Warn("suspended command lost", "session", string(m.id), "err", err)
				pr.abort(fmt.Errorf("%w: %v", errVMLost, err))
				return
			}
			pr.suspendSeen.Store(false)
		})
	}
	wg.Wait()
}

// closeProcs ends the connections of every running command.
func (m *machine) closeProcs() {
	m.mu.Lock()
	procs := slices.Collect(maps.Keys(m.procs))
	m.mu.Unlock()
	for _, pr := range procs {
		pr.abort(errProviderClosed)
	}
}

func (m *machine) forget(pr *Process) {
	m.mu.Lock()
	delete(m.procs, pr)
	m.mu.Unlock()
}

// Sandbox is a handle on one session's sandbox, carrying the fence of the
// Open that returned it. It implements compute.Sandbox.
type Sandbox struct {
	m     *machine
	fence int64
}

var _ compute.Sandbox = (*Sandbox)(nil)

// State returns the sandbox's state: provisioning while a VM is created,
// ready, sleeping after Sleep, failed when its VM died or could not be
// provisioned, stopped after Destroy.
func (s *Sandbox) State() session.SandboxState { return s.m.getState() }

// Exec starts req in the sandbox. A sandbox whose VM died (or cannot be
// reached and does not answer its health check) gets a fresh VM first. ctx
// bounds the start only.
func (s *Sandbox) Exec(ctx context.Context, req compute.ExecRequest) (compute.Process, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, session.Errorf(session.CodeBadRequest, "exec: empty command")
	}
	m := s.m
	for attempt := 0; ; attempt++ {
		a, err := s.ready(ctx)
		if err != nil {
			return nil, err
		}
		pr, err := startProcess(ctx, m, a, s.fence, req)
		if err == nil || !isUnreachable(err) || attempt > 0 {
			if err != nil {
				return nil, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
			}
			return pr, nil
		}
		// No answer: a live agent still answers its health check (the
		// failure was passing); a dead one is replaced.
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, herr := a.health(hctx)
		cancel()
		if herr == nil {
			return nil, fmt.Errorf("exec in sandbox %s: %w", m.id, err)
		}
		m.p.log.Warn("sandbox agent is gone: provisioning a fresh VM", "session", string(m.id), "addr", a.vm.Addr, "err", err)
		m.lost(a)
	}
}

// ready returns the agent to run a command on, provisioning a VM if the
// sandbox has none.
func (s *Sandbox) ready(ctx context.Context) (*agent, error) {
	m := s.m
	if err := m.p.admit(m.id, s.fence); err != nil {
		return nil, err
	}
	m.mu.Lock()
	a, st := m.agent, m.state
	m.mu.Unlock()
	if st == session.SandboxStopped {
		return nil, session.Errorf(session.CodeNotFound, "sandbox of session %s was destroyed", m.id)
	}
	if a != nil && !m.isVMAsleep() {
		if st == session.SandboxSleeping {
			m.setState(session.SandboxReady) // The agent wakes it with the command.
		}
		return a, nil
	}
	if err := m.acquire(ctx); err != nil {
		return nil, err
	}
	defer m.release()
	if err := m.p.admit(m.id, s.fence); err != nil {
		return nil, err
	}
	if a := m.current(); a != nil {
		if !m.isVMAsleep() {
			return a, nil // Provisioned or woken while this call waited.
		}
		err := m.wakeLocked(ctx, a, s.fence)
		if err == nil {
			return a, nil
		}
		m.p.log.Warn("sandbox VM could not be woken: provisioning a fresh VM", "session", string(m.id), "sandbox", a.req.SandboxID, "err", err)
		m.lost(a)
	}
	if m.getState() == session.SandboxStopped {
		return nil, session.Errorf(session.CodeNotFound, "sandbox of session %s was destroyed", m.id)
	}
	if err := m.provisionLocked(ctx, s.fence); err != nil {
		return nil, err
	}
	return m.current(), nil
}

// Sleep stops every running command, keeping the VM and its workspace;
// with a Sleeper hook it puts the VM to sleep instead, keeping its
// commands too.
func (s *Sandbox) Sleep(ctx context.Context) error {
	m := s.m
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	if err := m.p.admit(m.id, s.fence); err != nil {
		return err
	}
	a := m.current()
	if a == nil {
		if st := m.getState(); st != session.SandboxStopped {
			m.setState(session.SandboxSleeping)
		}
		return nil
	}
	if m.p.sleeper != nil {
		return m.sleepVMLocked(ctx, a, s.fence)
	}
	if err := a.call(ctx, http.MethodPost, "/v1/sandbox/sleep", s.fence, nil, nil); err != nil {
		if isUnreachable(err) {
			m.lost(a)
		}
		return fmt.Errorf("sleep sandbox %s: %w", m.id, err)
	}
	m.setState(session.SandboxSleeping)
	return nil
}

// Destroy stops everything, deletes the workspace and destroys the VM. A
// later Open of the session provisions a fresh VM with an empty workspace.
func (s *Sandbox) Destroy(ctx context.Context) error {
	m := s.m
	if err := m.acquire(ctx); err != nil {
		return err
	}
	defer m.release()
	if err := m.p.admit(m.id, s.fence); err != nil {
		return err
	}
	a := m.current()
	if a == nil {
		m.setState(session.SandboxStopped)
		return nil
	}
	if m.isVMAsleep() {
		// Its agent cannot answer: the VM and its commands go together.
		m.closeProcs()
	} else if err := a.call(ctx, http.MethodDelete, "/v1/sandbox", s.fence, nil, nil); err != nil && !isUnreachable(err) {
		return fmt.Errorf("destroy sandbox %s: %w", m.id, err)
	}
	m.stopModel()
	// An unreachable agent's VM is destroyed all the same.
	if err := m.destroyVM(ctx, a.req); err != nil {
		return err
	}
	m.mu.Lock()
	m.agent = nil
	m.vmAsleep = false
	m.state = session.SandboxStopped
	m.mu.Unlock()
	return nil
}
