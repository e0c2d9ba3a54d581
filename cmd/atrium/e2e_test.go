package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

// e2eWait bounds every wait of these tests for the stack: polling deadlines
// and hang detectors, never timing assertions.
const e2eWait = 30 * time.Second

var (
	buildOnce sync.Once
	binDir    string // temporary dir of the built binary, removed by TestMain
	binPath   string
	binErr    error
)

func TestMain(m *testing.M) {
	// Local sandboxes with an egress allowlist run this test binary as
	// their forwarder, as they run the atrium binary (tasks_e2e_test.go).
	if egress.IsForwarder(os.Args) {
		syscall.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr)) // skips the race detector's pause at exit
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// atriumBinary builds the atrium binary once per test run and returns its
// path.
func atriumBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "atrium-e2e-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "atrium")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// syncBuffer is a bytes.Buffer safe for a process's writer and a test's
// readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// devProc is a running `atrium dev` process.
type devProc struct {
	t              testing.TB
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	url            string

	exited  chan struct{} // closed when Wait returned
	waitErr error         // set before exited closes
}

var bannerURL = regexp.MustCompile(`Atrium dev server is running at (http://\S+)`)

// startDev runs `atrium dev` on a free loopback port with data dir dir and
// waits for its banner. The process is killed when the test ends if it is
// still running.
func startDev(t testing.TB, dir string, extra ...string) *devProc {
	t.Helper()
	args := append([]string{"dev", "--listen", "127.0.0.1:0", "--data", dir, "--hibernate-after", "1h"}, extra...)
	p := &devProc{t: t, stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(atriumBinary(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.WaitDelay = 10 * time.Second // in case a leaked sandbox process holds the pipes
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start atrium dev: %v", err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("atrium dev %v\nstdout:\n%s\nstderr:\n%s", args, p.stdout, p.stderr)
		}
	})
	deadline := time.Now().Add(e2eWait)
	for {
		if m := bannerURL.FindStringSubmatch(p.stdout.String()); m != nil {
			p.url = m[1]
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("atrium dev exited before its banner: %v\nstdout:\n%s\nstderr:\n%s", p.waitErr, p.stdout, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no banner from atrium dev within %v\nstdout:\n%s\nstderr:\n%s", e2eWait, p.stdout, p.stderr)
		}
		time.Sleep(20 * time.Millisecond) // Polling interval.
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *devProc) wait() int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(e2eWait + 15*time.Second):
		p.t.Fatalf("atrium dev still running %v after it was told to stop", e2eWait+15*time.Second)
	}
	if p.waitErr != nil {
		if ee, ok := p.waitErr.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		p.t.Fatalf("atrium dev: %v", p.waitErr)
	}
	return 0
}

func (p *devProc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal atrium dev: %v", err)
	}
}

// api calls the HTTP API as one dev user.
type api struct {
	t    testing.TB
	base string
	user string
}

func (a api) do(method, path string, body any) (int, []byte) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer dev:"+a.user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp.StatusCode, b
}

func (a api) must(want int, method, path string, body, out any) {
	a.t.Helper()
	st, b := a.do(method, path, body)
	if st != want {
		a.t.Fatalf("%s %s as %s: status %d, want %d: %s", method, path, a.user, st, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			a.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}

func (a api) create(title string) session.Session {
	a.t.Helper()
	var s session.Session
	a.must(http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": title}, &s)
	if s.ID == "" {
		a.t.Fatalf("created session without an id")
	}
	return s
}

func (a api) prompt(id session.ID, text string) int64 {
	a.t.Helper()
	var r struct{ Seq int64 }
	a.must(http.StatusAccepted, "POST", "/v1/sessions/"+string(id)+"/messages", map[string]any{"text": text}, &r)
	if r.Seq <= 0 {
		a.t.Fatalf("prompt %q acked without a seq", text)
	}
	return r.Seq
}

// e2eEvent is a decoded event plus its exact bytes.
type e2eEvent struct {
	Seq  int64           `json:"seq"`
	Kind session.Kind    `json:"kind"`
	By   string          `json:"by"`
	Data json.RawMessage `json:"data"`
	raw  []byte
}

func decodeEvent(t testing.TB, raw []byte) e2eEvent {
	t.Helper()
	var ev e2eEvent
	if err := json.Unmarshal(raw, &ev); err != nil || ev.Seq <= 0 || ev.Kind == "" {
		t.Fatalf("bad event %q: %v", raw, err)
	}
	ev.raw = append([]byte(nil), raw...)
	return ev
}

func (ev e2eEvent) turn() int64 {
	var d struct{ Turn int64 }
	_ = json.Unmarshal(ev.Data, &d)
	return d.Turn
}

func (ev e2eEvent) field(name string) string {
	var d map[string]any
	_ = json.Unmarshal(ev.Data, &d)
	switch v := d[name].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// events pages through the whole history.
func (a api) events(id session.ID) []e2eEvent {
	a.t.Helper()
	var all []e2eEvent
	after := int64(0)
	for {
		var p session.EventsPage
		a.must(http.StatusOK, "GET", "/v1/sessions/"+string(id)+"/events?after="+strconv.FormatInt(after, 10), nil, &p)
		for _, raw := range p.Events {
			all = append(all, decodeEvent(a.t, raw))
		}
		if len(p.Events) == 0 || all[len(all)-1].Seq >= p.LastSeq {
			for i, ev := range all {
				if ev.Seq != int64(i+1) {
					a.t.Fatalf("history of %s: event %d has seq %d", id, i, ev.Seq)
				}
			}
			return all
		}
		after = all[len(all)-1].Seq
	}
}

// waitFor polls the history until pred holds for an event and returns it.
func (a api) waitFor(id session.ID, what string, pred func(e2eEvent) bool) e2eEvent {
	a.t.Helper()
	deadline := time.Now().Add(e2eWait)
	for {
		for _, ev := range a.events(id) {
			if pred(ev) {
				return ev
			}
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("session %s: no %s within %v", id, what, e2eWait)
		}
		time.Sleep(50 * time.Millisecond) // Polling interval.
	}
}

// waitTurn returns the turn_finished event of turn n.
func (a api) waitTurn(id session.ID, n int64) e2eEvent {
	a.t.Helper()
	return a.waitFor(id, fmt.Sprintf("turn_finished of turn %d", n), func(ev e2eEvent) bool {
		return ev.Kind == session.KindTurnFinished && ev.turn() == n
	})
}

// stdoutOf concatenates the stdout text of turn n.
func stdoutOf(evs []e2eEvent, n int64) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == session.KindOutput && ev.turn() == n && ev.field("stream") == "stdout" {
			b.WriteString(ev.field("text"))
		}
	}
	return b.String()
}

// wsRecorder records the events a WebSocket watcher receives until the
// connection ends.
type wsRecorder struct {
	conn *websocket.Conn
	mu   sync.Mutex
	evs  []e2eEvent // guarded by mu
	bad  string     // guarded by mu; the first problem seen
	done chan struct{}
}

func (a api) record(id session.ID) *wsRecorder {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	u := "ws" + strings.TrimPrefix(a.base, "http") + "/v1/sessions/" + string(id) + "/ws?after=0"
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPHeader:   http.Header{"Authorization": {"Bearer dev:" + a.user}},
		Subprotocols: []string{session.Subprotocol},
	})
	if err != nil {
		a.t.Fatalf("dial ws: %v", err)
	}
	conn.SetReadLimit(64 << 20)
	r := &wsRecorder{conn: conn, done: make(chan struct{})}
	go r.read()
	a.t.Cleanup(func() {
		conn.CloseNow()
		<-r.done
	})
	return r
}

func (r *wsRecorder) read() {
	defer close(r.done)
	for {
		_, b, err := r.conn.Read(context.Background())
		if err != nil {
			return
		}
		var f struct {
			Type  string
			Event json.RawMessage
		}
		if json.Unmarshal(b, &f) != nil || f.Type != session.FrameEvent {
			continue
		}
		var ev e2eEvent
		r.mu.Lock()
		if err := json.Unmarshal(f.Event, &ev); err != nil || (len(r.evs) > 0 && ev.Seq != r.evs[len(r.evs)-1].Seq+1) {
			if r.bad == "" {
				r.bad = fmt.Sprintf("frame %s after %d events", b, len(r.evs))
			}
		}
		ev.raw = append([]byte(nil), f.Event...)
		r.evs = append(r.evs, ev)
		r.mu.Unlock()
	}
}

// snapshot returns the events so far and any problem seen.
func (r *wsRecorder) snapshot() ([]e2eEvent, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]e2eEvent(nil), r.evs...), r.bad
}

// waitFor waits until the recorder got an event satisfying pred.
func (r *wsRecorder) waitFor(t testing.TB, what string, pred func(e2eEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(e2eWait)
	for {
		evs, bad := r.snapshot()
		if bad != "" {
			t.Fatalf("ws watcher: %s", bad)
		}
		for _, ev := range evs {
			if pred(ev) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ws watcher saw no %s within %v (%d events)", what, e2eWait, len(evs))
		}
		time.Sleep(20 * time.Millisecond) // Polling interval.
	}
}

// processesWith returns the command lines of processes (other than this one)
// whose command line contains marker.
func processesWith(t testing.TB, marker string) []string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue // gone, or a kernel thread
		}
		if f == fmt.Sprintf("/proc/%d/cmdline", os.Getpid()) {
			continue
		}
		if bytes.Contains(b, []byte(marker)) {
			found = append(found, f+": "+strings.ReplaceAll(string(bytes.TrimRight(b, "\x00")), "\x00", " "))
		}
	}
	return found
}

// waitNoProcessWith waits until no process's command line contains marker.
func waitNoProcessWith(t testing.TB, marker string) {
	t.Helper()
	deadline := time.Now().Add(e2eWait)
	for {
		left := processesWith(t, marker)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox processes left behind after %v:\n%s", e2eWait, strings.Join(left, "\n"))
		}
		time.Sleep(50 * time.Millisecond) // Polling interval.
	}
}

// uniqueSleep returns an argument for sleep that no other process on this
// machine has in its command line: a very long duration, unique to this test.
func uniqueSleep(n int) string {
	return fmt.Sprintf("7%07d.%d", os.Getpid(), n)
}

// cliResult is what a CLI command did.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs the atrium binary as a client of p with ATRIUM_TOKEN=dev:user, the
// way the README's tour does.
func (p *devProc) cli(user string, args ...string) cliResult {
	p.t.Helper()
	cmd := p.clientCmd(user, args...)
	var out, errb syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := cliResult{stdout: out.String(), stderr: errb.String()}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			p.t.Fatalf("atrium %v: %v", args, err)
		}
		res.code = ee.ExitCode()
	}
	return res
}

func (p *devProc) clientCmd(user string, args ...string) *exec.Cmd {
	// The context is a hang detector: no command of the tour takes this long.
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	p.t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, atriumBinary(p.t), args...)
	cmd.Env = append(os.Environ(), "ATRIUM_SERVER="+p.url, "ATRIUM_TOKEN=dev:"+user)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// ok runs a CLI command that must succeed and returns its stdout.
func (p *devProc) ok(user string, args ...string) string {
	p.t.Helper()
	r := p.cli(user, args...)
	if r.code != 0 {
		p.t.Fatalf("atrium %s as %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), user, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// TestREADME_Tour runs the README's five-minute tour against a real `atrium
// dev`: the same CLI commands and curl requests, checking what the README
// says they do.
func TestREADME_Tour(t *testing.T) {
	t.Parallel()
	p := startDev(t, t.TempDir())
	alice := api{t: t, base: p.url, user: "alice"}

	// ID=$(./bin/atrium new --title demo)
	id := session.ID(strings.TrimSpace(p.ok("alice", "new", "--title", "demo")))
	if err := id.Validate(); err != nil {
		t.Fatalf("atrium new printed %q, not a session id: %v", id, err)
	}
	var s session.Session
	alice.must(http.StatusOK, "GET", "/v1/sessions/"+string(id), nil, &s)
	if s.Title != "demo" || s.Owner != "alice" || s.Role != session.RoleOwner {
		t.Fatalf("session %+v: want title demo, owner alice", s)
	}

	// ./bin/atrium send "$ID" 'echo hello from $(hostname); uname -r' --wait
	uname, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	out := p.ok("alice", "send", string(id), "echo hello from $(hostname); uname -r", "--wait")
	if !strings.Contains(out, "hello from ") || !strings.Contains(out, strings.TrimSpace(string(uname))) {
		t.Fatalf("send --wait printed %q, want the command's output", out)
	}
	// ./bin/atrium send "$ID" 'echo data > notes.txt; ls -l' --wait   # /workspace persists across turns
	if out := p.ok("alice", "send", string(id), "echo data > notes.txt; ls -l", "--wait"); !strings.Contains(out, "notes.txt") {
		t.Fatalf("send --wait printed %q, want ls -l listing notes.txt", out)
	}
	if out := p.ok("alice", "send", string(id), "cat notes.txt", "--wait"); out != "data\n" {
		t.Fatalf("the next turn reads notes.txt as %q: /workspace did not persist", out)
	}
	if r := p.cli("alice", "send", string(id), "exit 7", "--wait"); r.code != 1 || !strings.Contains(r.stderr, "7") {
		t.Fatalf("send --wait of a failing command: exit %d stderr %q, want 1 and the exit code", r.code, r.stderr)
	}

	// ./bin/atrium logs "$ID"   # the whole history, one line per event
	logs := p.ok("alice", "logs", string(id))
	evs := alice.events(id)
	for _, ev := range evs {
		if !regexp.MustCompile(`(?m)^\s*` + strconv.FormatInt(ev.Seq, 10) + `\s.*` + string(ev.Kind)).MatchString(logs) {
			t.Fatalf("atrium logs has no line for event %d (%s):\n%s", ev.Seq, ev.Kind, logs)
		}
	}
	if !strings.Contains(logs, "hello from ") {
		t.Fatalf("atrium logs lacks the output of the first turn:\n%s", logs)
	}
	// ./bin/atrium ls
	if out := p.ok("alice", "ls"); !strings.Contains(out, string(id)) || !strings.Contains(out, "demo") {
		t.Fatalf("atrium ls printed %q, want the session", out)
	}

	// ./bin/atrium share "$ID" bob --role driver; bob attaches and sees a turn live.
	p.ok("alice", "share", string(id), "bob", "--role", "driver")
	attach := p.clientCmd("bob", "attach", string(id))
	stdin, err := attach.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var aout, aerr syncBuffer
	attach.Stdout, attach.Stderr = &aout, &aerr
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	attachDone := make(chan error, 1)
	go func() { attachDone <- attach.Wait() }()
	t.Cleanup(func() {
		attach.Process.Kill()
		<-attachDone
	})
	waitText(t, "bob's attach to show the history", &aout, "hello from ")
	p.ok("alice", "send", string(id), "for i in 1 2 3; do echo tick $i; sleep 1; done")
	waitText(t, "bob's attach to show the ticks", &aout, "tick 3\n")
	if fin := alice.waitTurn(id, 5); fin.field("status") != string(session.TurnOK) {
		t.Fatalf("the tick turn: %s", fin.raw)
	}
	waitText(t, "bob's attach to show the turn finished", &aout, "turn 5 ok")
	stdin.Close() // Ctrl-D detaches.
	select {
	case err := <-attachDone:
		attachDone <- err
		if err != nil {
			t.Fatalf("attach ended with %v after Ctrl-D\nstderr: %s", err, aerr.String())
		}
	case <-time.After(e2eWait):
		t.Fatalf("attach still running %v after its stdin closed", e2eWait)
	}

	// A viewer cannot prompt.
	p.ok("alice", "share", string(id), "carol", "--role", "viewer")
	if r := p.cli("carol", "send", string(id), "echo hi"); r.code == 0 || !strings.Contains(strings.ToLower(r.stderr), "viewer") && !strings.Contains(strings.ToLower(r.stderr), "forbidden") {
		t.Fatalf("a viewer's send: exit %d stderr %q, want a refusal that says why", r.code, r.stderr)
	}
	for _, ev := range alice.events(id) {
		if ev.By == "carol" {
			t.Fatalf("the viewer's prompt reached the log: %s", ev.raw)
		}
	}

	// Approvals.
	p.ok("alice", "send", string(id), `echo "{\"type\":\"approval_request\",\"id\":\"a1\",\"summary\":\"ok to proceed?\"}"; read -r answer; echo "got: $answer"`)
	alice.waitFor(id, "approval_requested a1", func(ev e2eEvent) bool {
		return ev.Kind == session.KindApprovalRequested && ev.field("id") == "a1"
	})
	p.ok("alice", "approve", string(id), "a1")
	alice.waitTurn(id, 6)
	evs = alice.events(id)
	if out := stdoutOf(evs, 6); out != `got: {"type":"approval","id":"a1","allow":true}`+"\n" {
		t.Fatalf("the approval turn printed %q, want the answer line as the README shows", out)
	}
	// ./bin/atrium logs "$ID" --after 10 --json   # raw events as JSON lines
	lines := strings.Split(strings.TrimSuffix(p.ok("alice", "logs", string(id), "--after", "10", "--json"), "\n"), "\n")
	if len(lines) != len(evs)-10 {
		t.Fatalf("logs --after 10 --json printed %d lines, want %d", len(lines), len(evs)-10)
	}
	for i, line := range lines {
		if line != string(evs[10+i].raw) {
			t.Fatalf("logs --json line %d is %s, want the server's bytes %s", i, line, evs[10+i].raw)
		}
	}

	// The same with curl.
	var cs session.Session
	alice.must(http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": "curl demo"}, &cs)
	var ack struct{ Seq int64 }
	alice.must(http.StatusAccepted, "POST", "/v1/sessions/"+string(cs.ID)+"/messages", map[string]any{"text": "date"}, &ack)
	var page session.EventsPage
	alice.must(http.StatusOK, "GET", "/v1/sessions/"+string(cs.ID)+"/events?after=0&limit=50", nil, &page)
	if len(page.Events) == 0 || len(page.Events) > 50 || decodeEvent(t, page.Events[len(page.Events)-1]).Seq < ack.Seq {
		t.Fatalf("history page: %d events up to last_seq %d, want the message at %d", len(page.Events), page.LastSeq, ack.Seq)
	}
	// SSE: history, then live, until the turn of "date" finishes.
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", p.url+"/v1/sessions/"+string(cs.ID)+"/events?after=0", nil)
	req.Header.Set("Authorization", "Bearer dev:alice")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for want := int64(1); ; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("sse: %v after seq %d", err, want-1)
		}
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: ")
		if !ok {
			continue
		}
		ev := decodeEvent(t, []byte(data))
		if ev.Seq != want {
			t.Fatalf("sse delivered seq %d, want %d", ev.Seq, want)
		}
		want++
		if ev.Kind == session.KindTurnFinished {
			if ev.field("status") != string(session.TurnOK) {
				t.Fatalf("the curl demo's turn: %s", ev.raw)
			}
			break
		}
	}
}

// waitText waits until buf contains text.
func waitText(t testing.TB, what string, buf *syncBuffer, text string) {
	t.Helper()
	deadline := time.Now().Add(e2eWait)
	for !strings.Contains(buf.String(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting %v for %s (%q); got:\n%s", e2eWait, what, text, buf.String())
		}
		time.Sleep(20 * time.Millisecond) // Polling interval.
	}
}
