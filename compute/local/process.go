package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atriumhq/atrium/compute"
)

// Process is a command running in a sandbox. It implements compute.Process.
type Process struct {
	m         *machine
	pid       int         // the process started: bubblewrap's monitor, or the command in unsafe mode
	sandboxed bool        // runs under bubblewrap
	cmd       *exec.Cmd   // the started process; nil for a command of a zygote
	z         *zygoteExec // the command, when a zygote started it
	leaf      *cgroup     // the command's own cgroup; nil without cgroups
	memory    int64       // the sandbox's memory limit, for Exit.Detail

	stdin          *stdinPipe
	stdout, stderr *os.File
	closePipes     sync.Once

	// done is closed when the command and every process it started are
	// gone; exit and err are set before.
	done chan struct{}
	exit compute.Exit
	err  error

	// mu orders signalling with reaping, so that a pid signalled by pid
	// is never a recycled one.
	mu       sync.Mutex
	exited   bool // guarded by mu: the started process has exited (maybe not reaped)
	finished bool // guarded by mu: everything is gone and cleaned up
}

var _ compute.Process = (*Process)(nil)

// pipes are a command's standard streams: the child's ends and ours.
type pipes struct {
	stdinR, stdinW, stdoutR, stdoutW, stderrR, stderrW *os.File
}

func newPipes() (*pipes, error) {
	var ps pipes
	var err error
	if ps.stdinR, ps.stdinW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("create stdin pipe: %w", err)
	}
	if ps.stdoutR, ps.stdoutW, err = os.Pipe(); err != nil {
		closeAll(ps.stdinR, ps.stdinW)
		return nil, fmt.Errorf("create stdout pipe: %w", err)
	}
	if ps.stderrR, ps.stderrW, err = os.Pipe(); err != nil {
		closeAll(ps.stdinR, ps.stdinW, ps.stdoutR, ps.stdoutW)
		return nil, fmt.Errorf("create stderr pipe: %w", err)
	}
	return &ps, nil
}

// closeChild closes the child's ends: the child has its copies, and
// keeping ours would hide EOF and EPIPE.
func (ps *pipes) closeChild() { closeAll(ps.stdinR, ps.stdoutW, ps.stderrW) }

// closeOurs closes our ends of a command that did not start.
func (ps *pipes) closeOurs() { closeAll(ps.stdinW, ps.stdoutR, ps.stderrR) }

// track registers pr as running and starts its goroutine.
func (m *machine) track(pr *Process) *Process {
	m.mu.Lock()
	m.procs[pr] = true
	m.mu.Unlock()
	go pr.wait()
	return pr
}

// startInZygote has z run req and owns the result. The caller has counted
// the new goroutine in m.p.wg.
func startInZygote(m *machine, z *zygote, leaf *cgroup, req zygoteRequest) (*Process, error) {
	ps, err := newPipes()
	if err != nil {
		return nil, err
	}
	e, err := z.exec(req, [3]*os.File{ps.stdinR, ps.stdoutW, ps.stderrW}, leaf)
	ps.closeChild()
	if err != nil {
		ps.closeOurs()
		return nil, err
	}
	return m.track(&Process{
		m:         m,
		pid:       e.pid,
		sandboxed: true,
		z:         e,
		leaf:      leaf,
		memory:    m.limits.memory,
		stdin:     &stdinPipe{f: ps.stdinW},
		stdout:    ps.stdoutR,
		stderr:    ps.stderrR,
		done:      make(chan struct{}),
	}), nil
}

// start runs /bin/sh with args (see wrapper) and owns the result. The
// caller has counted the new goroutine in m.p.wg.
func start(m *machine, leaf *cgroup, args, env []string, dir string) (*Process, error) {
	ps, err := newPipes()
	if err != nil {
		return nil, err
	}
	newCmd := func(attr *syscall.SysProcAttr) *exec.Cmd {
		return &exec.Cmd{
			Path: "/bin/sh", Args: args, Env: env, Dir: dir,
			Stdin: ps.stdinR, Stdout: ps.stdoutW, Stderr: ps.stderrW,
			SysProcAttr: attr,
		}
	}
	// A session of its own: the command is not in atrium's process group
	// (a Ctrl-C on atrium's terminal is atrium's to handle) and, in
	// unsafe mode, its process group id is its pid.
	attr := &syscall.SysProcAttr{Setsid: true}
	sandboxed := m.p.layout != nil
	if sandboxed && m.p.pidns.Load() {
		// bubblewrap's monitor exits without reaping the sandbox's init,
		// which the host's init then has to reap. As init of a pid
		// namespace of its own, the monitor's orphans stay in it and die
		// and are reaped with it, so a finished command leaves nothing.
		attr.Cloneflags = syscall.CLONE_NEWPID
	}
	cmd := newCmd(attr)
	err = cmd.Start()
	if err != nil && attr.Cloneflags != 0 && errors.Is(err, syscall.EPERM) {
		m.p.pidns.Store(false)
		m.p.log.Info("cannot create pid namespaces: sandboxes' init processes will be reaped by the host's init")
		attr.Cloneflags = 0
		cmd = newCmd(attr)
		err = cmd.Start()
	}
	ps.closeChild()
	if err != nil {
		ps.closeOurs()
		return nil, fmt.Errorf("start: %w", err)
	}
	return m.track(&Process{
		m:         m,
		pid:       cmd.Process.Pid,
		sandboxed: sandboxed,
		cmd:       cmd,
		leaf:      leaf,
		memory:    m.limits.memory,
		stdin:     &stdinPipe{f: ps.stdinW},
		stdout:    ps.stdoutR,
		stderr:    ps.stderrR,
		done:      make(chan struct{}),
	}), nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// Stdin returns the command's standard input. Writes fail once the command
// has exited; Close is safe to call more than once.
func (pr *Process) Stdin() io.WriteCloser { return pr.stdin }

// Stdout returns the command's standard output, read straight from the
// pipe.
func (pr *Process) Stdout() io.Reader { return pr.stdout }

// Stderr returns the command's standard error.
func (pr *Process) Stderr() io.Reader { return pr.stderr }

// Signal delivers sig to every process of the command. Under bubblewrap the
// sandbox's own monitor and init are spared (they end when the command
// does), so a harness that traps SIGTERM can finish cleanly. SIGKILL kills
// every process including those and returns when none is left. Signalling
// a command that has finished does nothing.
func (pr *Process) Signal(sig syscall.Signal) error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.finished {
		return nil
	}
	if sig == syscall.SIGKILL {
		return pr.killLocked()
	}
	pids, err := pr.membersLocked()
	if err != nil {
		return fmt.Errorf("signal command: %w", err)
	}
	sent := 0
	for _, pid := range pids {
		if pr.sandboxed && pr.z == nil && (pid == pr.pid || namespaceInit(pid)) {
			continue
		}
		if err := kill(pid, sig); err != nil {
			return fmt.Errorf("signal command: %w", err)
		}
		sent++
	}
	if sent == 0 && !pr.exited {
		// The command has not started yet: bubblewrap is still building
		// the sandbox, or the process has not joined its cgroup.
		// Stopping the started process stops the command before it
		// starts. (Under bubblewrap, as init of its own pid namespace it
		// ignores signals it has no handler for; the caller's SIGKILL
		// then ends it.)
		if err := pr.killStarted(sig); err != nil {
			return fmt.Errorf("signal command: %w", err)
		}
	}
	return nil
}

// killStarted sends sig to the started process, through its pidfd for a
// command of a zygote (whose pid atrium cannot reap, so it may be reused).
func (pr *Process) killStarted(sig syscall.Signal) error {
	if pr.z != nil {
		err := unix.PidfdSendSignal(pr.z.pidfd, sig, nil, 0)
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return err
	}
	return kill(pr.pid, sig)
}

// membersLocked lists the live processes of the command.
func (pr *Process) membersLocked() ([]int, error) {
	if pr.leaf != nil {
		pids, err := pr.leaf.procs()
		if err != nil {
			return nil, err
		}
		return alive(pids), nil
	}
	// Without cgroups: the process tree while the started process is not
	// reaped (under bubblewrap it holds the whole pid namespace), and in
	// unsafe mode the process group.
	pgid := 0
	if !pr.sandboxed || pr.z != nil {
		// A command of a zygote is, like an unsafe one, the leader of
		// its own session and process group.
		pgid = pr.pid
	}
	return treeMembers(pr.pid, !pr.exited, pgid), nil
}

// killLocked sends SIGKILL to every process of the command until none is
// left.
func (pr *Process) killLocked() error {
	deadline := time.Now().Add(killTimeout)
	direct := false
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		pids, err := pr.membersLocked()
		if err != nil {
			return fmt.Errorf("kill command: %w", err)
		}
		if len(pids) == 0 {
			if pr.exited || direct {
				return nil
			}
			// The started process has not joined its cgroup yet (it
			// does so before it execs the command): kill it directly,
			// then look once more in case it joined and forked first.
			if err := pr.killStarted(syscall.SIGKILL); err != nil {
				return fmt.Errorf("kill command: %w", err)
			}
			direct = true
			time.Sleep(delay)
			continue
		}
		// Stop every process first, so that none can react to another's
		// death (a shell whose children die first would return from
		// `wait` and exit 0 before its own SIGKILL lands).
		for _, pid := range pids {
			_ = kill(pid, syscall.SIGSTOP)
		}
		if pr.leaf != nil {
			err = pr.leaf.killAll()
		} else {
			for _, pid := range pids {
				err = errors.Join(err, kill(pid, syscall.SIGKILL))
			}
		}
		if err != nil {
			return fmt.Errorf("kill command: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill command: processes %v survive SIGKILL", pids)
		}
		time.Sleep(delay)
	}
}

// wait is the command's goroutine: it reaps the started process, kills
// whatever it left behind, and records how it ended.
func (pr *Process) wait() {
	defer pr.m.p.wg.Done()
	var err error
	var exit compute.Exit
	if pr.z != nil {
		ws, ok := pr.z.status()
		pr.mu.Lock()
		pr.exited = true
		pr.mu.Unlock()
		exit = pr.exitOf(ws, ok)
	} else {
		// Wait for the exit without reaping first: until the pid is
		// reaped it cannot be reused, so Signal may still use it.
		werr := waitExited(pr.pid)
		pr.mu.Lock()
		pr.exited = true
		pr.mu.Unlock()
		err = pr.cmd.Wait()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			err = nil
		}
		if err != nil && werr != nil {
			err = fmt.Errorf("wait for command: %w", errors.Join(werr, err))
		} else if err != nil {
			err = fmt.Errorf("wait for command: %w", err)
		}
		ps := pr.cmd.ProcessState
		var ws syscall.WaitStatus
		if ps != nil {
			ws, _ = ps.Sys().(syscall.WaitStatus)
		}
		exit = pr.exitOf(ws, ps != nil)
	}

	pr.mu.Lock()
	if kerr := pr.killLocked(); kerr != nil {
		err = errors.Join(err, kerr)
	}
	exit = pr.withOOM(exit)
	exit = pr.m.p.quota.withFull(pr.m.workspace, pr.m.quotaBytes.Load(), exit)
	if pr.z != nil {
		pr.z.close()
	}
	if pr.leaf != nil {
		if rerr := pr.leaf.remove(); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	pr.finished = true
	pr.mu.Unlock()

	pr.exit, pr.err = exit, err
	pr.m.forget(pr)
	log := pr.m.p.log
	log.Debug("command finished", "session", string(pr.m.id), "pid", pr.pid, "detail", exit.Detail)
	if exit.OOM {
		log.Info("command ran out of memory", "session", string(pr.m.id), "limit_bytes", pr.memory)
	}
	close(pr.done)
}

// exitOf describes how the command ended from its wait status; known is
// false when the status could not be had (for a command of a zygote: the
// zygote died, taking the command with it).
func (pr *Process) exitOf(ws syscall.WaitStatus, known bool) compute.Exit {
	if !known {
		if pr.z != nil {
			return compute.Exit{Code: -1, Lost: true,
				Detail: "lost: the sandbox's zygote, which started the command, died while it ran"}
		}
		return compute.Exit{Code: -1, Detail: "the command's status is unknown"}
	}
	var e compute.Exit
	switch code := ws.ExitStatus(); {
	case ws.Signaled():
		e.Code, e.Signal = -1, ws.Signal()
	case pr.sandboxed && code > 128 && code <= 128+64:
		// bubblewrap's init reports a command killed by signal N as
		// 128+N; a command of a zygote is decoded the same way, so
		// that both paths report alike.
		e.Code, e.Signal = -1, syscall.Signal(code-128)
	default:
		e.Code = code
	}
	switch {
	case e.Signal != 0:
		e.Detail = "killed by " + unix.SignalName(e.Signal)
		if e.Detail == "killed by " {
			e.Detail = fmt.Sprintf("killed by signal %d", int(e.Signal))
		}
	case e.Code == 126:
		e.Detail = "exited with status 126: command not executable"
	case e.Code == 127:
		e.Detail = "exited with status 127: command not found"
	default:
		e.Detail = fmt.Sprintf("exited with status %d", e.Code)
	}
	return e
}

// withOOM adds to e whether the kernel's OOM killer struck the command.
func (pr *Process) withOOM(e compute.Exit) compute.Exit {
	if pr.leaf != nil {
		if n, ok := pr.leaf.oomKills(); ok && n > 0 {
			e.OOM = true
			e.Detail += "; out of memory: the sandbox is limited to " + formatBytes(pr.memory)
		}
	}
	return e
}

// Wait waits until the command and every process it started are gone, then
// closes the pipes. Read Stdout and Stderr to EOF first. It returns an error
// only when the command could not be waited for or cleaned up; how the
// command ended is in the Exit.
func (pr *Process) Wait() (compute.Exit, error) {
	<-pr.done
	pr.closePipes.Do(func() {
		pr.stdin.Close()
		pr.stdout.Close()
		pr.stderr.Close()
	})
	return pr.exit, pr.err
}

// stdinPipe is the write end of a command's standard input.
type stdinPipe struct {
	f    *os.File
	once sync.Once
	err  error
}

func (s *stdinPipe) Write(b []byte) (int, error) { return s.f.Write(b) }

// Close closes the pipe; later calls return the first call's result.
func (s *stdinPipe) Close() error {
	s.once.Do(func() { s.err = s.f.Close() })
	return s.err
}

// formatBytes renders n in the largest binary unit that divides it.
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
