// Package vmhost is `atrium vmhost`: a VM host whose sandboxes are QEMU
// microVMs. It serves the HTTP provisioning-hook API of the remote compute
// provider (compute/remote.HTTPHook: POST /create, POST /destroy) plus
// sleep and wake, and boots one microVM per sandbox from an image that
// Build makes from Debian packages: Debian's cloud kernel and an initramfs
// holding busybox, bubblewrap and a static atrium that runs
// `atrium sandbox-agent`.
//
// Each VM's agent token, the host's time and fresh randomness reach the
// guest on a private read-only configuration disk, never on a command line.
// The agent is reached through QEMU user networking: a TCP port of the VM
// host forwarded to the guest's agent. The guest itself reaches only the
// VM host's outbound proxy, which allows Config.Allow (network.go).
//
// QEMU uses KVM when the CPU offers VT-x or AMD-V and /dev/kvm opens, and
// software emulation (TCG) otherwise; Accelerator says which.
package vmhost

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atriumhq/atrium/compute/remote"
)

// Defaults of Config.
const (
	DefaultMaxVMs       = 4
	DefaultMemoryMiB    = 512
	DefaultDiskBytes    = 4 << 30
	DefaultStartTimeout = 90 * time.Second
	DefaultQEMU         = "qemu-system-x86_64"
)

// Config configures a Server.
type Config struct {
	// Dir holds the image (built by Build). Required.
	Dir string
	// StateDir holds the running VMs' state (disks, sockets, consoles);
	// default Dir/vms. It is emptied at start.
	StateDir string
	// Token authenticates the node's calls (Authorization: Bearer).
	// Required.
	Token string
	// Host is the address of this host the VMs' agents are forwarded on,
	// and the one returned to the node. Default 127.0.0.1.
	Host string
	// MaxVMs bounds the VMs running at once; default DefaultMaxVMs.
	MaxVMs int
	// MemoryMiB is each VM's memory when the request names none; default
	// DefaultMemoryMiB.
	MemoryMiB int
	// DiskBytes is the size of each VM's workspace disk (sparse).
	DiskBytes int64
	// StartTimeout bounds a VM's boot to a healthy agent.
	StartTimeout time.Duration
	// Version must equal the image's version when not empty.
	Version string
	// NoSnapshots boots every VM cold instead of cloning a snapshot
	// template of its size.
	NoSnapshots bool
	// QEMU is the QEMU binary; default DefaultQEMU.
	QEMU string
	// Allow is what the VMs may reach besides the node's calls coming in
	// (egress.ParseAllowlist entries: the object store's host:port for
	// the presigned URLs, hosts sandboxes may be allowed to reach). The
	// guest reaches them only through the VM host's outbound proxy; empty
	// allows nothing.
	Allow []string
	// Atrium is the atrium executable QEMU runs as the relay to the
	// outbound proxy (`atrium vmhost relay`); default the running
	// executable.
	Atrium string
	// Logger receives the server's logs; default slog.Default().
	Logger *slog.Logger
}

// Server runs the VMs and serves the provisioning-hook API.
type Server struct {
	cfg   Config
	log   *slog.Logger
	accel string
	qemu  string
	man   Manifest
	// atrium is Config.Atrium resolved; out is the VMs' outbound proxy.
	atrium string
	out    *outbound

	tplMu     sync.Mutex
	templates map[int]*template // guarded by tplMu: by memory size

	mu     sync.Mutex
	vms    map[string]*vm // guarded by mu: by sandbox ID
	starts int64          // guarded by mu
	// startSeconds sums the boot times, for /metrics.
	startSeconds float64 // guarded by mu
	closed       bool    // guarded by mu
}

// New checks QEMU and the image and returns a server. It refuses, with the
// command that fixes it, a missing QEMU, kernel or image, or an image of
// another format or version.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("vmhost: --dir is required")
	}
	if cfg.Token == "" {
		return nil, errors.New("vmhost: a token is required (--token-file)")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.MaxVMs <= 0 {
		cfg.MaxVMs = DefaultMaxVMs
	}
	if cfg.MemoryMiB <= 0 {
		cfg.MemoryMiB = DefaultMemoryMiB
	}
	if cfg.DiskBytes <= 0 {
		cfg.DiskBytes = DefaultDiskBytes
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.QEMU == "" {
		cfg.QEMU = DefaultQEMU
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	allow, err := parseAllow(cfg.Allow)
	if err != nil {
		return nil, err
	}
	qemu, err := exec.LookPath(cfg.QEMU)
	if err != nil {
		return nil, fmt.Errorf("vmhost: QEMU (%s) is not installed: apt-get install qemu-system-x86", cfg.QEMU)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, errors.New("vmhost: mkfs.ext4 is not installed: apt-get install e2fsprogs")
	}
	fix := fmt.Sprintf("atrium vmhost image build --dir %s", cfg.Dir)
	m, err := ReadManifest(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("vmhost: no VM image in %s (%v): build it with %s", cfg.Dir, err, fix)
	}
	files := []string{kernelFile, initramfsFile}
	if len(m.Agents) > 0 {
		files = append(files, toolsFile)
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(cfg.Dir, f)); err != nil {
			return nil, fmt.Errorf("vmhost: the image in %s lacks its %s: rebuild it with %s", cfg.Dir, f, fix)
		}
	}
	if m.Format != ImageFormat {
		return nil, fmt.Errorf("vmhost: the image in %s has format %d, this atrium needs %d: rebuild it with %s", cfg.Dir, m.Format, ImageFormat, fix)
	}
	if cfg.Version != "" && m.Version != cfg.Version {
		return nil, fmt.Errorf("vmhost: the image in %s holds atrium %s, this is atrium %s: rebuild it with %s", cfg.Dir, m.Version, cfg.Version, fix)
	}
	atrium, err := atriumPath(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(cfg.Dir, "vms")
	}
	vmsDir := cfg.StateDir
	// VMs of an earlier run are gone with their QEMU processes.
	os.RemoveAll(vmsDir)
	if err := os.MkdirAll(vmsDir, 0o700); err != nil {
		return nil, fmt.Errorf("vmhost: %w", err)
	}
	out, err := startOutbound(allow, cfg)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: cfg.Logger, accel: Accelerator(), qemu: qemu, man: m, atrium: atrium, out: out,
		vms: make(map[string]*vm), templates: make(map[int]*template)}, nil
}

// Accel is the accelerator the server's VMs use: "kvm" or "tcg".
func (s *Server) Accel() string { return s.accel }

// Manifest is the image the server boots.
func (s *Server) Manifest() Manifest { return s.man }

// ErrCapacity is returned by Create when MaxVMs VMs run.
var ErrCapacity = errors.New("vmhost: at capacity")

var sandboxIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Create boots a VM for req and returns it once its agent is healthy. A VM
// already running for req.Session is returned as is.
func (s *Server) Create(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	if !sandboxIDRe.MatchString(req.SandboxID) {
		return remote.VM{}, fmt.Errorf("vmhost: bad sandbox_id %q: lowercase letters, digits and '-', at most 63", req.SandboxID)
	}
	mem := s.cfg.MemoryMiB
	if req.MemoryBytes > 0 {
		// The guest's kernel and agent need room beside the sandbox.
		mem = max(int(req.MemoryBytes>>20)+128, 256)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return remote.VM{}, errors.New("vmhost: shutting down")
	}
	for _, v := range s.vms {
		if st, _ := v.state(); v.session == string(req.Session) && req.Session != "" && st != "booting" {
			s.mu.Unlock()
			if err := s.Wake(ctx, v.id); err != nil {
				return remote.VM{}, err
			}
			select {
			case <-v.done:
				// Dead: replace it.
				s.Destroy(v.id)
				return s.Create(ctx, req)
			default:
				return remote.VM{ID: v.id, Addr: v.addr, Token: v.token}, nil
			}
		}
	}
	if _, ok := s.vms[req.SandboxID]; ok {
		s.mu.Unlock()
		return remote.VM{}, fmt.Errorf("vmhost: sandbox %s exists", req.SandboxID)
	}
	if len(s.vms) >= s.cfg.MaxVMs {
		n := len(s.vms)
		s.mu.Unlock()
		return remote.VM{}, fmt.Errorf("%w: %d of %d VMs run (--max-vms); try another VM host", ErrCapacity, n, s.cfg.MaxVMs)
	}
	v := &vm{id: req.SandboxID, session: string(req.Session), memMiB: mem, done: make(chan struct{}),
		dir: filepath.Join(s.cfg.StateDir, req.SandboxID)}
	s.vms[v.id] = v // reserves the slot
	s.mu.Unlock()

	start := time.Now()
	err := s.boot(ctx, v)
	if err != nil {
		s.remove(v)
		return remote.VM{}, err
	}
	v.stateMu.Lock()
	v.bootDur = time.Since(start)
	v.stateMu.Unlock()
	s.mu.Lock()
	s.starts++
	s.startSeconds += v.bootDur.Seconds()
	s.mu.Unlock()
	s.log.Info("vm started", "sandbox", v.id, "session", v.session, "addr", v.addr,
		"boot", v.bootDur.Round(time.Millisecond), "memory_mib", mem, "accel", s.accel)
	return remote.VM{ID: v.id, Addr: v.addr, Token: v.token}, nil
}

// boot prepares v's disk and starts its QEMU, as a clone of the snapshot
// template of its size when there is one, then configures it and waits for
// the agent.
func (s *Server) boot(ctx context.Context, v *vm) error {
	if err := os.MkdirAll(v.dir, 0o700); err != nil {
		return fmt.Errorf("vmhost: %w", err)
	}
	tok := make([]byte, 24)
	rand.Read(tok)
	v.token = hex.EncodeToString(tok)
	var tpl *template
	if !s.cfg.NoSnapshots {
		// The template is a boot of its own, with a timeout of its own.
		tctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
		var err error
		if tpl, err = s.template(tctx, v.memMiB); err != nil {
			s.log.Warn("no snapshot template: booting cold", "memory_mib", v.memMiB, "err", err)
		}
		cancel()
	}
	disk := filepath.Join(v.dir, "disk.img")
	var err error
	if tpl != nil {
		// A clone's disk is a copy of the template's, which the
		// snapshot's memory already knows.
		err = copySparse(ctx, tpl.disk, disk)
	} else {
		err = makeDisk(ctx, disk, s.cfg.DiskBytes)
	}
	if err != nil {
		return fmt.Errorf("vmhost: workspace disk: %w", err)
	}
	v.cloned = tpl != nil
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	var lastErr error
	// A port picked free may be taken before QEMU binds it: try again.
	for attempt := 0; attempt < 3; attempt++ {
		incoming := ""
		if tpl != nil {
			incoming = "exec:cat " + tpl.mem
		}
		if lastErr = s.startQEMU(v, incoming); lastErr != nil {
			return lastErr
		}
		if tpl != nil {
			lastErr = resume(ctx, v)
		}
		if lastErr == nil {
			lastErr = waitHealthy(ctx, v)
		}
		if lastErr == nil {
			return nil
		}
		v.stop()
		if !strings.Contains(fmt.Sprint(v.err), "hostfwd") && !strings.Contains(fmt.Sprint(v.err), "in use") {
			break
		}
	}
	return fmt.Errorf("vmhost: VM %s: %w (console: %s)", v.id, lastErr, consoleTail(v))
}

// startQEMU picks v's ports and starts its QEMU.
func (s *Server) startQEMU(v *vm, incoming string) error {
	port, err := freePort(s.cfg.Host)
	if err != nil {
		return fmt.Errorf("vmhost: %w", err)
	}
	cport, err := freePort("127.0.0.1")
	if err != nil {
		return fmt.Errorf("vmhost: %w", err)
	}
	v.addr = net.JoinHostPort(s.cfg.Host, strconv.Itoa(port))
	v.cfgAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(cport))
	return s.runQEMU(v, incoming)
}

// runQEMU starts v's QEMU on the ports v has.
func (s *Server) runQEMU(v *vm, incoming string) error {
	done := make(chan struct{})
	cmd := exec.Command(s.qemu, s.qemuArgs(v, incoming)...)
	stderr := &limitedBuf{max: 8 << 10}
	cmd.Stdout, cmd.Stderr = io.Discard, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("vmhost: start QEMU: %w", err)
	}
	v.stateMu.Lock()
	v.cmd, v.done, v.err = cmd, done, nil
	v.started = time.Now()
	v.stateMu.Unlock()
	go func(done chan struct{}) {
		err := cmd.Wait()
		if s := strings.TrimSpace(stderr.String()); s != "" {
			err = fmt.Errorf("%v: %s", err, s)
		}
		v.err = err
		close(done)
	}(v.done)
	return nil
}

// remove stops v and deletes its state.
func (s *Server) remove(v *vm) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stop()
	os.RemoveAll(v.dir)
	s.mu.Lock()
	if s.vms[v.id] == v {
		delete(s.vms, v.id)
	}
	s.mu.Unlock()
}

// Destroy stops and deletes the VM id; an unknown id is not an error.
func (s *Server) Destroy(id string) {
	s.mu.Lock()
	v := s.vms[id]
	s.mu.Unlock()
	if v == nil {
		return
	}
	s.remove(v)
	s.log.Info("vm destroyed", "sandbox", id)
}

// lookup returns the VM id or an error naming it.
func (s *Server) lookup(id string) (*vm, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[id]
	if v == nil {
		return nil, fmt.Errorf("vmhost: no VM %q", id)
	}
	return v, nil
}

// Sleep pauses the VM id and saves its memory to the VM host's disk, then
// stops its QEMU: the guest's processes are kept in the saved state, and
// the VM uses no memory or CPU until Wake. When saving fails (the disk is
// full), the VM keeps running and the error is returned.
func (s *Server) Sleep(ctx context.Context, id string) error {
	v, err := s.lookup(id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sleeping {
		return nil
	}
	mem := filepath.Join(v.dir, "sleep.mem")
	if err := v.saveTo(ctx, mem); err != nil {
		os.Remove(mem)
		if _, cerr := v.qmp(context.WithoutCancel(ctx), "cont", nil); cerr != nil {
			s.log.Warn("vm sleep failed and resuming it failed too", "sandbox", id, "err", cerr)
		}
		return fmt.Errorf("vmhost: sleep %s: save the VM: %w (the VM keeps running)", id, err)
	}
	v.setSleeping(true)
	v.stop()
	s.log.Info("vm asleep", "sandbox", id)
	return nil
}

// Wake restores the VM id from its saved state, on the same ports.
func (s *Server) Wake(ctx context.Context, id string) error {
	v, err := s.lookup(id)
	if err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.sleeping {
		return nil
	}
	mem := filepath.Join(v.dir, "sleep.mem")
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	if err := s.runQEMU(v, "exec:cat "+mem); err != nil {
		return err
	}
	if err := resume(ctx, v); err != nil {
		v.stop()
		return fmt.Errorf("vmhost: wake %s: %w", id, err)
	}
	// The guest's clock stood still while it slept.
	send(v, clockMessage())
	if err := waitHealthy(ctx, v); err != nil {
		v.stop()
		return fmt.Errorf("vmhost: wake %s: %w", id, err)
	}
	if err := waitClock(ctx, v); err != nil {
		v.stop()
		return fmt.Errorf("vmhost: wake %s: %w", id, err)
	}
	v.setSleeping(false)
	os.Remove(mem)
	s.log.Info("vm awake", "sandbox", id)
	return nil
}

// VMStatus describes one VM in Status (the wire shape is declared by the
// remote provider, the client of this API).
type VMStatus = remote.VMInfo

// Status describes the host and its VMs: GET /status.
type Status = remote.VMHostStatus

// Status returns the host's state.
func (s *Server) Status() Status {
	s.mu.Lock()
	vms := make([]*vm, 0, len(s.vms))
	for _, v := range s.vms {
		vms = append(vms, v)
	}
	s.mu.Unlock()
	st := Status{Accel: s.accel, Version: s.man.Version, Kernel: s.man.Kernel, MaxVMs: s.cfg.MaxVMs, VMs: []VMStatus{}}
	for _, v := range vms {
		state, pid := v.state()
		var rss int64
		if pid != 0 {
			rss = processRSS(pid)
		}
		if state == "booting" {
			st.VMs = append(st.VMs, VMStatus{ID: v.id, Session: v.session, State: state, MemoryMiB: v.memMiB})
			continue
		}
		st.VMs = append(st.VMs, VMStatus{ID: v.id, Session: v.session, Addr: v.addr, State: state,
			MemoryMiB: v.memMiB, Started: v.started, BootMs: v.bootDur.Milliseconds(), RSSBytes: rss})
	}
	slices.SortFunc(st.VMs, func(a, b VMStatus) int { return strings.Compare(a.ID, b.ID) })
	return st
}

// processRSS is the resident memory of pid, 0 if unknown.
func processRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// Close stops every VM.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	vms := make([]*vm, 0, len(s.vms))
	for _, v := range s.vms {
		vms = append(vms, v)
	}
	s.mu.Unlock()
	for _, v := range vms {
		s.remove(v)
	}
	s.out.close()
}

// Handler serves the API: POST /create and /destroy (the HookRequest as
// JSON, as remote.HTTPHook sends it), POST /sleep and /wake
// ({"sandbox_id"}), GET /status, all with the bearer token; GET /metrics
// and GET /healthz without.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("GET /status", s.authed(func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.Status()) }))
	mux.HandleFunc("POST /create", s.authed(func(w http.ResponseWriter, r *http.Request) {
		var req remote.HookRequest
		if err := decode(r, &req); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		vm, err := s.Create(r.Context(), req)
		switch {
		case errors.Is(err, ErrCapacity):
			writeErr(w, http.StatusServiceUnavailable, err)
		case err != nil && strings.Contains(err.Error(), "bad sandbox_id"):
			writeErr(w, http.StatusBadRequest, err)
		case err != nil:
			s.log.Warn("vm create failed", "sandbox", req.SandboxID, "err", err)
			writeErr(w, http.StatusInternalServerError, err)
		default:
			writeJSON(w, http.StatusCreated, vm)
		}
	}))
	mux.HandleFunc("POST /destroy", s.authed(func(w http.ResponseWriter, r *http.Request) {
		var req remote.HookRequest
		if err := decode(r, &req); err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		s.Destroy(req.SandboxID)
		writeJSON(w, http.StatusOK, map[string]string{"destroyed": req.SandboxID})
	}))
	for _, op := range []string{"sleep", "wake"} {
		mux.HandleFunc("POST /"+op, s.authed(func(w http.ResponseWriter, r *http.Request) {
			var req remote.HookRequest
			if err := decode(r, &req); err != nil {
				writeErr(w, http.StatusBadRequest, err)
				return
			}
			f := s.Sleep
			if op == "wake" {
				f = s.Wake
			}
			if err := f(r.Context(), req.SandboxID); err != nil {
				code := http.StatusInternalServerError
				if strings.Contains(err.Error(), "no VM") {
					code = http.StatusNotFound
				}
				writeErr(w, code, err)
				return
			}
			writeJSON(w, http.StatusOK, map[string]string{op: req.SandboxID})
		}))
	}
	return mux
}

func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	want := []byte("Bearer " + s.cfg.Token)
	return func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeErr(w, http.StatusUnauthorized, errors.New("vmhost: missing or wrong bearer token"))
			return
		}
		h(w, r)
	}
}

func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	st := s.Status()
	counts := map[string]int{"booting": 0, "running": 0, "sleeping": 0, "exited": 0}
	var rss int64
	for _, v := range st.VMs {
		counts[v.State]++
		rss += v.RSSBytes
	}
	s.mu.Lock()
	starts, secs := s.starts, s.startSeconds
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "# HELP atrium_vmhost_vms VMs on this VM host by state.\n# TYPE atrium_vmhost_vms gauge\n")
	for _, k := range []string{"booting", "running", "sleeping", "exited"} {
		fmt.Fprintf(w, "atrium_vmhost_vms{state=%q} %d\n", k, counts[k])
	}
	fmt.Fprintf(w, "# HELP atrium_vmhost_max_vms The VM host's capacity (--max-vms).\n# TYPE atrium_vmhost_max_vms gauge\natrium_vmhost_max_vms %d\n", st.MaxVMs)
	fmt.Fprintf(w, "# HELP atrium_vmhost_vm_rss_bytes Host memory resident in the VMs' QEMU processes.\n# TYPE atrium_vmhost_vm_rss_bytes gauge\natrium_vmhost_vm_rss_bytes %d\n", rss)
	fmt.Fprintf(w, "# HELP atrium_vmhost_start_seconds Boot to a healthy agent.\n# TYPE atrium_vmhost_start_seconds summary\natrium_vmhost_start_seconds_sum %g\natrium_vmhost_start_seconds_count %d\n", secs, starts)
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("vmhost: bad request body: %w", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// limitedBuf keeps the first max bytes written to it.
type limitedBuf struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (l *limitedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
