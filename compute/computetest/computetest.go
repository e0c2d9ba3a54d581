// Package computetest checks that a compute.Provider behaves as the session
// actor expects, the way testing/fstest checks a file system: a provider's
// own tests call TestProvider, and every provider (compute/local, the remote
// one) passes the same contract.
//
// The contract it checks: the workspace is the working directory and HOME
// and persists across commands and sleeps but not Destroy; stdout and
// stderr are separate streams and stdin reaches the command; exit statuses,
// deaths by signal and missing or non-executable commands are reported; the
// host's environment does not leak in; Signal reaches the command and its
// children, and SIGKILL leaves no process behind; a command that never reads
// stdin cannot block its caller; output is streamed, not buffered, and
// several commands may run at once in one sandbox; stderr can be read while
// stdout is not (and the other way round); stale fences are refused.
//
// The sandbox must provide /bin/sh and the usual utilities (cat, head,
// sleep, pwd, chmod, kill).
package computetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// commandTimeout bounds every command of the suite: a command still running
// then is killed so that a broken provider fails the test instead of
// hanging it.
const commandTimeout = 60 * time.Second

// largeOutput is the size of the streaming test's output.
const largeOutput = 50_000_000

// TestProvider runs the contract tests as subtests of t. newProvider returns
// a fresh provider for one subtest and registers its cleanup (for example
// Close) with t.Cleanup. The subtests are not parallel: they change the
// test process's environment to check that it does not leak.
func TestProvider(t *testing.T, newProvider func(t *testing.T) compute.Provider) {
	tests := []struct {
		name string
		fn   func(t *testing.T, p compute.Provider)
	}{
		{"Workspace", testWorkspace},
		{"Streams", testStreams},
		{"Stdin", testStdin},
		{"ExitStatus", testExitStatus},
		{"KilledBySignal", testKilledBySignal},
		{"KillRightAfterExec", testKillRightAfterExec},
		{"Env", testEnv},
		{"MissingCommand", testMissingCommand},
		{"NotExecutable", testNotExecutable},
		{"SignalReachesChildren", testSignalReachesChildren},
		{"KillLeavesNothing", testKillLeavesNothing},
		{"StdinNotRead", testStdinNotRead},
		{"LargeOutputStreams", testLargeOutputStreams},
		{"StreamsIndependent", testStreamsIndependent},
		{"Lifecycle", testLifecycle},
		{"Fence", testFence},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newProvider(t)) })
	}
}

// Open opens a sandbox for a new session with fence 1 and destroys it when
// the test ends.
func Open(tb testing.TB, p compute.Provider, spec compute.Spec) compute.Sandbox {
	tb.Helper()
	if spec.Session == "" {
		spec.Session = session.NewID()
	}
	if spec.Fence == 0 {
		spec.Fence = 1
	}
	sb, err := p.Open(context.Background(), spec)
	if err != nil {
		tb.Fatalf("open sandbox: %v", err)
	}
	tb.Cleanup(func() {
		if err := sb.Destroy(context.Background()); err != nil && !errors.Is(err, session.ErrConflict) {
			tb.Errorf("destroy sandbox: %v", err)
		}
	})
	return sb
}

// Result is what a command produced.
type Result struct {
	Stdout, Stderr string
	Exit           compute.Exit
}

// Start starts req and arranges for it to be killed if it outlives
// commandTimeout or the test.
func Start(tb testing.TB, sb compute.Sandbox, req compute.ExecRequest) compute.Process {
	tb.Helper()
	pr, err := sb.Exec(context.Background(), req)
	if err != nil {
		tb.Fatalf("exec %q: %v", req.Argv, err)
	}
	watchdog := time.AfterFunc(commandTimeout, func() { _ = pr.Signal(syscall.SIGKILL) })
	tb.Cleanup(func() {
		if !watchdog.Stop() {
			tb.Errorf("command %q ran longer than %v and was killed", req.Argv, commandTimeout)
		}
		_ = pr.Signal(syscall.SIGKILL)
	})
	return pr
}

// Finish writes stdin to the command and closes it, reads both outputs to
// EOF, and waits for the command.
func Finish(tb testing.TB, pr compute.Process, stdin string) Result {
	tb.Helper()
	var wg sync.WaitGroup
	var stderr bytes.Buffer
	var stderrErr, stdinErr error
	wg.Go(func() { _, stderrErr = io.Copy(&stderr, pr.Stderr()) })
	wg.Go(func() {
		if stdin != "" {
			_, stdinErr = io.WriteString(pr.Stdin(), stdin)
		}
		pr.Stdin().Close()
	})
	stdout, err := io.ReadAll(pr.Stdout())
	wg.Wait()
	if err != nil || stderrErr != nil {
		tb.Fatalf("read output: %v", errors.Join(err, stderrErr))
	}
	if stdinErr != nil {
		tb.Logf("write stdin: %v", stdinErr)
	}
	exit, err := pr.Wait()
	if err != nil {
		tb.Fatalf("wait: %v", err)
	}
	return Result{Stdout: string(stdout), Stderr: stderr.String(), Exit: exit}
}

// Sh runs script with /bin/sh -c and returns what it produced.
func Sh(tb testing.TB, sb compute.Sandbox, script string) Result {
	tb.Helper()
	return Finish(tb, Start(tb, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", script}}), "")
}

// ShOK runs script and fails the test unless it exits with status 0.
func ShOK(tb testing.TB, sb compute.Sandbox, script string) string {
	tb.Helper()
	r := Sh(tb, sb, script)
	if r.Exit.Code != 0 {
		tb.Fatalf("%q: %s (stdout %q, stderr %q)", script, r.Exit.Detail, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

func testWorkspace(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	out := ShOK(t, sb, `echo hello > f && mkdir sub && pwd && echo "$HOME"`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != lines[1] {
		t.Fatalf("working directory and HOME = %q, want the workspace twice", lines)
	}
	ws := lines[0]
	if got := ShOK(t, sb, "cat f"); got != "hello\n" {
		t.Errorf("second command reads %q, want the first one's file", got)
	}
	r := Finish(t, Start(t, sb, compute.ExecRequest{
		Argv: []string{"/bin/sh", "-c", "pwd && cat ../f"},
		Dir:  "/workspace/sub",
	}), "")
	if r.Stdout != ws+"/sub\nhello\n" {
		t.Errorf("command with Dir /workspace/sub printed %q, want %q", r.Stdout, ws+"/sub\nhello\n")
	}
}

func testStreams(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	r := Sh(t, sb, "echo out; echo err >&2; echo out2")
	if r.Stdout != "out\nout2\n" || r.Stderr != "err\n" {
		t.Errorf("stdout %q, stderr %q; want %q and %q", r.Stdout, r.Stderr, "out\nout2\n", "err\n")
	}
}

func testStdin(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	pr := Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", `read line; echo "got:$line"; cat`}})
	r := Finish(t, pr, "first\nsecond\n")
	if r.Stdout != "got:first\nsecond\n" {
		t.Errorf("stdout %q, want the stdin lines back", r.Stdout)
	}
}

func testExitStatus(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	r := Sh(t, sb, "exit 3")
	if r.Exit.Code != 3 || r.Exit.Signal != 0 || r.Exit.OOM || r.Exit.Detail == "" {
		t.Errorf("exit 3 gave %+v", r.Exit)
	}
	if r := Sh(t, sb, "true"); r.Exit.Code != 0 || r.Exit.Signal != 0 {
		t.Errorf("true gave %+v", r.Exit)
	}
}

func testKilledBySignal(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		r := Sh(t, sb, "kill -"+strings.TrimPrefix(sigName(sig), "SIG")+" $$")
		if r.Exit.Code != -1 || r.Exit.Signal != sig || r.Exit.Detail == "" {
			t.Errorf("a command killed by %s gave %+v", sigName(sig), r.Exit)
		}
	}
}

// testKillRightAfterExec: a SIGKILL sent the moment Exec returns, before the
// command may even have started, still ends it (a cancel can come that
// early).
func testKillRightAfterExec(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	for i := range 10 {
		pr := Start(t, sb, compute.ExecRequest{Argv: []string{"sleep", "600"}})
		if err := pr.Signal(syscall.SIGKILL); err != nil {
			t.Fatalf("run %d: signal: %v", i, err)
		}
		r := Finish(t, pr, "")
		if r.Exit.Code != -1 || r.Exit.Signal != syscall.SIGKILL {
			t.Fatalf("run %d: a command killed right after Exec gave %+v", i, r.Exit)
		}
	}
}

func sigName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

func testEnv(t *testing.T, p compute.Provider) {
	t.Setenv("ATRIUM_COMPUTETEST_CANARY", "leaked")
	sb := Open(t, p, compute.Spec{})
	pr := Start(t, sb, compute.ExecRequest{
		Argv: []string{"/bin/sh", "-c", `echo "$ATRIUM_TEST_VAR"; echo "${ATRIUM_COMPUTETEST_CANARY-unset}"`},
		Env:  []string{"ATRIUM_TEST_VAR=hello world"},
	})
	r := Finish(t, pr, "")
	if r.Stdout != "hello world\nunset\n" {
		t.Errorf("stdout %q: want the request's Env and none of the host's", r.Stdout)
	}
}

// exitOrError checks that a command that cannot run fails clearly: either
// Exec returns an error or the command exits with want and a Detail.
func exitOrError(t *testing.T, sb compute.Sandbox, argv []string, want int) {
	t.Helper()
	pr, err := sb.Exec(context.Background(), compute.ExecRequest{Argv: argv})
	if err != nil {
		return
	}
	watchdog := time.AfterFunc(commandTimeout, func() { _ = pr.Signal(syscall.SIGKILL) })
	defer watchdog.Stop()
	r := Finish(t, pr, "")
	if r.Exit.Code != want || r.Exit.Detail == "" {
		t.Errorf("%q: exit %+v, want status %d with a detail (stderr %q)", argv, r.Exit, want, r.Stderr)
	}
}

func testMissingCommand(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	exitOrError(t, sb, []string{"/nonexistent/harness"}, 127)
	exitOrError(t, sb, []string{"atrium-no-such-command"}, 127)
}

func testNotExecutable(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	ShOK(t, sb, "printf 'echo hi\\n' > notexec && chmod 644 notexec")
	exitOrError(t, sb, []string{"./notexec"}, 126)
}

// readUntil reads lines from r until every line of want has been seen.
func readUntil(t *testing.T, r *bufio.Reader, want ...string) {
	t.Helper()
	seen := make(map[string]bool)
	for len(seen) < len(want) {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read output: %v (still waiting for some of %q)", err, want)
		}
		for _, w := range want {
			if strings.TrimSuffix(line, "\n") == w {
				seen[w] = true
			}
		}
	}
}

func testSignalReachesChildren(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	// Each shell loops until its own trap has run, so the outcome does not
	// depend on the order in which the processes receive the signal.
	const script = `
got=
trap 'echo parent got TERM; got=1' TERM
sh -c 'trap "echo child got TERM; exit 0" TERM; echo child ready; while :; do sleep 0.2; done' &
c=$!
echo parent ready
while [ -z "$got" ]; do sleep 0.2; done
wait $c
echo parent done`
	pr := Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
	pr.Stdin().Close()
	stdout := bufio.NewReader(pr.Stdout())
	readUntil(t, stdout, "child ready", "parent ready")
	if err := pr.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal: %v", err)
	}
	rest, err := io.ReadAll(stdout)
	if err != nil {
		t.Fatalf("read output: %v", err)
	}
	if _, err := io.Copy(io.Discard, pr.Stderr()); err != nil {
		t.Fatalf("read stderr: %v", err)
	}
	exit, err := pr.Wait()
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	for _, want := range []string{"parent got TERM", "child got TERM", "parent done"} {
		if !strings.Contains(string(rest), want+"\n") {
			t.Errorf("output %q lacks %q", rest, want)
		}
	}
	if exit.Code != 0 {
		t.Errorf("exit %+v, want 0: the harness handled SIGTERM", exit)
	}
}

func testKillLeavesNothing(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	// Everything ignores SIGTERM; the children inherit stdout, so reading
	// it to EOF proves that they are gone.
	const script = `
trap '' TERM
for i in 1 2 3 4 5; do sleep 1000 & done
echo ready
read x
echo still alive
wait`
	pr := Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
	stdout := bufio.NewReader(pr.Stdout())
	readUntil(t, stdout, "ready")
	if err := pr.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal TERM: %v", err)
	}
	if _, err := io.WriteString(pr.Stdin(), "go\n"); err != nil {
		t.Fatalf("write stdin: %v", err)
	}
	readUntil(t, stdout, "still alive")
	if err := pr.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("signal KILL: %v", err)
	}
	if _, err := io.Copy(io.Discard, stdout); err != nil {
		t.Fatalf("read stdout: %v", err)
	}
	if _, err := io.Copy(io.Discard, pr.Stderr()); err != nil {
		t.Fatalf("read stderr: %v", err)
	}
	exit, err := pr.Wait()
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if exit.Signal != syscall.SIGKILL || exit.Code != -1 {
		t.Errorf("exit %+v, want killed by SIGKILL", exit)
	}
}

func testStdinNotRead(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	pr := Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo bye"}})
	var wg sync.WaitGroup
	var stdout []byte
	wg.Go(func() { stdout, _ = io.ReadAll(pr.Stdout()) })
	wg.Go(func() { _, _ = io.Copy(io.Discard, pr.Stderr()) })
	// More than any pipe holds: the write must fail once the command is
	// gone instead of blocking for ever.
	_, err := pr.Stdin().Write(make([]byte, 4<<20))
	if err == nil {
		t.Errorf("writing 4 MiB to a command that never reads stdin succeeded")
	}
	wg.Wait()
	if _, err := pr.Wait(); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if string(stdout) != "bye\n" {
		t.Errorf("stdout %q", stdout)
	}
	if _, err := pr.Stdin().Write([]byte("late\n")); err == nil {
		t.Errorf("writing stdin after the command exited succeeded")
	}
	if err := pr.Stdin().Close(); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		t.Logf("close stdin after wait: %v", err)
	}
}

func testLargeOutputStreams(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	pr := Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"head -c 50000000 /dev/zero && echo done > marker"}})
	pr.Stdin().Close()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(io.Discard, pr.Stderr()) })
	defer wg.Wait()
	if _, err := io.ReadFull(pr.Stdout(), make([]byte, 1<<20)); err != nil {
		t.Fatalf("read the first MiB: %v", err)
	}
	// The command cannot have finished: nobody has read the rest of its
	// output. A provider that buffers output would let it finish.
	if got := ShOK(t, sb, "if [ -e marker ]; then echo finished; else echo blocked; fi"); got != "blocked\n" {
		t.Errorf("with 49 MB unread the command %s: the provider buffers output", strings.TrimSpace(got))
	}
	n, err := io.Copy(io.Discard, pr.Stdout())
	if err != nil {
		t.Fatalf("read output: %v", err)
	}
	if n+1<<20 != largeOutput {
		t.Errorf("read %d bytes, want %d", n+1<<20, largeOutput)
	}
	if exit, err := pr.Wait(); err != nil || exit.Code != 0 {
		t.Fatalf("wait: %+v, %v", exit, err)
	}
	if got := ShOK(t, sb, "cat marker"); got != "done\n" {
		t.Errorf("marker %q", got)
	}
}

func testStreamsIndependent(t *testing.T, p compute.Provider) {
	sb := Open(t, p, compute.Spec{})
	// Each output waits, unread, while the other is read: a provider that
	// carries both over one channel must not let one block the other.
	pr := Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c",
		`echo out1; echo err1 >&2; read x; echo err2 >&2; echo out2; read y; echo out3; echo err3 >&2`}})
	stdout, stderr := bufio.NewReader(pr.Stdout()), bufio.NewReader(pr.Stderr())
	readUntil(t, stderr, "err1")
	if _, err := io.WriteString(pr.Stdin(), "go\n"); err != nil {
		t.Fatalf("write stdin: %v", err)
	}
	readUntil(t, stdout, "out1", "out2")
	readUntil(t, stderr, "err2")
	if _, err := io.WriteString(pr.Stdin(), "go\n"); err != nil {
		t.Fatalf("write stdin: %v", err)
	}
	pr.Stdin().Close()
	rest, err := io.ReadAll(stderr)
	if err != nil || string(rest) != "err3\n" {
		t.Errorf("rest of stderr %q, %v", rest, err)
	}
	if rest, err := io.ReadAll(stdout); err != nil || string(rest) != "out3\n" {
		t.Errorf("rest of stdout %q, %v", rest, err)
	}
	if exit, err := pr.Wait(); err != nil || exit.Code != 0 {
		t.Errorf("wait: %+v, %v", exit, err)
	}
}

func testLifecycle(t *testing.T, p compute.Provider) {
	ctx := context.Background()
	id := session.NewID()
	sb := Open(t, p, compute.Spec{Session: id})
	if st := sb.State(); st != session.SandboxReady {
		t.Errorf("state after Open = %s, want ready", st)
	}
	ShOK(t, sb, "echo kept > f")

	running := Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 1000"}})
	readUntil(t, bufio.NewReader(running.Stdout()), "started")
	if err := sb.Sleep(ctx); err != nil {
		t.Fatalf("sleep: %v", err)
	}
	if st := sb.State(); st != session.SandboxSleeping {
		t.Errorf("state after Sleep = %s, want sleeping", st)
	}
	if _, err := io.Copy(io.Discard, running.Stdout()); err != nil {
		t.Fatalf("read stdout: %v", err)
	}
	if _, err := io.Copy(io.Discard, running.Stderr()); err != nil {
		t.Fatalf("read stderr: %v", err)
	}
	if exit, err := running.Wait(); err != nil || exit.Code == 0 {
		t.Errorf("command running during Sleep ended with %+v, %v; want it killed", exit, err)
	}

	if got := ShOK(t, sb, "cat f"); got != "kept\n" {
		t.Errorf("after sleeping the workspace holds %q, want the file written before", got)
	}
	if st := sb.State(); st != session.SandboxReady {
		t.Errorf("state after a command woke it = %s, want ready", st)
	}

	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if st := sb.State(); st != session.SandboxStopped {
		t.Errorf("state after Destroy = %s, want stopped", st)
	}
	if pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: []string{"true"}}); err == nil {
		Finish(t, pr, "")
		t.Errorf("exec in a destroyed sandbox succeeded")
	}
	sb2 := Open(t, p, compute.Spec{Session: id})
	if got := ShOK(t, sb2, "if [ -e f ]; then echo present; else echo absent; fi"); got != "absent\n" {
		t.Errorf("after Destroy and Open the old file is %s", strings.TrimSpace(got))
	}
}

func testFence(t *testing.T, p compute.Provider) {
	ctx := context.Background()
	id := session.NewID()
	sb5 := Open(t, p, compute.Spec{Session: id, Fence: 5})
	if _, err := p.Open(ctx, compute.Spec{Session: id, Fence: 4}); !errors.Is(err, session.ErrConflict) {
		t.Errorf("open with an older fence: %v, want conflict", err)
	}
	sb6 := Open(t, p, compute.Spec{Session: id, Fence: 6})
	if _, err := sb5.Exec(ctx, compute.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, session.ErrConflict) {
		t.Errorf("exec through a superseded handle: %v, want conflict", err)
	}
	if err := sb5.Sleep(ctx); !errors.Is(err, session.ErrConflict) {
		t.Errorf("sleep through a superseded handle: %v, want conflict", err)
	}
	if got := ShOK(t, sb6, "echo ok"); got != "ok\n" {
		t.Errorf("current handle printed %q", got)
	}
}
