package local

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) {
	// Sandboxes with an egress allowlist run this binary as their
	// forwarder. syscall.Exit skips the race detector's one-second pause
	// at exit, which every command would otherwise wait for.
	if egress.IsForwarder(os.Args) {
		syscall.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// newTestProvider returns a provider over a temporary directory (unless cfg
// names one), closed when the test ends.
func newTestProvider(tb testing.TB, cfg Config) *Provider {
	tb.Helper()
	if !cfg.Unsafe && cfg.Bwrap == "" {
		if _, err := exec.LookPath("bwrap"); err != nil {
			tb.Fatal("bubblewrap is not installed: run .ci/deps")
		}
	}
	if cfg.Dir == "" {
		cfg.Dir = tb.TempDir()
	}
	cfg.Logger = slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(cfg)
	if err != nil {
		tb.Fatalf("new provider: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			tb.Errorf("close provider: %v", err)
		}
	})
	return p
}

// withoutCgroups makes p run sandboxes as on a host without cgroups.
func withoutCgroups(p *Provider) *Provider {
	if p.cg != nil {
		p.cg.removeParent()
		p.cg = nil
	}
	return p
}

// requireCgroups skips the test when p has no memory and pids limits.
func requireCgroups(tb testing.TB, p *Provider) {
	tb.Helper()
	if p.cg == nil || p.cg.parent.memory == "" || p.cg.parent.pids == "" {
		tb.Skip("this host has no usable memory and pids cgroups")
	}
}

// liveTasks lists the live processes in cg and its child cgroups. Exited
// processes that wait to be reaped do not count: bubblewrap's monitor exits
// without reaping the sandbox's init, so the host's init reaps that one, in
// its own time.
func liveTasks(tb testing.TB, cg cgroup) []int {
	tb.Helper()
	var live []int
	for _, c := range append([]cgroup{cg}, childCgroups(cg)...) {
		pids, err := c.procs()
		if err != nil {
			tb.Fatal(err)
		}
		live = append(live, alive(pids)...)
	}
	return live
}

// checkAllReaped checks that a sandboxed command left not even a zombie:
// the kernel counts tasks until they are reaped.
func checkAllReaped(tb testing.TB, p *Provider, cg cgroup) {
	tb.Helper()
	if p.layout == nil || !p.pidns.Load() {
		return // The host's init reaps orphans in its own time.
	}
	// The sandbox's init reaps the killed orphans asynchronously: until it
	// has, their zombies still count.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, ok := cg.pidsCurrent()
		if ok && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Errorf("after the command the sandbox's cgroup counts %d tasks (%v)", n, ok)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func childCgroups(cg cgroup) []cgroup {
	var cs []cgroup
	for _, name := range cg.children() {
		cs = append(cs, cg.child(name))
	}
	return cs
}

func TestProvider_Contract(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		noCgroups bool
	}{
		{name: "Sandboxed"},
		{name: "SandboxedWithoutCgroups", noCgroups: true},
		{name: "Unsafe", cfg: Config{Unsafe: true}},
		{name: "UnsafeWithoutCgroups", cfg: Config{Unsafe: true}, noCgroups: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			computetest.TestProvider(t, func(t *testing.T) compute.Provider {
				p := newTestProvider(t, tc.cfg)
				if tc.noCgroups {
					withoutCgroups(p)
				}
				return p
			})
		})
	}
}

func TestSandbox_Isolation(t *testing.T) {
	p := newTestProvider(t, Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	sh := func(script string) string { return computetest.Sh(t, sb, script).Stdout }

	for _, tc := range []struct{ name, script, want string }{
		{"usr is read-only", "touch /usr/atrium-test 2>/dev/null && echo writable || echo denied", "denied\n"},
		{"etc is read-only", "touch /etc/atrium-test 2>/dev/null && echo writable || echo denied", "denied\n"},
		{"root is read-only", "touch /atrium-test 2>/dev/null && echo writable || echo denied", "denied\n"},
		{"bin is read-only", "touch /bin/atrium-test 2>/dev/null && echo writable || echo denied", "denied\n"},
		{"workspace is writable", "touch /workspace/t && echo ok", "ok\n"},
		{"tmp is writable", "touch /tmp/t && echo ok", "ok\n"},
		{"workspace is the working directory", "pwd", "/workspace\n"},
		{"no shadow", "[ -e /etc/shadow ] && echo present || echo absent", "absent\n"},
		{"no host directories", "for d in /root /home /var /run /sys /opt /boot /srv; do [ -e $d ] && echo $d; done; echo end", "end\n"},
		{"only loopback", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", "lo\n"},
		{"no capabilities", "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status | cut -f2 | sort -u", "0000000000000000\n"},
		{"pid 1 is the sandbox's init", "cat /proc/1/comm", "bwrap\n"},
		{"unprivileged user", "id -u; id -g; id -un", "1000\n1000\natrium\n"},
		{"own hostname", "cat /proc/sys/kernel/hostname", "atrium\n"},
		{"no nested user namespaces", "unshare -U true 2>/dev/null && echo allowed || echo refused", "refused\n"},
		{"certificates", "[ -r /etc/ssl/certs/ca-certificates.crt ] && echo ok || echo missing", "ok\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sh(tc.script); got != tc.want {
				t.Errorf("%s: got %q, want %q", tc.script, got, tc.want)
			}
		})
	}

	t.Run("few processes visible", func(t *testing.T) {
		n, err := strconv.Atoi(strings.TrimSpace(sh("ls /proc | grep -c '^[0-9]'")))
		if err != nil || n > 6 {
			t.Errorf("the sandbox sees %d processes (%v): want only its own", n, err)
		}
	})

	t.Run("etc holds only allowed files", func(t *testing.T) {
		allowed := map[string]bool{"passwd": true, "group": true, "ssl": true, "resolv.conf": false}
		for _, e := range etcAllowed {
			allowed[strings.Split(e, "/")[0]] = true
		}
		for name := range strings.FieldsSeq(sh("ls -A /etc")) {
			if !allowed[name] {
				t.Errorf("/etc/%s is visible in the sandbox", name)
			}
		}
	})

	t.Run("minimal environment", func(t *testing.T) {
		t.Setenv("ATRIUM_SECRET_CANARY", "leaked")
		r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"env"}}), "")
		env := strings.Fields(r.Stdout)
		slices.Sort(env)
		want := []string{"HOME=/workspace", "LANG=C.UTF-8", "PATH=" + sandboxPath, "PWD=/workspace", "TERM=dumb"}
		if !slices.Equal(env, want) {
			t.Errorf("environment %q, want %q", env, want)
		}
	})

	t.Run("no network to the host", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		got := sh("bash -c 'exec 3<>/dev/tcp/127.0.0.1/" + port + "' 2>/dev/null && echo connected || echo refused")
		if got != "refused\n" {
			t.Errorf("connecting to the host's loopback listener: %q", got)
		}
		// A connection that got through would wait in the accept queue.
		l.(*net.TCPListener).SetDeadline(time.Now())
		if c, err := l.Accept(); err == nil {
			c.Close()
			t.Errorf("the host's listener accepted a connection from the sandbox")
		}
	})
}

func TestSandbox_SharedNetwork(t *testing.T) {
	p := newTestProvider(t, Config{})
	sb := computetest.Open(t, p, compute.Spec{Network: true})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	got := computetest.Sh(t, sb, "bash -c 'exec 3<>/dev/tcp/127.0.0.1/"+port+"' && echo connected || echo refused").Stdout
	if got != "connected\n" {
		t.Errorf("with Network the sandbox cannot reach the host: %q", got)
	}
}

func TestSandbox_WorkspaceFiles(t *testing.T) {
	dir := t.TempDir()
	id := session.NewID()
	p1 := newTestProvider(t, Config{Dir: dir})
	sb := computetest.Open(t, p1, compute.Spec{Session: id})
	computetest.ShOK(t, sb, "mkdir d && echo one > d/f && chmod 500 d && echo one > top")
	computetest.ShOK(t, sb, "echo two >> top")

	ws := filepath.Join(dir, string(id), "workspace")
	b, err := os.ReadFile(filepath.Join(ws, "top"))
	if err != nil || string(b) != "one\ntwo\n" {
		t.Errorf("host reads %q, %v; want both turns' writes", b, err)
	}
	fi, err := os.Stat(filepath.Join(ws, "d", "f"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Getuid() {
		t.Errorf("a file the sandbox made belongs to uid %d on the host, want %d", uid, os.Getuid())
	}

	// A new provider over the same directory finds the workspace.
	if err := p1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	p2 := newTestProvider(t, Config{Dir: dir})
	sb2 := computetest.Open(t, p2, compute.Spec{Session: id, Fence: 2})
	if got := computetest.ShOK(t, sb2, "cat top d/f"); got != "one\ntwo\none\n" {
		t.Errorf("after a provider restart the workspace holds %q", got)
	}
	if err := sb2.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, string(id))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Destroy the sandbox directory remains: %v", err)
	}
}

func TestSandbox_MemoryLimit(t *testing.T) {
	p := newTestProvider(t, Config{})
	requireCgroups(t, p)
	sb := computetest.Open(t, p, compute.Spec{MemoryBytes: 64 << 20})
	r := computetest.Sh(t, sb, "head -c 200M /dev/zero | tail > /dev/null")
	if !r.Exit.OOM || r.Exit.Signal != syscall.SIGKILL || !strings.Contains(r.Exit.Detail, "64 MiB") {
		t.Errorf("allocating 200 MB under a 64 MiB limit gave %+v", r.Exit)
	}
	if r := computetest.Sh(t, sb, "echo ok"); r.Stdout != "ok\n" || r.Exit.OOM {
		t.Errorf("the next command gave %+v, %q: want a fresh start", r.Exit, r.Stdout)
	}
}

func TestSandbox_PidsLimit(t *testing.T) {
	for _, unsafe := range []bool{false, true} {
		t.Run("unsafe="+strconv.FormatBool(unsafe), func(t *testing.T) {
			p := newTestProvider(t, Config{Unsafe: unsafe})
			requireCgroups(t, p)
			sb := computetest.Open(t, p, compute.Spec{Pids: 32})
			const script = `for (1..200) { my $p = fork; if (!defined $p) { print "fork failed after $_\n"; exit 3 } if ($p == 0) { sleep 1000; exit } }`
			r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"perl", "-e", script}}), "")
			if r.Exit.Code != 3 || !strings.HasPrefix(r.Stdout, "fork failed after") {
				t.Errorf("200 forks under a limit of 32 gave %+v, %q", r.Exit, r.Stdout)
			}
			if live := liveTasks(t, *sb.(*Sandbox).m.cg); len(live) != 0 {
				t.Errorf("after the command processes %v live on", live)
			}
			checkAllReaped(t, p, *sb.(*Sandbox).m.cg)
		})
	}
}

// TestProcess_KillLeavesNothing checks with the kernel's own accounting
// that SIGKILL leaves no process of a command that ignores SIGTERM.
func TestProcess_KillLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		noCgroups bool
	}{
		{name: "Sandboxed"},
		{name: "Unsafe", cfg: Config{Unsafe: true}},
		{name: "UnsafeWithoutCgroups", cfg: Config{Unsafe: true}, noCgroups: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProvider(t, tc.cfg)
			if tc.noCgroups {
				withoutCgroups(p)
			} else {
				requireCgroups(t, p)
			}
			sb := computetest.Open(t, p, compute.Spec{})
			const script = `trap '' TERM; for i in 1 2 3; do sleep 1000 & echo $!; done; sh -c 'sleep 1000 & echo $!; wait' & echo ready; wait`
			pr := computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
			stdout := bufio.NewReader(pr.Stdout())
			var children []int
			for len(children) < 4 {
				line, err := stdout.ReadString('\n')
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
					children = append(children, pid)
				}
			}
			if err := pr.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := pr.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			proc := pr.(*Process)
			if proc.leaf != nil {
				pids, err := proc.leaf.procs()
				if err != nil || len(alive(pids)) != 0 {
					t.Errorf("after SIGKILL the command's cgroup holds %v (%v)", alive(pids), err)
				}
			} else if left := alive(children); len(left) != 0 {
				t.Errorf("after SIGKILL children %v are alive", left)
			}
			if _, err := io.Copy(io.Discard, stdout); err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, pr.Stderr()); err != nil {
				t.Fatal(err)
			}
			exit, err := pr.Wait()
			if err != nil || exit.Signal != syscall.SIGKILL {
				t.Errorf("wait: %+v, %v", exit, err)
			}
			if m := sb.(*Sandbox).m; m.cg != nil {
				if live := liveTasks(t, *m.cg); len(live) != 0 {
					t.Errorf("after Wait processes %v live on", live)
				}
				checkAllReaped(t, p, *m.cg)
				if kids := m.cg.children(); len(kids) != 0 {
					t.Errorf("leaf cgroups %v remain", kids)
				}
			}
		})
	}
}

func TestProvider_MissingBwrap(t *testing.T) {
	p := newTestProvider(t, Config{Bwrap: filepath.Join(t.TempDir(), "bwrap")})
	_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID(), Fence: 1})
	if !errors.Is(err, session.ErrUnavailable) || !errors.Is(err, ErrNoBubblewrap) {
		t.Fatalf("open without bubblewrap: %v, want unavailable", err)
	}
	const want = "bubblewrap (bwrap) is not installed: install it with `apt-get install bubblewrap`, " +
		"or start atrium with --unsafe-no-sandbox to run harnesses without isolation"
	if !strings.Contains(err.Error(), want) || session.AsError(err).Message != want {
		t.Errorf("error %q does not say how to fix it", err)
	}
}

func TestProvider_CloseKillsCommands(t *testing.T) {
	p := newTestProvider(t, Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	pr := computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "trap '' TERM; echo up; sleep 1000"}})
	stdout := bufio.NewReader(pr.Stdout())
	if line, err := stdout.ReadString('\n'); err != nil || line != "up\n" {
		t.Fatalf("read: %q, %v", line, err)
	}
	var sessionCgroup cgroup
	if m := sb.(*Sandbox).m; m.cg != nil {
		sessionCgroup = *m.cg
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := io.Copy(io.Discard, stdout); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, pr.Stderr()); err != nil {
		t.Fatal(err)
	}
	if exit, err := pr.Wait(); err != nil || exit.Signal != syscall.SIGKILL {
		t.Errorf("command ended with %+v, %v; want killed", exit, err)
	}
	if st := sb.State(); st != session.SandboxSleeping {
		t.Errorf("state after Close = %s, want sleeping", st)
	}
	if _, err := p.Open(context.Background(), compute.Spec{Session: session.NewID(), Fence: 1}); !errors.Is(err, session.ErrUnavailable) {
		t.Errorf("open after close: %v, want unavailable", err)
	}
	// The parent cgroup goes too unless another provider (another test
	// binary) uses it.
	for _, d := range sessionCgroup.dirs() {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cgroup %s remains after Close: %v", d, err)
		}
	}
}

func TestSandbox_BadRequests(t *testing.T) {
	p := newTestProvider(t, Config{})
	ctx := context.Background()
	if _, err := p.Open(ctx, compute.Spec{Session: "../etc", Fence: 1}); !errors.Is(err, session.ErrBadRequest) {
		t.Errorf("open with a bad id: %v", err)
	}
	sb := computetest.Open(t, p, compute.Spec{})
	for _, req := range []compute.ExecRequest{
		{},
		{Argv: []string{""}},
		{Argv: []string{"true"}, Env: []string{"NOEQUALS"}},
	} {
		if _, err := sb.Exec(ctx, req); !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("exec %+v: %v, want bad request", req, err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := sb.Exec(cancelled, compute.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, context.Canceled) {
		t.Errorf("exec with a cancelled context: %v", err)
	}
}

func TestCgroup_Files(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"memory.max", "memory.swap.max", "pids.max", "cpu.max", "memory.events", "cgroup.subtree_control"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cg := cgroup{v2: true, memory: dir, pids: dir, cpu: dir}
	if err := cg.setLimits(64<<20, 32, 1.5); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"memory.max": "67108864", "memory.swap.max": "0", "pids.max": "32", "cpu.max": "150000 100000"} {
		if b, _ := os.ReadFile(filepath.Join(dir, f)); string(b) != want {
			t.Errorf("%s = %q, want %q", f, b, want)
		}
	}
	if err := enableControllers(dir, []string{"memory", "pids"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); string(b) != "+memory +pids" {
		t.Errorf("subtree_control = %q", b)
	}
	os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n"), 0o644)
	if n, ok := cg.oomKills(); !ok || n != 1 {
		t.Errorf("oomKills = %d, %v", n, ok)
	}
}

func TestWrapper(t *testing.T) {
	got := wrapper([]string{"/sys/fs/cgroup/pids/it's/cgroup.procs"}, []string{"prog", "arg"})
	want := []string{"sh", "-c", `{ echo $$ > '/sys/fs/cgroup/pids/it'\''s/cgroup.procs'; } || { echo 'atrium: cannot enter the sandbox cgroup' >&2; exit 125; }; exec "$@"`, "sh", "prog", "arg"}
	if !slices.Equal(got, want) {
		t.Errorf("wrapper =\n%q\nwant\n%q", got, want)
	}
}

// BenchmarkSandbox_Exec measures starting a command, running it to the end
// and cleaning up: the fixed cost of a turn.
func BenchmarkSandbox_Exec(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  Config
		spec compute.Spec
	}{
		{"Sandboxed", Config{}, compute.Spec{}},
		{"SandboxedEgress", Config{}, compute.Spec{Egress: []string{"example.com"}}},
		{"Unsafe", Config{Unsafe: true}, compute.Spec{}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := newTestProvider(b, tc.cfg)
			sb := computetest.Open(b, p, tc.spec)
			for b.Loop() {
				pr, err := sb.Exec(context.Background(), compute.ExecRequest{Argv: []string{"true"}})
				if err != nil {
					b.Fatal(err)
				}
				pr.Stdin().Close()
				io.Copy(io.Discard, pr.Stdout())
				io.Copy(io.Discard, pr.Stderr())
				if exit, err := pr.Wait(); err != nil || exit.Code != 0 {
					b.Fatalf("%+v, %v", exit, err)
				}
			}
		})
	}
}
