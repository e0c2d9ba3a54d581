package local

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
)

// TestZygote_SharesNamespaces checks that a warm sandbox runs its commands
// through one zygote (the same pid and mount namespaces every time), as a
// user that is not root and without the executable visible anywhere.
func TestZygote_SharesNamespaces(t *testing.T) {
	for _, noCgroups := range []bool{false, true} {
		name := "cgroups"
		if noCgroups {
			name = "noCgroups"
		}
		t.Run(name, func(t *testing.T) {
			p := newTestProvider(t, Config{})
			if noCgroups {
				withoutCgroups(p)
			}
			sb := computetest.Open(t, p, compute.Spec{})
			const script = `readlink /proc/self/ns/pid /proc/self/ns/mnt; id -u; ls /run /proc/1/root/run 2>&1 | wc -l`
			first := computetest.ShOK(t, sb, script)
			if second := computetest.ShOK(t, sb, script); second != first {
				t.Errorf("two commands saw %q and %q: they should share the zygote's namespaces", first, second)
			}
			if !strings.Contains(first, "\n1000\n") {
				t.Errorf("commands run as %q, want uid 1000", first)
			}
			if z := sb.(*Sandbox).m.zyg; z == nil || !z.alive() {
				t.Fatalf("no zygote runs after two commands")
			}
		})
	}
}

// TestZygote_Dies checks that a command whose zygote dies is reported
// lost, and that the next command starts a new zygote.
func TestZygote_Dies(t *testing.T) {
	p := newTestProvider(t, Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	computetest.ShOK(t, sb, "true")
	m := sb.(*Sandbox).m
	old := m.zyg
	pr := computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 1000"}})
	stdout := bufio.NewReader(pr.Stdout())
	if line, err := stdout.ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("read: %q, %v", line, err)
	}
	if err := old.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, stdout); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, pr.Stderr()); err != nil {
		t.Fatal(err)
	}
	exit, err := pr.Wait()
	if err != nil || !exit.Lost || exit.Code != -1 || !strings.Contains(exit.Detail, "zygote") {
		t.Errorf("a command whose zygote died gave %+v, %v; want it lost", exit, err)
	}
	if got := computetest.ShOK(t, sb, "echo again"); got != "again\n" {
		t.Errorf("after the zygote died: %q", got)
	}
	if m.zyg == nil || m.zyg == old || !m.zyg.alive() {
		t.Errorf("the next command did not start a new zygote")
	}
}

// TestZygote_KilledFromInside checks that a command that kills its zygote
// takes down only its own sandbox's commands, and that the sandbox works on.
func TestZygote_KilledFromInside(t *testing.T) {
	p := newTestProvider(t, Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	r := computetest.Sh(t, sb, "kill -9 $PPID; sleep 5")
	if r.Exit.Code != -1 || (!r.Exit.Lost && r.Exit.Signal != syscall.SIGKILL) {
		t.Errorf("a command that killed its zygote gave %+v", r.Exit)
	}
	if got := computetest.ShOK(t, sb, "echo alive"); got != "alive\n" {
		t.Errorf("after a command killed the zygote: %q", got)
	}
}

// TestZygote_Fallback checks that without an executable that acts as a
// zygote every command starts its own bubblewrap, and works.
func TestZygote_Fallback(t *testing.T) {
	p := newTestProvider(t, Config{Forwarder: "/bin/true"})
	sb := computetest.Open(t, p, compute.Spec{})
	if got := computetest.ShOK(t, sb, "echo ok; id -u"); got != "ok\n1000\n" {
		t.Errorf("stdout %q", got)
	}
	if sb.(*Sandbox).m.zyg != nil {
		t.Errorf("a zygote started from an executable that is not one")
	}
}

// TestProvider_ContractWithoutZygote runs the contract over the per-command
// bubblewrap path, the fallback.
func TestProvider_ContractWithoutZygote(t *testing.T) {
	computetest.TestProvider(t, func(t *testing.T) compute.Provider {
		return newTestProvider(t, Config{Forwarder: "/bin/true"})
	})
}

// TestZygote_WorkspaceReplaced checks that a command sees the workspace
// directory as it is when the command starts, also after a restore
// swapped a new tree in at its path while the zygote was warm.
func TestZygote_WorkspaceReplaced(t *testing.T) {
	p := newTestProvider(t, Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	computetest.ShOK(t, sb, "echo old > f")
	ws := sb.(*Sandbox).m.workspace
	if err := os.Rename(ws, ws+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "f"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := computetest.ShOK(t, sb, "cat f"); got != "new\n" {
		t.Errorf("after the workspace was replaced a command reads %q, want the new tree's file", got)
	}
}

// TestZygote_OutOfMemory checks that a command that exceeds the sandbox's
// memory limit is the one the kernel kills, not the zygote (whose cgroup
// is outside the sandbox's), and that the zygote cannot be inspected or
// ptraced by commands.
func TestZygote_OutOfMemory(t *testing.T) {
	p := newTestProvider(t, Config{})
	requireCgroups(t, p)
	sb := computetest.Open(t, p, compute.Spec{MemoryBytes: 48 << 20})
	if got := computetest.ShOK(t, sb, `cat /proc/$PPID/environ >/dev/null 2>&1 && echo readable || echo denied`); got != "denied\n" {
		t.Errorf("a command reading its zygote's environment: %q", got)
	}
	z := sb.(*Sandbox).m.zyg
	r := computetest.Sh(t, sb, `x=$(head -c 300000000 /dev/zero | tr '\0' a); echo survived ${#x}`)
	if !r.Exit.OOM || r.Exit.Lost {
		t.Errorf("a command over the memory limit gave %+v", r.Exit)
	}
	if got := computetest.ShOK(t, sb, "echo ok"); got != "ok\n" {
		t.Errorf("next command: %q", got)
	}
	if m := sb.(*Sandbox).m; m.zyg != z || !z.alive() {
		t.Errorf("the zygote died of a command's excess")
	}
}
