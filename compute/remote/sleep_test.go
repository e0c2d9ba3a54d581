package remote_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
)

// sleepingHook is an in-process hook that is a remote.Sleeper: SleepVM
// drops every connection to the VM's agent, as stopping a VM's QEMU does
// (its processes live on, as in the VM's saved memory); WakeVM fails when
// wakeErr is set, as when the VM host died.
type sleepingHook struct {
	*inProcessHook

	mu       sync.Mutex
	sleeps   int   // guarded by mu
	wakes    int   // guarded by mu
	wakeErr  error // guarded by mu
	sleepErr error // guarded by mu: SleepVM fails (the VM keeps running)
}

var _ remote.Sleeper = (*sleepingHook)(nil)

func (h *sleepingHook) SleepVM(_ context.Context, req remote.HookRequest) error {
	vm := h.agentOf(req.SandboxID)
	if vm == nil {
		return errors.New("no such VM")
	}
	h.mu.Lock()
	err := h.sleepErr
	h.mu.Unlock()
	if err != nil {
		return err
	}
	vm.srv.CloseClientConnections()
	h.mu.Lock()
	h.sleeps++
	h.mu.Unlock()
	return nil
}

func (h *sleepingHook) WakeVM(_ context.Context, req remote.HookRequest) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wakes++
	return h.wakeErr
}

func (h *sleepingHook) counts() (sleeps, wakes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sleeps, h.wakes
}

// counter is a command that numbers the lines it reads: its count lives in
// the process's memory, so a restarted process would start again at 1.
var counter = []string{"/bin/sh", "-c", `i=0; while read line; do i=$((i+1)); echo "$i $line"; done; echo done`}

func TestSandbox_SleepKeepsCommands(t *testing.T) {
	hook := &sleepingHook{inProcessHook: newInProcessHook(t, true)}
	rec := newRecorder(t, hook)
	p := newProvider(t, &unwrapHook{Hook: rec, inner: hook}, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	ctx := context.Background()
	pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: counter})
	if err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(pr.Stdout())
	say := func(line, want string) {
		t.Helper()
		if _, err := io.WriteString(pr.Stdin(), line+"\n"); err != nil {
			t.Fatalf("write %q: %v", line, err)
		}
		got, err := out.ReadString('\n')
		if err != nil || got != want+"\n" {
			t.Fatalf("after %q: read %q, %v; want %q", line, got, err, want)
		}
	}
	say("a", "1 a")

	if err := sb.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	if st := sb.State(); st != session.SandboxSleeping {
		t.Errorf("state after sleep %q", st)
	}
	if s, w := hook.counts(); s != 1 || w != 0 {
		t.Errorf("hook: %d sleeps, %d wakes; want 1, 0", s, w)
	}
	// Written while the VM sleeps: it waits for the wake.
	if _, err := io.WriteString(pr.Stdin(), "b\n"); err != nil {
		t.Fatalf("write while asleep: %v", err)
	}
	// Another command wakes the VM.
	r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"true"}}), "")
	if r.Exit.Code != 0 {
		t.Fatalf("exec after sleep: %+v", r.Exit)
	}
	if s, w := hook.counts(); s != 1 || w != 1 {
		t.Errorf("hook: %d sleeps, %d wakes; want 1, 1", s, w)
	}
	if st := sb.State(); st != session.SandboxReady {
		t.Errorf("state after wake %q", st)
	}
	if got, err := out.ReadString('\n'); err != nil || got != "2 b\n" {
		t.Fatalf("the line written while asleep: %q, %v; want %q (the same process)", got, err, "2 b")
	}
	say("c", "3 c")

	// Twice, and the command ends normally afterwards.
	if err := sb.Sleep(ctx); err != nil {
		t.Fatalf("second sleep: %v", err)
	}
	if err := pr.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, compute.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("exec after the second sleep: %v", err)
	}
	rest, _ := io.ReadAll(out)
	exit, err := pr.Wait()
	if err != nil || exit.Code != 0 || exit.Lost || string(rest) != "done\n" {
		t.Errorf("end: %+v, %v, rest %q", exit, err, rest)
	}
	if n := len(rec.created()); n != 1 {
		t.Errorf("%d VMs created; want 1", n)
	}
}

func TestSandbox_WakeFailsGetsFreshVM(t *testing.T) {
	hook := &sleepingHook{inProcessHook: newInProcessHook(t, true)}
	rec := newRecorder(t, hook)
	p := newProvider(t, &unwrapHook{Hook: rec, inner: hook}, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	ctx := context.Background()
	pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: counter})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	// The VM host dies, and its VM with it.
	hook.mu.Lock()
	hook.wakeErr = errors.New("the VM host is gone")
	hook.mu.Unlock()
	old := rec.created()[0].vm.ID
	if err := hook.inProcessHook.DestroyVM(ctx, remote.HookRequest{SandboxID: old}); err != nil {
		t.Fatal(err)
	}
	r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"echo", "fresh"}}), "")
	if r.Exit.Code != 0 || strings.TrimSpace(r.Stdout) != "fresh" {
		t.Fatalf("exec after a failed wake: %+v %q", r.Exit, r.Stdout)
	}
	vms := rec.created()
	if len(vms) != 2 {
		t.Fatalf("%d VMs created; want 2 (a fresh one)", len(vms))
	}
	waitFor(t, "the old VM destroyed", 10*time.Second, func() bool { return rec.isDestroyed(vms[0].vm.ID) })
	done := make(chan compute.Exit, 1)
	go func() { e, _ := pr.Wait(); done <- e }()
	select {
	case exit := <-done:
		if !exit.Lost {
			t.Errorf("the suspended command ended %+v; want lost", exit)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the suspended command of the lost VM never ended")
	}
}

// unwrapHook is a wrapping hook (the recorder) that exposes the Sleeper it
// wraps, as the node's own wrappers do.
type unwrapHook struct {
	remote.Hook
	inner remote.Hook
}

func (h *unwrapHook) Unwrap() remote.Hook { return h.inner }

// TestSandbox_SignalWakes: signalling a command of a sleeping VM wakes the
// VM (as the actor does when it replaces an agent process after a sleep),
// instead of waiting for a wake nobody asks for.
func TestSandbox_SignalWakes(t *testing.T) {
	hook := &sleepingHook{inProcessHook: newInProcessHook(t, true)}
	p := newProvider(t, &unwrapHook{Hook: newRecorder(t, hook), inner: hook}, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	ctx := context.Background()
	pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: counter})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- pr.Signal(syscall.SIGKILL) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("signal: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("signalling a command of a sleeping VM did not return")
	}
	exit, err := pr.Wait()
	if err != nil || exit.Lost || exit.Signal != syscall.SIGKILL {
		t.Errorf("exit %+v, %v; want killed by SIGKILL", exit, err)
	}
	if s, w := hook.counts(); s != 1 || w != 1 {
		t.Errorf("hook: %d sleeps, %d wakes; want 1, 1", s, w)
	}
}

// TestSandbox_SleepFailsKeepsRunning: when the VM host cannot save the VM
// (its disk is full), the VM keeps running and so do its commands, which
// get their connections back at once.
func TestSandbox_SleepFailsKeepsRunning(t *testing.T) {
	hook := &sleepingHook{inProcessHook: newInProcessHook(t, true), sleepErr: errors.New("no space left on device")}
	p := newProvider(t, &unwrapHook{Hook: newRecorder(t, hook), inner: hook}, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	ctx := context.Background()
	pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: counter})
	if err != nil {
		t.Fatal(err)
	}
	err = sb.Sleep(ctx)
	if err == nil || !strings.Contains(err.Error(), "no space left") || !strings.Contains(err.Error(), "keeps running") {
		t.Fatalf("sleep with a failing save: %v", err)
	}
	if st := sb.State(); st != session.SandboxReady {
		t.Errorf("state after a failed sleep %q; want ready", st)
	}
	out := bufio.NewReader(pr.Stdout())
	if _, err := io.WriteString(pr.Stdin(), "x\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := out.ReadString('\n'); err != nil || got != "1 x\n" {
		t.Fatalf("the command after a failed sleep: %q, %v", got, err)
	}
	if s, w := hook.counts(); s != 0 || w != 0 {
		t.Errorf("hook: %d sleeps, %d wakes; want none", s, w)
	}
	pr.Stdin().Close()
	if exit, err := pr.Wait(); err != nil || exit.Code != 0 {
		t.Errorf("exit %+v, %v", exit, err)
	}
}

// TestSandbox_ExitWhileSuspended: a command that ends while its VM sleeps
// (here: between the suspension and the pause) reports its output and exit
// after the wake.
func TestSandbox_ExitWhileSuspended(t *testing.T) {
	hook := &sleepingHook{inProcessHook: newInProcessHook(t, true)}
	p := newProvider(t, &unwrapHook{Hook: newRecorder(t, hook), inner: hook}, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	ctx := context.Background()
	dir := t.TempDir()
	pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"read go; echo before; while [ ! -e " + dir + "/go ]; do sleep 0.02; done; echo after; exit 7"}})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(pr.Stdin(), "go\n")
	out := bufio.NewReader(pr.Stdout())
	if got, _ := out.ReadString('\n'); got != "before\n" {
		t.Fatalf("first line %q", got)
	}
	if err := sb.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	// The in-process "VM" keeps running while asleep: the command ends
	// now, with nobody attached.
	if err := os.WriteFile(dir+"/go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"true"}}), "")
	if r.Exit.Code != 0 {
		t.Fatalf("exec after sleep: %+v", r.Exit)
	}
	rest, _ := io.ReadAll(out)
	exit, err := pr.Wait()
	if err != nil || exit.Code != 7 || exit.Lost || string(rest) != "after\n" {
		t.Errorf("after the wake: exit %+v, %v, rest %q; want 7 and \"after\"", exit, err, rest)
	}
}

// TestSandbox_DestroyWhileAsleep: destroying a sleeping sandbox destroys
// its VM without waking it, and its suspended commands end.
func TestSandbox_DestroyWhileAsleep(t *testing.T) {
	hook := &sleepingHook{inProcessHook: newInProcessHook(t, true)}
	rec := newRecorder(t, hook)
	p := newProvider(t, &unwrapHook{Hook: rec, inner: hook}, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	ctx := context.Background()
	pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: counter})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("destroy while asleep: %v", err)
	}
	if st := sb.State(); st != session.SandboxStopped {
		t.Errorf("state %q; want stopped", st)
	}
	if !rec.isDestroyed(rec.created()[0].vm.ID) {
		t.Error("the VM was not destroyed")
	}
	if _, w := hook.counts(); w != 0 {
		t.Errorf("%d wakes; want none", w)
	}
	done := make(chan struct{})
	go func() { pr.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the suspended command of a destroyed sandbox never ended")
	}
}
