package agents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/acp"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// The real-agent tests run the pinned agent programs from npm inside real
// bubblewrap sandboxes, over ACP, against a scripted model server. The
// programs come from a cache that .ci/deps fills (DefaultCacheDir, or
// ATRIUM_AGENTS_CACHE), laid out as an agents directory: <cache>/<name>/<version>.

// DefaultCacheDir is where .ci/deps installs the pinned agents.
const DefaultCacheDir = "/var/cache/atrium-agents"

// testToken is the model token the agents present; the tests check that
// it reaches the model server in the header each agent uses.
const testToken = "atrium-test-token-3f9c"

// agentsCache returns the agents cache directory.
func agentsCache() string {
	if d := os.Getenv("ATRIUM_AGENTS_CACHE"); d != "" {
		return d
	}
	return DefaultCacheDir
}

// realCatalog returns a catalog over the cache with homes in a temporary
// directory, and the installed agent name. A pinned agent missing from the
// cache skips the test loudly, or fails it in CI (where .ci/deps installs
// it).
func realCatalog(t *testing.T, name string) (*agents.Catalog, agents.Installed) {
	t.Helper()
	cat, err := agents.New(agents.Config{Dir: agentsCache(), Homes: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	in, err := cat.Lookup(name)
	spec, _ := cat.Spec(name)
	if err != nil || in.Version != spec.Version {
		msg := fmt.Sprintf("SKIPPING REAL-AGENT TEST: %s %s is not in the agents cache %s (run .ci/deps, or set ATRIUM_AGENTS_CACHE): %v",
			name, spec.Version, agentsCache(), err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Log(strings.Repeat("!", 80))
		t.Skip(msg)
	}
	return cat, in
}

// newProvider returns a local bubblewrap provider over a temporary
// directory.
func newProvider(t *testing.T, unsafe bool) (*local.Provider, string) {
	t.Helper()
	dir := t.TempDir()
	p, err := local.New(local.Config{Dir: dir, Unsafe: unsafe,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close provider: %v", err)
		}
	})
	return p, dir
}

// endpoints points every model family at the scripted server. The sandbox
// shares the host's network (compute.Spec.Network), so it reaches the
// server on the host's loopback.
func endpoints(m *modeltest.Server) compute.ModelEndpoints {
	return compute.ModelEndpoints{Anthropic: m.URL, OpenAI: m.URL + "/v1", Gemini: m.URL, Token: testToken}
}

// agentProc is one agent process in a sandbox with its ACP client.
type agentProc struct {
	t      *testing.T
	proc   compute.Process
	client *acp.Client
	info   acp.AgentInfo
	stderr *lockedBuffer
	done   chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// startAgent launches agent name of session id in sandbox sb and
// initializes it (authenticating where the agent needs it).
func startAgent(t *testing.T, ctx context.Context, sb compute.Sandbox, l agents.Launch) *agentProc {
	t.Helper()
	proc, err := sb.Exec(ctx, compute.ExecRequest{Argv: l.Argv, Env: l.Env, Dir: agents.WorkspacePath})
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	a := &agentProc{t: t, proc: proc, stderr: &lockedBuffer{}, done: make(chan struct{})}
	go func() {
		_, _ = io.Copy(a.stderr, proc.Stderr())
		close(a.done)
	}()
	a.client = acp.Start(proc.Stdin(), proc.Stdout(), acp.Config{
		// OpenCode takes about 10 s to answer initialize on an idle
		// machine; CI runs other packages' tests beside these.
		InitTimeout: 2 * time.Minute,
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
	t.Cleanup(a.stop)
	a.info, err = a.client.Initialize(ctx)
	if err != nil {
		t.Fatalf("initialize: %v\nstderr: %s", err, tail(a.stderr.String(), 4000))
	}
	if l.Authenticate != "" {
		if err := a.client.Authenticate(ctx, l.Authenticate); err != nil {
			t.Fatalf("authenticate %s: %v\nstderr: %s", l.Authenticate, err, tail(a.stderr.String(), 4000))
		}
	}
	return a
}

// stop kills the agent and waits for it.
func (a *agentProc) stop() {
	_ = a.proc.Stdin().Close()
	_ = a.proc.Signal(syscall.SIGKILL)
	go func() { _, _ = io.Copy(io.Discard, a.proc.Stdout()) }()
	<-a.done
	_, _ = a.proc.Wait()
	a.client.Wait()
}

// recorder is a Sink keeping what a prompt produced; it allows every
// permission request once.
type recorder struct {
	mu      sync.Mutex
	events  []recorded
	deltas  int
	perms   []acp.Permission
	problem []string
}

type recorded struct {
	Kind session.Kind
	Data json.RawMessage
}

func (r *recorder) Delta(session.DeltaFrame) {
	r.mu.Lock()
	r.deltas++
	r.mu.Unlock()
}

func (r *recorder) Event(kind session.Kind, data json.RawMessage) {
	r.mu.Lock()
	r.events = append(r.events, recorded{kind, append(json.RawMessage(nil), data...)})
	r.mu.Unlock()
}

func (r *recorder) Permission(_ context.Context, req acp.Permission) (string, bool) {
	r.mu.Lock()
	r.perms = append(r.perms, req)
	r.mu.Unlock()
	for _, o := range req.Options {
		if o.Kind == "allow_once" {
			return o.ID, true
		}
	}
	for _, o := range req.Options {
		if strings.HasPrefix(o.Kind, "allow") {
			return o.ID, true
		}
	}
	return "", false
}

func (r *recorder) Problem(msg string) {
	r.mu.Lock()
	r.problem = append(r.problem, msg)
	r.mu.Unlock()
}

func (r *recorder) kinds() map[session.Kind]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := map[session.Kind]int{}
	for _, e := range r.events {
		n[e.Kind]++
	}
	return n
}

func (r *recorder) messages() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, e := range r.events {
		if e.Kind == session.KindAgentMessage {
			var d session.AgentMessageData
			_ = json.Unmarshal(e.Data, &d)
			b.WriteString(d.Text)
		}
	}
	return b.String()
}

func (r *recorder) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, e := range r.events {
		fmt.Fprintf(&b, "  %s %s\n", e.Kind, tail(string(e.Data), 300))
	}
	for _, p := range r.problem {
		fmt.Fprintf(&b, "  problem: %s\n", p)
	}
	return b.String()
}

// prompt runs one turn and requires it to end with end_turn.
func (a *agentProc) prompt(ctx context.Context, turn int64, text string) *recorder {
	a.t.Helper()
	rec := &recorder{}
	stop, err := a.client.Prompt(ctx, turn, text, rec)
	if err != nil || stop != acp.StopEndTurn {
		a.t.Fatalf("prompt %d: stop %q, %v\nevents:\n%s\nstderr: %s", turn, stop, err, rec.dump(), tail(a.stderr.String(), 6000))
	}
	return rec
}

// realAgentCase is one agent's part of TestRealAgents.
type realAgentCase struct {
	name string
	// write makes the model's tool call that writes path (in /workspace)
	// with content.
	write func(path, content string) modeltest.Reply
	// keyHeader is where the token must arrive, and how.
	keyHeader, keyPrefix string
	// mode is the permission mode the turn runs with.
	mode agents.Mode
	// unsafe runs the agent without bubblewrap (--unsafe-no-sandbox), as
	// the server's user: the mounts' paths are mapped to the host's.
	unsafe bool
}

var realAgentCases = []realAgentCase{
	{
		name: "claude",
		write: func(p, content string) modeltest.Reply {
			return modeltest.Tool("Write", map[string]any{"file_path": p, "content": content})
		},
		keyHeader: "X-Api-Key",
		mode:      agents.ModeAsk,
	},
	{
		name: "claude",
		write: func(p, content string) modeltest.Reply {
			return modeltest.Tool("Write", map[string]any{"file_path": p, "content": content})
		},
		keyHeader: "X-Api-Key",
		mode:      agents.ModeAuto,
	},
	{
		// As root outside a sandbox, Claude Code bypasses permissions
		// only because of IS_SANDBOX=1.
		name: "claude",
		write: func(p, content string) modeltest.Reply {
			return modeltest.Tool("Write", map[string]any{"file_path": p, "content": content})
		},
		keyHeader: "X-Api-Key",
		mode:      agents.ModeAuto,
		unsafe:    true,
	},
	{
		name: "codex",
		write: func(p, content string) modeltest.Reply {
			return modeltest.Tool("exec_command", map[string]any{"cmd": "printf '%s' " + shellQuote(content) + " > " + shellQuote(p)})
		},
		keyHeader: "Authorization", keyPrefix: "Bearer ",
		mode: agents.ModeAsk,
	},
	{
		// Codex 0.16 (its unified exec) runs commands with exec_command.
		name: "codex",
		write: func(p, content string) modeltest.Reply {
			return modeltest.Tool("exec_command", map[string]any{"cmd": "printf '%s' " + shellQuote(content) + " > " + shellQuote(p)})
		},
		keyHeader: "Authorization", keyPrefix: "Bearer ",
		mode: agents.ModeAuto,
	},
	{
		name: "gemini",
		write: func(p, content string) modeltest.Reply {
			return modeltest.Tool("write_file", map[string]any{"file_path": p, "content": content})
		},
		keyHeader: "X-Goog-Api-Key",
		mode:      agents.ModeAutoEdit,
	},
	{
		name: "opencode",
		write: func(p, content string) modeltest.Reply {
			return modeltest.Tool("write", map[string]any{"filePath": p, "content": content})
		},
		keyHeader: "X-Api-Key",
		mode:      agents.ModeAsk,
	},
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func TestRealAgents(t *testing.T) {
	for _, tc := range realAgentCases {
		name := tc.name + "_" + string(tc.mode)
		if tc.unsafe {
			name += "_unsafe"
		}
		t.Run(name, func(t *testing.T) { testRealAgent(t, tc) })
	}
}

func testRealAgent(t *testing.T, tc realAgentCase) {
	cat, in := realCatalog(t, tc.name)
	size, _ := agents.Size(in.Dir)
	t.Logf("%s %s installed at %s: %s", tc.name, in.Version, in.Dir, agents.FormatSize(size))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	m := modeltest.New(t)
	m.Match(modeltest.HasTools)
	p, pdir := newProvider(t, tc.unsafe)
	id := session.NewID()
	l, err := cat.Launch(tc.name, id, endpoints(m), tc.mode)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := p.Open(ctx, compute.Spec{Session: id, Fence: 1, Network: true, Mounts: l.Mounts})
	if err != nil {
		t.Fatal(err)
	}

	// Cold start: process start to initialize answered.
	start := time.Now()
	a := startAgent(t, ctx, sb, l)
	t.Logf("%s cold start (exec to initialize answered): %v; loadSession=%v authMethods=%v",
		tc.name, time.Since(start).Round(time.Millisecond), a.info.Capabilities.LoadSession, a.info.AuthMethods)
	if l.Load && !a.info.Capabilities.LoadSession {
		t.Errorf("the catalog says the agent loads sessions, the agent does not advertise loadSession")
	}
	// The agent's working directory: /workspace in a sandbox, the
	// workspace's host directory without one (ACP's cwd is in the
	// protocol, where the provider cannot map it).
	cwd := agents.WorkspacePath
	if tc.unsafe {
		cwd = filepath.Join(pdir, string(id), "workspace")
	}
	acpID, err := a.client.NewSession(ctx, cwd, nil)
	if err != nil {
		t.Fatalf("session/new: %v\nstderr: %s", err, tail(a.stderr.String(), 4000))
	}

	// Turn 1: the model writes a file through the agent's tool, then
	// answers.
	m.Push(tc.write(cwd+"/hello.txt", "hello from the model\n"), modeltest.Text("I wrote hello.txt."))
	rec := a.prompt(ctx, 1, "Please write hello.txt saying hello.")
	ws := filepath.Join(pdir, string(id), "workspace")
	if b, err := os.ReadFile(filepath.Join(ws, "hello.txt")); err != nil || string(b) != "hello from the model\n" {
		t.Errorf("the workspace's hello.txt holds %q, %v\nevents:\n%s", b, err, rec.dump())
	}
	k := rec.kinds()
	t.Logf("%s turn 1: events %v, %d deltas, %d permission requests", tc.name, k, rec.deltas, len(rec.perms))
	if tc.mode == agents.ModeAsk && len(rec.perms) == 0 {
		t.Errorf("in mode ask the agent wrote without asking")
	}
	if tc.mode != agents.ModeAsk && len(rec.perms) != 0 {
		t.Errorf("in mode %s the agent asked to write a file in /workspace", tc.mode)
	}
	if k[session.KindToolCall] == 0 || k[session.KindAgentMessage] == 0 {
		t.Errorf("turn 1 events %v: want a tool_call and an agent_message\n%s", k, rec.dump())
	}
	if got := rec.messages(); !strings.Contains(got, "I wrote hello.txt.") {
		t.Errorf("turn 1 agent messages %q", got)
	}
	if m.Pending() != 0 {
		t.Errorf("%d scripted replies were not asked for", m.Pending())
	}
	checkToken(t, m, tc)

	// A fresh process loads the session and continues the conversation:
	// the model's next request carries the first prompt.
	a.stop()
	start = time.Now()
	a2 := startAgent(t, ctx, sb, l)
	if !l.Load {
		// The catalog says that a new process cannot be relied on to
		// load the session (Atrium re-hydrates it instead): say what the
		// agent does now, without failing on it, since it varies.
		err := a2.client.LoadSession(ctx, acpID, cwd, nil)
		t.Logf("%s: the catalog says no session/load; in a new process it answered: %v", tc.name, err)
		return
	}
	if err := a2.client.LoadSession(ctx, acpID, cwd, nil); err != nil {
		t.Fatalf("session/load in a new process: %v\nstderr: %s\nagent home:\n%s", err, tail(a2.stderr.String(), 4000), listHome(cat.Home(id)))
	}
	t.Logf("%s restart and session/load: %v", tc.name, time.Since(start).Round(time.Millisecond))
	n := len(m.Requests())
	m.Push(modeltest.Text("You asked me to write hello.txt."))
	rec2 := a2.prompt(ctx, 2, "What did I ask you before?")
	if got := rec2.messages(); !strings.Contains(got, "You asked me to write hello.txt.") {
		t.Errorf("turn 2 agent messages %q\n%s", got, rec2.dump())
	}
	var carried bool
	for _, r := range m.Requests()[n:] {
		if r.Scripted && bytes.Contains(r.Body, []byte("Please write hello.txt saying hello.")) {
			carried = true
		}
	}
	if !carried {
		t.Error("after session/load the model's request does not carry the first prompt: the conversation was not continued")
	}
}

// checkToken checks that the model requests carried the token where the
// agent sends its key.
func checkToken(t *testing.T, m *modeltest.Server, tc realAgentCase) {
	t.Helper()
	for _, r := range m.Requests() {
		if !r.Scripted {
			continue
		}
		if got := r.Header.Get(tc.keyHeader); got != tc.keyPrefix+testToken {
			t.Errorf("%s %s: header %s is %q, want the session's token", r.Method, r.Path, tc.keyHeader, got)
		}
		return
	}
	t.Error("no scripted model request")
}

// listHome lists the files of an agent home, for failure messages.
func listHome(dir string) string {
	var b strings.Builder
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			fmt.Fprintf(&b, "  %s\n", rel)
		}
		return nil
	})
	return b.String()
}
