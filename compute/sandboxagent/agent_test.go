package sandboxagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/sandboxagent"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const token = "test-token"

// testAgent is an agent served on loopback with an unsafe local provider.
type testAgent struct {
	srv   *sandboxagent.Server
	url   string
	dir   string
	local *local.Provider
}

func startAgent(tb testing.TB) *testAgent {
	tb.Helper()
	dir := tb.TempDir()
	log := slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	lp, err := local.New(local.Config{Dir: dir, Unsafe: true, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := sandboxagent.New(sandboxagent.Config{Token: token, Provider: lp, Dir: dir, Version: "v-test", Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	tb.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			tb.Errorf("close agent: %v", err)
		}
		if err := srv.Close(ctx); err != nil {
			tb.Errorf("close agent again: %v", err)
		}
		if err := lp.Close(ctx); err != nil {
			tb.Errorf("close local provider: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return &testAgent{srv: srv, url: hs.URL, dir: dir, local: lp}
}

// do makes a request with the token and fence (-1: no fence header) and
// returns the status and body.
func (a *testAgent) do(tb testing.TB, method, path string, fence int64, body []byte) (int, []byte) {
	tb.Helper()
	req, err := http.NewRequest(method, a.url+path, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if fence >= 0 {
		req.Header.Set(compute.AgentFenceHeader, strconv.FormatInt(fence, 10))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// open opens the sandbox of id with fence.
func (a *testAgent) open(tb testing.TB, id session.ID, fence int64) {
	tb.Helper()
	b, _ := json.Marshal(compute.AgentOpen{Session: id})
	if st, body := a.do(tb, "POST", "/v1/sandbox", fence, b); st != http.StatusNoContent {
		tb.Fatalf("open: %d %s", st, body)
	}
}

// errorOf decodes an error answer.
func errorOf(tb testing.TB, body []byte) session.Error {
	tb.Helper()
	var e struct{ Error session.Error }
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" {
		tb.Fatalf("answer %s is not an error object", body)
	}
	return e.Error
}

func TestServer_Health(t *testing.T) {
	a := startAgent(t)
	resp, err := http.Get(a.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h compute.AgentHealth
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != 200 || h.Version != "v-test" || h.UptimeMS < 0 {
		t.Errorf("health: %d %+v %v", resp.StatusCode, h, err)
	}
}

func TestServer_Auth(t *testing.T) {
	a := startAgent(t)
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "bearer " + token, "Bearer " + token + "x", "Basic " + token} {
		req, _ := http.NewRequest("POST", a.url+"/v1/sandbox/sleep", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		req.Header.Set(compute.AgentFenceHeader, "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || errorOf(t, body).Code != session.CodeUnauthenticated {
			t.Errorf("Authorization %q: %d %s; want 401 unauthenticated", auth, resp.StatusCode, body)
		}
	}
}

func TestServer_Fence(t *testing.T) {
	a := startAgent(t)
	id := session.NewID()
	a.open(t, id, 3)
	for _, tc := range []struct {
		fence int64
		raw   string
		want  int
	}{
		{fence: 2, want: http.StatusConflict},
		{fence: 0, want: http.StatusConflict},
		{fence: -1, want: http.StatusBadRequest},
		{raw: "abc", want: http.StatusBadRequest},
		{raw: "-5", want: http.StatusBadRequest},
		{fence: 3, want: http.StatusNoContent},
		{fence: 4, want: http.StatusNoContent},
		{fence: 3, want: http.StatusConflict},
	} {
		req, _ := http.NewRequest("POST", a.url+"/v1/sandbox/sleep", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		switch {
		case tc.raw != "":
			req.Header.Set(compute.AgentFenceHeader, tc.raw)
		case tc.fence >= 0:
			req.Header.Set(compute.AgentFenceHeader, strconv.FormatInt(tc.fence, 10))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("fence %d %q: %d %s; want %d", tc.fence, tc.raw, resp.StatusCode, body, tc.want)
		}
		if tc.want == http.StatusConflict && !strings.Contains(errorOf(t, body).Message, "newer owner") {
			t.Errorf("fence %d: message %s does not say a newer owner has the sandbox", tc.fence, body)
		}
	}
}

func TestServer_OneSessionPerAgent(t *testing.T) {
	a := startAgent(t)
	if st, body := a.do(t, "GET", "/v1/files/x", 1, nil); st != http.StatusNotFound || !strings.Contains(string(body), "no sandbox is open") {
		t.Errorf("file before open: %d %s", st, body)
	}
	first, second := session.NewID(), session.NewID()
	a.open(t, first, 1)
	b, _ := json.Marshal(compute.AgentOpen{Session: second})
	if st, body := a.do(t, "POST", "/v1/sandbox", 1, b); st != http.StatusConflict {
		t.Errorf("open of a second session: %d %s; want 409", st, body)
	}
	if st, body := a.do(t, "POST", "/v1/sandbox", 1, []byte(`{"session":"bad id!"}`)); st != http.StatusBadRequest {
		t.Errorf("open with a bad id: %d %s; want 400", st, body)
	}
	if st, body := a.do(t, "POST", "/v1/sandbox", 1, []byte(`{"session":"x","extra":1}`)); st != http.StatusBadRequest {
		t.Errorf("open with an unknown field: %d %s; want 400", st, body)
	}
	if st, body := a.do(t, "DELETE", "/v1/sandbox", 1, nil); st != http.StatusNoContent {
		t.Fatalf("destroy: %d %s", st, body)
	}
	a.open(t, second, 1)
}

func TestServer_FilesStayInTheWorkspace(t *testing.T) {
	a := startAgent(t)
	id := session.NewID()
	a.open(t, id, 1)
	ws := filepath.Join(a.dir, string(id), "workspace")
	secret := filepath.Join(a.dir, "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ name, target string }{{"abs", "/"}, {"up", "../.."}, {"sec", "../../secret"}, {"in", "sub"}} {
		if err := os.Symlink(l.target, filepath.Join(ws, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}

	if st, body := a.do(t, "PUT", "/v1/files/in/ok.txt?mode=0640", 1, []byte("fine")); st != http.StatusNoContent {
		t.Fatalf("put through a link inside: %d %s", st, body)
	}
	if fi, err := os.Stat(filepath.Join(ws, "sub", "ok.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("the file put through a link inside: %v, %v", fi, err)
	}
	if st, body := a.do(t, "GET", "/v1/files/sub/ok.txt", 1, nil); st != 200 || string(body) != "fine" {
		t.Errorf("get: %d %q", st, body)
	}
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/files/sec"},
		{"GET", "/v1/files/up/secret"},
		{"GET", "/v1/files/abs/etc/passwd"},
		{"PUT", "/v1/files/up/planted"},
		{"PUT", "/v1/files/abs/tmp/planted"},
		{"GET", "/v1/files/%2e%2e/%2e%2e/secret"},
		{"GET", "/v1/files/sub%2f..%2f..%2f..%2fsecret"},
		{"PUT", "/v1/files/%2e%2e%2fplanted"},
		{"PUT", "/v1/files/sub?mode=0644"},
		{"PUT", "/v1/files/x?mode=9"},
		{"PUT", "/v1/files/x?mode=04755"},
	} {
		st, body := a.do(t, tc.method, tc.path, 1, []byte("planted"))
		if st/100 == 2 || st/100 == 3 {
			t.Errorf("%s %s: %d %s; want it refused", tc.method, tc.path, st, body)
		} else if st == http.StatusInternalServerError {
			t.Errorf("%s %s: %d %s; want a precise error", tc.method, tc.path, st, body)
		}
		if bytes.Contains(body, []byte("host secret")) {
			t.Errorf("%s %s leaked the secret", tc.method, tc.path)
		}
	}
	if _, err := os.Stat(filepath.Join(a.dir, "planted")); err == nil {
		t.Errorf("a file was planted outside the workspace")
	}
	matches, _ := filepath.Glob(filepath.Join(ws, "*", ".atrium-upload-*"))
	if more, _ := filepath.Glob(filepath.Join(ws, ".atrium-upload-*")); len(matches)+len(more) > 0 {
		t.Errorf("temporary files left: %v %v", matches, more)
	}
}

// dialExec opens an exec connection.
func (a *testAgent) dialExec(tb testing.TB, fence int64) *websocket.Conn {
	tb.Helper()
	conn, resp, err := websocket.Dial(context.Background(), a.url+"/v1/exec", &websocket.DialOptions{
		HTTPHeader: http.Header{
			"Authorization":          {"Bearer " + token},
			compute.AgentFenceHeader: {strconv.FormatInt(fence, 10)},
		},
		Subprotocols: []string{compute.AgentSubprotocol},
	})
	if err != nil {
		tb.Fatalf("dial exec: %v (%v)", err, resp)
	}
	tb.Cleanup(func() { conn.CloseNow() })
	return conn
}

func writeJSON(tb testing.TB, c *websocket.Conn, v any) {
	tb.Helper()
	b, _ := json.Marshal(v)
	if err := c.Write(context.Background(), websocket.MessageText, b); err != nil {
		tb.Fatal(err)
	}
}

// readControl reads messages until a control message and returns it.
func readControl(tb testing.TB, c *websocket.Conn) compute.AgentMessage {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			tb.Fatalf("read: %v", err)
		}
		if typ == websocket.MessageText {
			var m compute.AgentMessage
			if err := json.Unmarshal(b, &m); err != nil {
				tb.Fatal(err)
			}
			return m
		}
	}
}

// closeStatus reads until the connection closes and returns its status.
func closeStatus(tb testing.TB, c *websocket.Conn) websocket.StatusCode {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

func TestServer_ExecProtocol(t *testing.T) {
	a := startAgent(t)
	a.open(t, session.NewID(), 1)
	run := compute.AgentExec{ExecRequest: compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat >/dev/null; echo done"}}, Window: 1 << 20}

	t.Run("binary request", func(t *testing.T) {
		c := a.dialExec(t, 1)
		_ = c.Write(context.Background(), websocket.MessageBinary, []byte("{}"))
		if m := readControl(t, c); m.Type != "error" || m.Error.Code != session.CodeBadRequest {
			t.Errorf("got %+v, want a bad request error", m)
		}
	})
	t.Run("no window", func(t *testing.T) {
		c := a.dialExec(t, 1)
		writeJSON(t, c, compute.AgentExec{ExecRequest: run.ExecRequest})
		if m := readControl(t, c); m.Type != "error" || m.Error.Code != session.CodeBadRequest {
			t.Errorf("got %+v, want a bad request error", m)
		}
	})
	t.Run("empty command", func(t *testing.T) {
		c := a.dialExec(t, 1)
		writeJSON(t, c, compute.AgentExec{Window: 1024})
		if m := readControl(t, c); m.Type != "error" || m.Error.Code != session.CodeBadRequest {
			t.Errorf("got %+v, want a bad request error", m)
		}
	})
	t.Run("stdin beyond the window", func(t *testing.T) {
		c := a.dialExec(t, 1)
		writeJSON(t, c, compute.AgentExec{ExecRequest: compute.ExecRequest{Argv: []string{"sleep", "1000"}}, Window: 1 << 20})
		m := readControl(t, c)
		if m.Type != "started" || m.Window <= 0 {
			t.Fatalf("got %+v, want started", m)
		}
		chunk := append([]byte{compute.AgentStdin}, make([]byte, compute.AgentMaxChunk)...)
		// The command never reads: past the window (and what its pipe
		// holds) the agent's queue overflows.
		for sent := int64(0); sent <= 4*m.Window; sent += compute.AgentMaxChunk {
			if err := c.Write(context.Background(), websocket.MessageBinary, chunk); err != nil {
				break
			}
		}
		if st := closeStatus(t, c); st != websocket.StatusPolicyViolation {
			t.Errorf("close status %v, want policy violation", st)
		}
	})
	t.Run("unknown control", func(t *testing.T) {
		c := a.dialExec(t, 1)
		writeJSON(t, c, run)
		if m := readControl(t, c); m.Type != "started" {
			t.Fatalf("got %+v", m)
		}
		writeJSON(t, c, compute.AgentMessage{Type: "reboot"})
		if st := closeStatus(t, c); st != websocket.StatusPolicyViolation {
			t.Errorf("close status %v, want policy violation", st)
		}
	})
	t.Run("a whole exchange", func(t *testing.T) {
		c := a.dialExec(t, 1)
		writeJSON(t, c, run)
		if m := readControl(t, c); m.Type != "started" {
			t.Fatalf("got %+v", m)
		}
		_ = c.Write(context.Background(), websocket.MessageBinary, append([]byte{compute.AgentStdin}, "input"...))
		if m := readControl(t, c); m.Type != "credit" || m.Stream != "stdin" || m.Bytes != 5 {
			t.Errorf("got %+v, want credit for the 5 stdin bytes", m)
		}
		writeJSON(t, c, compute.AgentMessage{Type: "close_stdin"})
		var out []byte
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var exit *compute.Exit
		for exit == nil {
			typ, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if typ == websocket.MessageBinary {
				if b[0] == compute.AgentStdout {
					out = append(out, b[1:]...)
				}
				continue
			}
			var m compute.AgentMessage
			_ = json.Unmarshal(b, &m)
			if m.Type == "exit" {
				exit = m.Exit
			}
		}
		if string(out) != "done\n" || exit.Code != 0 {
			t.Errorf("stdout %q, exit %+v", out, exit)
		}
		if st := closeStatus(t, c); st != websocket.StatusNormalClosure {
			t.Errorf("close status %v, want normal", st)
		}
	})
}

func TestServer_ExecStaleFence(t *testing.T) {
	a := startAgent(t)
	a.open(t, session.NewID(), 5)
	_, resp, err := websocket.Dial(context.Background(), a.url+"/v1/exec", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}, compute.AgentFenceHeader: {"4"}},
	})
	if err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("dial with a stale fence: %v, %v; want 409", err, resp)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(errorOf(t, body).Message, "newer owner") {
		t.Errorf("message %s", body)
	}
}

func TestServer_LostConnectionKillsTheCommand(t *testing.T) {
	a := startAgent(t)
	id := session.NewID()
	a.open(t, id, 1)
	c := a.dialExec(t, 1)
	writeJSON(t, c, compute.AgentExec{ExecRequest: compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo $$ > pid; exec sleep 1000"}}, Window: 1024})
	if m := readControl(t, c); m.Type != "started" {
		t.Fatalf("got %+v", m)
	}
	pidFile := filepath.Join(a.dir, string(id), "workspace", "pid")
	var pid int
	waitFor(t, "the command's pid", 10*time.Second, func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	c.CloseNow()
	waitFor(t, "the command killed", 10*time.Second, func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		return err != nil
	})
}

func TestServer_CloseKillsCommands(t *testing.T) {
	a := startAgent(t)
	a.open(t, session.NewID(), 1)
	c := a.dialExec(t, 1)
	writeJSON(t, c, compute.AgentExec{ExecRequest: compute.ExecRequest{Argv: []string{"sleep", "1000"}}, Window: 1024})
	if m := readControl(t, c); m.Type != "started" {
		t.Fatalf("got %+v", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.srv.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if st, body := a.do(t, "POST", "/v1/sandbox/sleep", 1, nil); st != http.StatusServiceUnavailable {
		t.Errorf("after close: %d %s; want 503", st, body)
	}
}

func TestNew_Validates(t *testing.T) {
	lp, err := local.New(local.Config{Dir: t.TempDir(), Unsafe: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer lp.Close(context.Background())
	for _, cfg := range []sandboxagent.Config{
		{Provider: lp, Dir: "/x"},
		{Token: "t", Dir: "/x"},
		{Token: "t", Provider: lp},
		{Token: "t", Provider: lp, Dir: "/x", Heartbeat: -1},
	} {
		if _, err := sandboxagent.New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(delay)
	}
}
