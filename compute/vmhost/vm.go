package vmhost

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atriumhq/atrium/compute"
)

// agentPort is where the agent listens inside the guest; configPort is
// where its init waits for the VM's configuration.
const (
	agentPort  = 7070
	configPort = 7071
)

// vm is one QEMU microVM running a sandbox agent.
type vm struct {
	id      string
	session string
	dir     string
	addr    string // host:port the node reaches the agent at
	cfgAddr string // loopback host:port of the guest's configuration port
	token   string
	memMiB  int
	started time.Time
	bootDur time.Duration
	cloned  bool // started from a snapshot template

	cmd  *exec.Cmd
	done chan struct{} // closed when QEMU exited
	err  error         // QEMU's exit, set before done is closed

	// mu is held while the VM sleeps or wakes.
	mu       sync.Mutex
	sleeping bool // guarded by mu; set under sleepMu too
	// stateMu guards the writes of sleeping, cmd, done and bootDur, so
	// Status reads them without waiting for a sleep or wake.
	stateMu sync.Mutex
}

// state is what Status reports of v.
func (v *vm) state() (state string, pid int) {
	v.stateMu.Lock()
	defer v.stateMu.Unlock()
	state = "booting"
	if v.bootDur > 0 {
		state = "running"
	}
	select {
	case <-v.done:
		state = "exited"
	default:
	}
	if v.sleeping {
		state = "sleeping"
	}
	if state == "running" && v.cmd != nil && v.cmd.Process != nil {
		pid = v.cmd.Process.Pid
	}
	return state, pid
}

func (v *vm) setSleeping(b bool) {
	v.stateMu.Lock()
	v.sleeping = b
	v.stateMu.Unlock()
}

// Accelerator returns the QEMU accelerator this host offers: "kvm" when
// /dev/kvm opens and the CPU has VT-x or AMD-V, "tcg" (software emulation)
// otherwise.
func Accelerator() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	hasVirt := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "flags") {
			for _, f := range strings.Fields(l) {
				if f == "vmx" || f == "svm" {
					hasVirt = true
				}
			}
			break
		}
	}
	if !hasVirt {
		return "tcg"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	return "kvm"
}

// tscKHz is the host's TSC frequency as the microvm guest needs it
// (tsc_early_khz): without a PIT calibration the guest's clock is wrong.
func tscKHz() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return int(mhz * 1000)
			}
		}
	}
	return 2000000
}

// configMessage is the VM's configuration: a magic line, the agent's
// token, the host's time and fresh randomness.
func configMessage(token string) []byte {
	seed := make([]byte, 64)
	rand.Read(seed)
	return fmt.Appendf(nil, "ATRIUMCFG1\n%s\n%d\n%s\n", token, time.Now().Unix(), hex.EncodeToString(seed))
}

// clockMessage sets a running guest's clock to the host's and stirs its
// random pool.
func clockMessage() []byte {
	seed := make([]byte, 64)
	rand.Read(seed)
	return fmt.Appendf(nil, "ATRIUMTIME\n%d\n%s\n", time.Now().Unix(), hex.EncodeToString(seed))
}

// sendConfig sends v its configuration over the port forwarded from the
// host's loopback to the guest's init. QEMU's user networking accepts the
// connection even when the guest does not listen yet, so the caller
// repeats it until the agent answers.
func sendConfig(v *vm) { send(v, configMessage(v.token)) }

// send sends msg to v's configuration port.
func send(v *vm, msg []byte) {
	conn, err := net.DialTimeout("tcp", v.cfgAddr, 300*time.Millisecond)
	if err != nil {
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	conn.Write(msg)
	conn.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, conn)
}

// makeDisk makes the VM's workspace disk: a sparse ext4 file.
func makeDisk(ctx context.Context, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if out, err := command(ctx, "", "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", path); err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, out)
	}
	return nil
}

// qemuArgs are the arguments of the QEMU process of v.
func (s *Server) qemuArgs(v *vm, incoming string) []string {
	img := s.cfg.Dir
	a := []string{
		"-M", "microvm,pit=on,pic=off,rtc=on,isa-serial=on",
		"-accel", s.accel,
		"-cpu", "max",
		"-m", strconv.Itoa(v.memMiB),
		"-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-chardev", "file,id=con,path=" + filepath.Join(v.dir, "console.log"),
		"-serial", "chardev:con",
		"-kernel", filepath.Join(img, kernelFile),
		"-initrd", filepath.Join(img, initramfsFile),
		"-append", fmt.Sprintf("console=ttyS0 quiet panic=-1 reboot=t tsc_early_khz=%d rdinit=/init", tscKHz()),
		"-drive", "id=ws,file=" + filepath.Join(v.dir, "disk.img") + ",format=raw,if=none,cache=unsafe",
		"-device", "virtio-blk-device,drive=ws",
		// restrict=on: the guest reaches only the outbound proxy
		// (guestfwd); the node reaches the agent and the configuration
		// port (hostfwd).
		"-netdev", "user,id=n0,restrict=on,hostfwd=tcp:" + v.addr + "-:" + strconv.Itoa(agentPort) +
			",hostfwd=tcp:" + v.cfgAddr + "-:" + strconv.Itoa(configPort) + "," + s.guestfwd(),
		"-device", "virtio-net-device,netdev=n0",
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
		"-qmp", "unix:" + filepath.Join(v.dir, "qmp.sock") + ",server=on,wait=off",
	}
	if len(s.man.Agents) > 0 {
		// The tools disk (node and the agents), shared read-only by
		// every VM; the guest finds it by its label.
		a = append(a,
			"-drive", "id=tools,file="+filepath.Join(img, toolsFile)+",format=raw,if=none,readonly=on",
			"-device", "virtio-blk-device,drive=tools")
	}
	if incoming != "" {
		a = append(a, "-incoming", incoming)
	}
	return a
}

// freePort picks a free TCP port on host.
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitHealthy polls the agent's health check with short timeouts (QEMU's
// user networking accepts connections before the guest listens) until it
// answers, QEMU exits or ctx ends.
func waitHealthy(ctx context.Context, v *vm) error {
	client := &http.Client{Timeout: 700 * time.Millisecond, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		sendConfig(v)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+v.addr+"/healthz", nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-v.done:
			return fmt.Errorf("QEMU exited during boot: %v", v.err)
		case <-ctx.Done():
			return fmt.Errorf("the guest's agent did not become healthy: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// clockSkewMax is how far a woken guest's clock may be from the host's:
// the clock message carries whole seconds.
const clockSkewMax = 1500 * time.Millisecond

// waitClock waits until the woken guest v tells the host's time, sending
// the clock message again while it does not: the first one can reach a
// guest whose listener has not run since the wake, and QEMU's user
// networking accepts the connection anyway. An agent that does not report
// its clock (older than compute.AgentHealth.TimeMS) is not waited for.
func waitClock(ctx context.Context, v *vm) error {
	client := &http.Client{Timeout: 700 * time.Millisecond, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var skew time.Duration
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+v.addr+"/healthz", nil)
		resp, err := client.Do(req)
		if err == nil {
			var h compute.AgentHealth
			derr := json.NewDecoder(resp.Body).Decode(&h)
			resp.Body.Close()
			if derr == nil {
				if h.TimeMS == 0 {
					return nil
				}
				skew = time.Since(time.UnixMilli(h.TimeMS)).Abs()
				if skew <= clockSkewMax {
					return nil
				}
			}
		}
		send(v, clockMessage())
		select {
		case <-v.done:
			return fmt.Errorf("QEMU exited while the guest's clock was set: %v", v.err)
		case <-ctx.Done():
			return fmt.Errorf("the guest's clock is still %v off the host's: %w", skew.Round(time.Millisecond), ctx.Err())
		case <-tick.C:
		}
	}
}

// consoleTail returns the end of v's console, for errors.
func consoleTail(v *vm) string {
	b, _ := os.ReadFile(filepath.Join(v.dir, "console.log"))
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}

// stop kills QEMU and waits for it.
func (v *vm) stop() {
	if v.cmd != nil && v.cmd.Process != nil {
		syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL)
		<-v.done
	}
}

// qmp runs one QMP command on v.
func (v *vm) qmp(ctx context.Context, command string, args any) (json.RawMessage, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(v.dir, "qmp.sock"))
	if err != nil {
		return nil, fmt.Errorf("qmp: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	r := bufio.NewReader(conn)
	read := func() (map[string]json.RawMessage, error) {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, fmt.Errorf("qmp: %w", err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(line, &m); err != nil {
				return nil, fmt.Errorf("qmp: %w", err)
			}
			if _, ev := m["event"]; ev {
				continue
			}
			return m, nil
		}
	}
	if _, err := read(); err != nil { // greeting
		return nil, err
	}
	for i, c := range []map[string]any{{"execute": "qmp_capabilities"}, {"execute": command, "arguments": args}} {
		if args == nil && i == 1 {
			delete(c, "arguments")
		}
		b, _ := json.Marshal(c)
		if _, err := conn.Write(append(b, '\n')); err != nil {
			return nil, fmt.Errorf("qmp: %w", err)
		}
		m, err := read()
		if err != nil {
			return nil, err
		}
		if e, ok := m["error"]; ok {
			return nil, fmt.Errorf("qmp %s: %s", command, e)
		}
		if i == 1 {
			return m["return"], nil
		}
	}
	return nil, errors.New("unreachable")
}
