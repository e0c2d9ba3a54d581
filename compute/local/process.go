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
	pid       int  // the process started: bubblewrap's monitor, or the command in unsafe mode
	sandboxed bool // runs under bubblewrap
	cmd       *exec.Cmd
	leaf      *cgroup // the command's own cgroup; nil without cgroups
	memory    int64   // the sandbox's memory limit, for Exit.Detail

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

// start runs /bin/sh with args (see wrapper) and owns the result. The
// caller has counted the new goroutine in m.p.wg.
func start(m *machine, leaf *cgroup, args, env []string, dir string) (*Process, error) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create stdin pipe: %w", err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, stdinW)
		return nil, fmt.Errorf("create stdout pipe: %w", err)
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, stdinW, stdoutR, stdoutW)
		return nil, fmt.Errorf("create stderr pipe: %w", err)
	}
	newCmd := func(attr *syscall.SysProcAttr) *exec.Cmd {
		return &exec.Cmd{
			Path: "/bin/sh", Args: args, Env: env, Dir: dir,
			Stdin: stdinR, Stdout: stdoutW, Stderr: stderrW,
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
	// The child has its copies; keeping ours would hide EOF and EPIPE.
	closeAll(stdinR, stdoutW, stderrW)
	if err != nil {
		closeAll(stdinW, stdoutR, stderrR)
		return nil, fmt.Errorf("start: %w", err)
	}
	pr := &Process{
		m:         m,
		pid:       cmd.Process.Pid,
		sandboxed: sandboxed,
		cmd:       cmd,
		leaf:      leaf,
		memory:    m.limits.memory,
		stdin:     &stdinPipe{f: stdinW},
		stdout:    stdoutR,
		stderr:    stderrR,
		done:      make(chan struct{}),
	}
	m.mu.Lock()
	m.procs[pr] = true
	m.mu.Unlock()
	go pr.wait()
	return pr, nil
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
		if pr.sandboxed && (pid == pr.pid || namespaceInit(pid)) {
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
		if err := kill(pr.pid, sig); err != nil {
			return fmt.Errorf("signal command: %w", err)
		}
	}
	return nil
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
	if !pr.sandboxed {
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
			if err := kill(pr.pid, syscall.SIGKILL); err != nil {
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
	// Wait for the exit without reaping first: until the pid is reaped
	// it cannot be reused, so Signal may still use it.
	werr := waitExited(pr.pid)
	pr.mu.Lock()
	pr.exited = true
	pr.mu.Unlock()
	err := pr.cmd.Wait()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		err = nil
	}
	if err != nil && werr != nil {
		err = fmt.Errorf("wait for command: %w", errors.Join(werr, err))
	} else if err != nil {
		err = fmt.Errorf("wait for command: %w", err)
	}

	pr.mu.Lock()
	if kerr := pr.killLocked(); kerr != nil {
		err = errors.Join(err, kerr)
	}
	exit := pr.exitOf(pr.cmd.ProcessState)
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

// exitOf describes how the command ended.
func (pr *Process) exitOf(ps *os.ProcessState) compute.Exit {
	if ps == nil {
		return compute.Exit{Code: -1, Detail: "the command's status is unknown"}
	}
	var e compute.Exit
	ws, _ := ps.Sys().(syscall.WaitStatus)
	switch code := ws.ExitStatus(); {
	case ws.Signaled():
		e.Code, e.Signal = -1, ws.Signal()
	case pr.sandboxed && code > 128 && code <= 128+64:
		// bubblewrap's init reports a command killed by signal N as
		// 128+N.
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
