package main

import (
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

// stdoutOf joins the stdout text of turn n, one line per output event.
func stdoutOf(evs []e2eEvent, n int64) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == session.KindOutput && ev.turn() == n && ev.field("stream") == "stdout" {
			b.WriteString(strings.TrimSuffix(ev.field("text"), "\n") + "\n")
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
