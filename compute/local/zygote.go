package local

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atriumhq/atrium/compute"
)

// A warm sandbox runs its commands through a zygote: one long-lived
// bubblewrap per sandbox, with the same isolation as a per-command one,
// whose payload is this executable in zygote mode (ZygoteName). It reads
// requests from a Unix socket inherited as fd 3 and forks each command in
// the sandbox's existing namespaces, which saves bubblewrap's start-up (a
// fresh set of namespaces and mounts, ~10–25 ms) on every command.
//
// Per request the host sends, on the control socket, a length-prefixed JSON
// zygoteRequest with four descriptors: the command's stdin, stdout and
// stderr and one end of a fresh SOCK_SEQPACKET pair. On that pair the
// zygote answers with the command's pidfd (the host reads the command's
// host pid from it and moves it into its leaf cgroup), waits for the
// host's "go" before the command execs (so nothing it runs escapes the
// cgroup), and finally sends the command's wait status. A pair that ends
// without a status means the zygote died: the command is lost.

// ZygoteName is the name under which an executable acts as a sandbox's
// zygote. Every binary that links this package acts as one when started
// under this name (the package's init function takes over the process),
// so atrium and test binaries need no hook in main.
const ZygoteName = "atrium-sandbox-zygote"

// zygoteProbeOutput is what `atrium-sandbox-zygote -probe` prints.
const zygoteProbeOutput = ZygoteName + " ok\n"

// zygoteExe is how a sandbox's shell runs the zygote: the executable is
// not bound into the sandbox but inherited open as fd 4, so nothing of it
// shows in the sandbox's file system.
const zygoteExe = "/proc/self/fd/4"

// zygoteReady is the first message of a zygote on its control socket.
const zygoteReady = "ready"

// zygoteCgroupSuffix names a zygote's cgroup: <session>.zygote, beside
// the sandbox's (session IDs hold no dots). Outside the sandbox's cgroup,
// the kernel's OOM killer never picks the zygote for a command's excess
// (the zygote is the sandbox's largest process until a command grows), and
// its few tasks do not count against the sandbox's limits. Commands cannot
// make it work for them: it is not dumpable, so they cannot ptrace it.
const zygoteCgroupSuffix = ".zygote"

// zygoteCgroupLocked returns the cgroup of the sandbox's zygote, or nil
// without cgroups.
func (m *machine) zygoteCgroupLocked() *cgroup {
	if m.cg == nil || m.p.cg == nil {
		return nil
	}
	c := m.p.cg.parent.child(string(m.id) + zygoteCgroupSuffix)
	return &c
}

// removeZygoteCgroupLocked kills whatever is left in the zygote's cgroup
// and removes it. No zygote may run.
func (m *machine) removeZygoteCgroupLocked() error {
	zc := m.zygoteCgroupLocked()
	if zc == nil {
		return nil
	}
	if err := killCgroup(*zc); err != nil {
		return err
	}
	return zc.remove()
}

// zygoteStartTimeout bounds how long a zygote may take to be ready.
const zygoteStartTimeout = 10 * time.Second

// maxZygoteRequest bounds a request's size (argv and environment).
const maxZygoteRequest = 8 << 20

// zygoteGate is the script through which the zygote starts a command: it
// waits for the host's go on fd 3 (the command is in its cgroup by then),
// closes it, and execs the command, so that a missing or non-executable
// command ends with the shell's status 127 or 126.
const zygoteGate = `IFS= read -r g <&3; exec 3<&-; [ "$g" = go ] || exit 125; exec "$@"`

// zygoteRequest is one command for the zygote.
type zygoteRequest struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// zygoteReply is the zygote's answer to a request: the command's pid in the
// sandbox (with its pidfd attached), or why it did not start; later the
// command's wait status.
type zygoteReply struct {
	Pid    int    `json:"pid,omitempty"`
	Error  string `json:"error,omitempty"`
	Status *int   `json:"status,omitempty"`
}

// init is a re-exec entry point (like moby's reexec), the one exception to
// "no init side effects" in this tree: every binary that links this package
// (atrium, and each test binary that opens sandboxes) can then be a
// sandbox's zygote without its main or TestMain knowing. It does nothing
// unless this process was started as a zygote.
func init() {
	if isZygote(os.Args) {
		// syscall.Exit skips deferred work and the race detector's pause
		// at exit; the zygote has nothing to flush.
		syscall.Exit(runZygote(os.Args[1:]))
	}
}

// isZygote reports whether a process started with args is a zygote:
// started under ZygoteName (the probe), or with it as the only argument
// (in a sandbox, where argv[0] is zygoteExe).
func isZygote(args []string) bool {
	return (len(args) > 0 && filepath.Base(args[0]) == ZygoteName) ||
		(len(args) == 2 && args[0] == zygoteExe && args[1] == ZygoteName)
}

// runZygote is the zygote's main.
func runZygote(args []string) int {
	if len(args) == 1 && args[0] == "-probe" {
		io.WriteString(os.Stdout, zygoteProbeOutput)
		return 0
	}
	if len(args) != 1 || args[0] != ZygoteName {
		io.WriteString(os.Stderr, "atrium: "+ZygoteName+" is started by atrium's local sandboxes only\n")
		return 2
	}
	unix.Close(4) // The executable itself.
	// Commands run as the zygote's uid: without this they could ptrace it
	// (or read its memory) and make it act for them.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "atrium: sandbox zygote: %v\n", err)
		return 1
	}
	ctl := os.NewFile(3, "control")
	if _, err := unix.Write(3, []byte(zygoteReady)); err != nil {
		fmt.Fprintf(os.Stderr, "atrium: sandbox zygote: %v\n", err)
		return 1
	}
	// The zygote's own streams are the host's log pipe: keep them, but
	// give commands only what each request brings.
	for {
		req, fds, err := readZygoteRequest(ctl)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0 // The host closed the control socket.
			}
			fmt.Fprintf(os.Stderr, "atrium: sandbox zygote: %v\n", err)
			return 1
		}
		go serveZygote(req, fds)
	}
}

// readZygoteRequest reads one request and its four descriptors.
func readZygoteRequest(ctl *os.File) (zygoteRequest, []int, error) {
	var req zygoteRequest
	hdr := make([]byte, 4)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, err := recvmsg(int(ctl.Fd()), hdr, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return req, nil, fmt.Errorf("read request: %w", err)
	}
	if n == 0 {
		return req, nil, io.EOF
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	if n < 4 {
		if _, err := io.ReadFull(ctl, hdr[n:]); err != nil {
			closeFds(fds)
			return req, nil, fmt.Errorf("read request: %w", err)
		}
	}
	size := binary.BigEndian.Uint32(hdr)
	if size > maxZygoteRequest || len(fds) != 4 {
		closeFds(fds)
		return req, nil, fmt.Errorf("malformed request (%d bytes, %d descriptors)", size, len(fds))
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(ctl, body); err != nil {
		closeFds(fds)
		return req, nil, fmt.Errorf("read request: %w", err)
	}
	if err := json.Unmarshal(body, &req); err != nil {
		closeFds(fds)
		return req, nil, fmt.Errorf("decode request: %w", err)
	}
	return req, fds, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// serveZygote starts one command and reports on it over fds[3].
func serveZygote(req zygoteRequest, fds []int) {
	conn := fds[3]
	defer unix.Close(conn)
	reply := func(r zygoteReply, rights []byte) error {
		b, _ := json.Marshal(r)
		return sendmsg(conn, b, rights)
	}
	gateR, gateW, err := os.Pipe()
	if err != nil {
		closeFds(fds[:3])
		_ = reply(zygoteReply{Error: err.Error()}, nil)
		return
	}
	pidfd := -1
	argv := append([]string{"sh", "-c", zygoteGate, "sh"}, req.Argv...)
	pid, err := syscall.ForkExec("/bin/sh", argv, &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   req.Env,
		Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2]), gateR.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd},
	})
	closeFds(fds[:3])
	gateR.Close()
	defer gateW.Close()
	if err != nil {
		_ = reply(zygoteReply{Error: fmt.Sprintf("start %s in %s: %v", req.Argv[0], req.Dir, err)}, nil)
		return
	}
	err = reply(zygoteReply{Pid: pid}, unix.UnixRights(pidfd))
	unix.Close(pidfd)
	if err == nil {
		buf := make([]byte, 16)
		if n, _, rerr := recvmsg(conn, buf, nil, 0); rerr == nil && string(buf[:n]) == "go" {
			_, _ = gateW.Write([]byte("go\n"))
		}
	}
	gateW.Close() // Without go, the gate exits with status 125.
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	status := int(ws)
	_ = reply(zygoteReply{Status: &status}, nil)
}

// zygote is the host's handle on a sandbox's zygote.
type zygote struct {
	cmd  *exec.Cmd
	ctl  *os.File       // the host's end of the control socket
	opts sandboxOptions // what the sandbox was built with
	ws   fileID         // the workspace directory bound at /workspace
	rw   []fileID       // the writable mounts' directories (an agent's home, which a restore swaps too)
	dead chan struct{}  // closed when the zygote's bubblewrap has exited
	once sync.Once
}

// alive reports whether z still runs.
func (z *zygote) alive() bool {
	select {
	case <-z.dead:
		return false
	default:
		return true
	}
}

// stop kills the zygote (and with it every process of its sandbox) and
// waits until it is gone.
func (z *zygote) stop() {
	z.once.Do(func() {
		_ = z.ctl.Close()
		_ = z.cmd.Process.Kill()
	})
	<-z.dead
}

// startZygoteLocked starts the sandbox's zygote with options o. The caller
// holds the lifecycle lock.
func (m *machine) startZygoteLocked(o sandboxOptions) (*zygote, error) {
	p := m.p
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create zygote socket: %w", err)
	}
	ctl, child := os.NewFile(uintptr(pair[0]), "zygote"), os.NewFile(uintptr(pair[1]), "zygote")
	defer child.Close()
	var files []string
	if zc := m.zygoteCgroupLocked(); zc != nil {
		if err := zc.create(); err != nil {
			ctl.Close()
			return nil, err
		}
		files = zc.procsFiles()
	}
	ws, err := statID(m.workspace)
	if err != nil {
		ctl.Close()
		return nil, fmt.Errorf("start zygote: %w", err)
	}
	exe, err := os.Open(p.forwarder)
	if err != nil {
		ctl.Close()
		return nil, fmt.Errorf("start zygote: %w", err)
	}
	defer exe.Close()
	target := append(p.hostID.command(p.bwrap), p.layout.args(m.workspace, Workspace, o, []string{zygoteExe, ZygoteName})...)
	attr := &syscall.SysProcAttr{Setsid: true}
	if p.pidns.Load() {
		attr.Cloneflags = syscall.CLONE_NEWPID
	}
	cmd := &exec.Cmd{
		// One processor is plenty for forking commands, and keeps the
		// zygote's threads (which count against the pids limit) few.
		Path: "/bin/sh", Args: wrapper(files, target), Env: environ(Workspace, []string{"GOMAXPROCS=1"}), Dir: "/",
		ExtraFiles: []*os.File{child, exe}, SysProcAttr: attr,
	}
	logw := &zygoteLog{m: m}
	cmd.Stdout, cmd.Stderr = logw, logw
	if err := cmd.Start(); err != nil {
		ctl.Close()
		return nil, fmt.Errorf("start zygote: %w", err)
	}
	child.Close()
	z := &zygote{cmd: cmd, ctl: ctl, opts: o, ws: ws, rw: writableIDs(o.mounts), dead: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = cmd.Wait()
		close(z.dead)
	}()
	// The zygote says it is ready; bubblewrap failing ends it instead.
	// A zygote that stops answering (a command may SIGSTOP it) must not
	// hang Exec: the control socket's sends and the answers to requests
	// time out.
	tv := unix.NsecToTimeval(zygoteStartTimeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(pair[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(pair[0], unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	buf := make([]byte, len(zygoteReady))
	_, err = io.ReadFull(ctl, buf)
	if err != nil || string(buf) != zygoteReady {
		z.stop()
		return nil, fmt.Errorf("start zygote: it did not become ready: %s", logw.text())
	}
	return z, nil
}

// writableIDs returns the identities of the writable mounts' directories
// (nil entries for those that cannot be read).
func writableIDs(mounts []compute.Mount) []fileID {
	var ids []fileID
	for _, mt := range mounts {
		if !mt.ReadOnly {
			id, _ := statID(mt.Host)
			ids = append(ids, id)
		}
	}
	return ids
}

// fileID identifies a file on the host.
type fileID struct{ dev, ino uint64 }

// statID returns the identity of the file at p.
func statID(p string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fileID{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}

// zygoteLog collects what a zygote prints, for the error that says why it
// did not start, and logs it.
type zygoteLog struct {
	m   *machine
	mu  sync.Mutex
	buf strings.Builder
}

func (l *zygoteLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	if l.buf.Len() < 4096 {
		l.buf.Write(b[:min(len(b), 4096-l.buf.Len())])
	}
	l.mu.Unlock()
	l.m.p.log.Debug("sandbox zygote output", "session", string(l.m.id), "text", strings.TrimSpace(string(b)))
	return len(b), nil
}

func (l *zygoteLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := strings.TrimSpace(l.buf.String()); s != "" {
		return s
	}
	return "no output"
}

// errZygoteGone marks an Exec that failed because the zygote died or
// stopped answering, not because of the command.
var errZygoteGone = errors.New("the sandbox's zygote is gone")

// zygoteExec is a command started by a zygote: its host pid, its pidfd and
// the socket on which its status arrives.
type zygoteExec struct {
	pid   int
	pidfd int
	conn  int
}

// exec sends req to the zygote, waits until the command is forked, moves
// it into leaf (if any), and lets it run. The three files are the
// command's ends of its stdio pipes.
func (z *zygote) exec(req zygoteRequest, stdio [3]*os.File, leaf *cgroup) (*zygoteExec, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create command socket: %w", err)
	}
	conn := pair[0]
	tv := unix.NsecToTimeval(zygoteStartTimeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(conn, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	fail := func(err error) (*zygoteExec, error) {
		unix.Close(conn)
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		unix.Close(pair[1])
		return fail(fmt.Errorf("encode request: %w", err))
	}
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	rights := unix.UnixRights(int(stdio[0].Fd()), int(stdio[1].Fd()), int(stdio[2].Fd()), pair[1])
	err = sendmsg(int(z.ctl.Fd()), msg, rights)
	unix.Close(pair[1])
	if err == nil {
		_, err = z.ctl.Write(body)
	}
	if err != nil {
		return fail(fmt.Errorf("send request to zygote: %w: %w", errZygoteGone, err))
	}
	var r zygoteReply
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, err := recvmsg(conn, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil || n == 0 {
		return fail(fmt.Errorf("read zygote's answer: %w: %w", errZygoteGone, errors.Join(err, io.ErrUnexpectedEOF)))
	}
	pidfd := -1
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if fds, err := unix.ParseUnixRights(&m); err == nil {
				for _, fd := range fds {
					if pidfd < 0 {
						pidfd = fd
					} else {
						unix.Close(fd)
					}
				}
			}
		}
	}
	if err := json.Unmarshal(buf[:n], &r); err != nil || r.Error != "" || pidfd < 0 {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if r.Error != "" {
			return fail(errors.New(r.Error))
		}
		return fail(errors.New("malformed answer from zygote"))
	}
	hostPid, err := pidfdPid(pidfd)
	if err == nil && leaf != nil {
		for _, f := range leaf.procsFiles() {
			if err = writeCgroupFile(f, strconv.Itoa(hostPid)); err != nil {
				break
			}
		}
	}
	if err != nil {
		// Without go the gate exits with status 125 before the command
		// runs; its status still arrives.
		_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		unix.Close(pidfd)
		return fail(fmt.Errorf("enter the command's cgroup: %w", err))
	}
	// The status may take as long as the command runs.
	tv = unix.Timeval{}
	_ = unix.SetsockoptTimeval(conn, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := sendmsg(conn, []byte("go"), nil); err != nil {
		_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		unix.Close(pidfd)
		return fail(fmt.Errorf("start command: %w", err))
	}
	return &zygoteExec{pid: hostPid, pidfd: pidfd, conn: conn}, nil
}

// status waits for the command's wait status; ok is false when the zygote
// died first.
func (e *zygoteExec) status() (ws syscall.WaitStatus, ok bool) {
	buf := make([]byte, 256)
	for {
		n, _, err := recvmsg(e.conn, buf, nil, 0)
		if err != nil || n == 0 {
			return 0, false
		}
		var r zygoteReply
		if json.Unmarshal(buf[:n], &r) == nil && r.Status != nil {
			return syscall.WaitStatus(*r.Status), true
		}
	}
}

// close releases the command's pidfd and socket.
func (e *zygoteExec) close() {
	unix.Close(e.pidfd)
	unix.Close(e.conn)
}

// pidfdPid returns the host pid of the process that pidfd refers to.
func pidfdPid(pidfd int) (int, error) {
	f, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		return 0, fmt.Errorf("read pidfd: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || pid <= 0 {
				return 0, errors.New("the command exited before it started")
			}
			return pid, nil
		}
	}
	return 0, errors.New("read pidfd: no pid")
}

// recvmsg is unix.Recvmsg restarted when a signal interrupts it. The Go
// runtime signals its threads (to preempt goroutines), and a socket with a
// receive timeout (SO_RCVTIMEO) fails with EINTR even under SA_RESTART.
func recvmsg(fd int, p, oob []byte, flags int) (n, oobn int, err error) {
	for {
		n, oobn, _, _, err = unix.Recvmsg(fd, p, oob, flags)
		if !errors.Is(err, unix.EINTR) {
			return n, oobn, err
		}
	}
}

// sendmsg is unix.Sendmsg restarted when a signal interrupts it (see
// recvmsg; SO_SNDTIMEO behaves the same).
func sendmsg(fd int, p, oob []byte) error {
	for {
		err := unix.Sendmsg(fd, p, oob, nil, 0)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
