package remote_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
)

// agentPid returns the pid of the agent of netns VM id.
func agentPid(tb testing.TB, id string) int {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(hookDir(tb), id+".pid"))
	if err != nil {
		tb.Fatalf("pid of the agent of %s: %v", id, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		tb.Fatal(err)
	}
	return pid
}

// netnsExists reports whether the network namespace of VM id exists.
func netnsExists(tb testing.TB, id string) bool {
	tb.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		tb.Fatalf("ip netns list: %v", err)
	}
	return strings.Contains(string(out), hookState.tag+"-"+id)
}

// startRunning starts a command that prints "started" and then runs until
// killed, and waits for the line.
func startRunning(tb testing.TB, sb compute.Sandbox) compute.Process {
	tb.Helper()
	pr := computetest.Start(tb, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; exec sleep 1000"}})
	line, err := bufio.NewReader(pr.Stdout()).ReadString('\n')
	if err != nil || line != "started\n" {
		tb.Fatalf("first line %q, %v", line, err)
	}
	return pr
}

// waitLost waits for pr to end as lost and returns its exit.
func waitLost(tb testing.TB, pr compute.Process, within time.Duration) compute.Exit {
	tb.Helper()
	type result struct {
		exit compute.Exit
		err  error
	}
	done := make(chan result, 1)
	go func() {
		_, _ = io.Copy(io.Discard, pr.Stdout())
		_, _ = io.Copy(io.Discard, pr.Stderr())
		e, err := pr.Wait()
		done <- result{e, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			tb.Fatalf("wait: %v", r.err)
		}
		if !r.exit.Lost || r.exit.Code != -1 || !strings.Contains(r.exit.Detail, "sandbox died") {
			tb.Fatalf("exit %+v: want Lost, code -1 and a detail saying the sandbox died", r.exit)
		}
		return r.exit
	case <-time.After(within):
		tb.Fatalf("the command did not end within %v of its sandbox's death", within)
	}
	return compute.Exit{}
}

func TestSandbox_AgentKilledMidExec(t *testing.T) {
	requireBwrap(t)
	hook := newNetnsHook(t)
	p := newProvider(t, hook, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	computetest.ShOK(t, sb, "echo before > f")
	first := hook.created()[0].vm

	pr := startRunning(t, sb)
	if err := syscall.Kill(agentPid(t, first.ID), syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	exit := waitLost(t, pr, 10*time.Second)
	t.Logf("exit after the agent was killed: %+v", exit)
	if st := sb.State(); st != session.SandboxFailed {
		t.Errorf("state after the VM died = %s, want failed", st)
	}
	// The dead VM is destroyed in the background.
	waitFor(t, "the dead VM destroyed", 30*time.Second, func() bool { return hook.isDestroyed(first.ID) })
	if netnsExists(t, first.ID) {
		t.Errorf("the dead VM's namespace is still there")
	}

	// The next command gets a fresh VM, whose workspace starts empty (no
	// workspace store is configured).
	if got := computetest.ShOK(t, sb, "if [ -e f ]; then echo kept; else echo fresh; fi"); got != "fresh\n" {
		t.Errorf("the workspace after the VM was replaced is %s", strings.TrimSpace(got))
	}
	if vms := hook.created(); len(vms) != 2 || vms[1].vm.ID == first.ID {
		t.Errorf("VMs created: %d, want a second one", len(vms))
	}
	if st := sb.State(); st != session.SandboxReady {
		t.Errorf("state after the new VM = %s, want ready", st)
	}
}

func TestSandbox_AgentKilledWhileIdle(t *testing.T) {
	hook := newNetnsHook(t, "--unsafe-no-sandbox")
	p := newProvider(t, hook, remote.Config{})
	id := session.NewID()
	sb := computetest.Open(t, p, compute.Spec{Session: id})
	first := hook.created()[0].vm
	pid := agentPid(t, first.ID)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	// The next Exec finds the agent gone and provisions a fresh VM in the
	// same call.
	if got := computetest.ShOK(t, sb, "echo ok"); got != "ok\n" {
		t.Errorf("exec after the idle agent died printed %q", got)
	}
	if n := len(hook.created()); n != 2 {
		t.Errorf("%d VMs created, want 2", n)
	}
	// So does the next Open.
	if err := syscall.Kill(agentPid(t, hook.created()[1].vm.ID), syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	sb2 := computetest.Open(t, p, compute.Spec{Session: id, Fence: 2})
	if got := computetest.ShOK(t, sb2, "echo ok"); got != "ok\n" {
		t.Errorf("exec after Open replaced the VM printed %q", got)
	}
	if n := len(hook.created()); n != 3 {
		t.Errorf("%d VMs created, want 3", n)
	}
}

func TestSandbox_AgentFrozen(t *testing.T) {
	hook := newNetnsHook(t, "--unsafe-no-sandbox")
	const heartbeat = 200 * time.Millisecond
	p := newProvider(t, hook, remote.Config{Heartbeat: heartbeat})
	sb := computetest.Open(t, p, compute.Spec{})
	vm := hook.created()[0].vm
	pr := startRunning(t, sb)
	// A stopped agent keeps its TCP connections open but answers nothing,
	// as a VM that hangs or a network that drops packets.
	pid := agentPid(t, vm.ID)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop the agent: %v", err)
	}
	start := time.Now()
	exit := waitLost(t, pr, 10*time.Second)
	if d := time.Since(start); d > 10*heartbeat {
		t.Errorf("the frozen agent was noticed after %v, want about two heartbeats (%v)", d, 2*heartbeat)
	}
	if !strings.Contains(exit.Detail, "ping") {
		t.Errorf("detail %q does not say the agent stopped answering pings", exit.Detail)
	}
	waitFor(t, "the frozen VM destroyed", 30*time.Second, func() bool { return hook.isDestroyed(vm.ID) })
}

func TestProvider_AgentNeverHealthy(t *testing.T) {
	// A hook whose VM never runs an agent: Open fails in time, names the
	// address, and destroys the VM.
	rec := newRecorder(t, &remote.CommandHook{
		Create:  []string{"/bin/sh", "-c", `echo '{"id":"vm-1","addr":"127.0.0.1:1","token":"t"}'`},
		Destroy: []string{"true"},
	})
	p := newProvider(t, rec, remote.Config{StartTimeout: 300 * time.Millisecond})
	start := time.Now()
	_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID()})
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("open: %v; want unavailable naming the agent's address", err)
	}
	t.Logf("open: %v", err)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("open failed after %v, want about the start timeout", d)
	}
	if !rec.isDestroyed("vm-1") {
		t.Errorf("the VM whose agent never came up was not destroyed")
	}
}

func TestProvider_HookFails(t *testing.T) {
	p := newProvider(t, &remote.CommandHook{
		Create:  []string{"/bin/sh", "-c", "echo 'quota exceeded, token=secret' >&2; exit 3"},
		Destroy: []string{"true"},
		Logger:  testLogger(t),
	}, remote.Config{})
	_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID()})
	if !errors.Is(err, session.ErrUnavailable) {
		t.Fatalf("open: %v; want unavailable", err)
	}
	if strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("open: %q; want the exit status and not the hook's stderr", err)
	}
	for _, tc := range []struct{ name, out string }{
		{"garbage", "not json"},
		{"no token", `{"id":"x","addr":"127.0.0.1:1"}`},
		{"bad addr", `{"id":"x","addr":"ftp://h","token":"t"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, &remote.CommandHook{
				Create:  []string{"/bin/sh", "-c", "printf '%s\\n' '" + tc.out + "'"},
				Destroy: []string{"true"},
			}, remote.Config{})
			_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID()})
			if !errors.Is(err, session.ErrUnavailable) {
				t.Fatalf("open: %v; want unavailable", err)
			}
			t.Logf("open: %v", err)
		})
	}
}
