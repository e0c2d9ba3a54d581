package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
	"github.com/atriumhq/atrium/session"
)

// lockedBuffer is a bytes.Buffer that a command writes while a test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// cli runs atrium commands in-process against one server.
type cli struct {
	t      testing.TB
	server string
	env    map[string]string
}

func newCLI(t testing.TB, server string) *cli {
	return &cli{t: t, server: server, env: map[string]string{"ATRIUM_SERVER": server, "USER": "alice"}}
}

func (c *cli) getenv(k string) string { return c.env[k] }

// run runs args with stdin and returns what the command printed.
func (c *cli) run(ctx context.Context, stdin io.Reader, args ...string) (stdout, stderr string, err error) {
	c.t.Helper()
	var out, errb lockedBuffer
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	err = run(ctx, args, stdin, &out, &errb, c.getenv)
	return out.String(), errb.String(), err
}

// ok runs args and fails the test if the command fails.
func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, errs, err := c.run(cliContext(c.t), nil, args...)
	if err != nil {
		c.t.Fatalf("atrium %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errs)
	}
	return out
}

func cliContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// sdk returns an SDK client of server acting as user.
func sdk(tb testing.TB, server, user string) *client.Client {
	c, err := client.New(server, "dev:"+user)
	if err != nil {
		tb.Fatal(err)
	}
	tr := &http.Transport{}
	c.HTTP = &http.Client{Transport: tr}
	tb.Cleanup(tr.CloseIdleConnections)
	return c
}

// eventually polls cond until it holds or 10s pass.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func exitCode(err error) int {
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if err != nil {
		return 1
	}
	return 0
}

func TestCLI_SessionLifecycle(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newCLI(t, srv.URL)

	id := session.ID(strings.TrimSpace(c.ok("new", "--title", "demo", "--command", `sh -c 'cat'`)))
	if err := id.Validate(); err != nil {
		t.Fatalf("new printed %q, not a session id", id)
	}
	var created session.Session
	if err := json.Unmarshal([]byte(c.ok("new", "--title", "second", "--harness", "shell", "--json")), &created); err != nil || created.Title != "second" || created.Role != session.RoleOwner {
		t.Fatalf("new --json = %+v, %v", created, err)
	}

	table := c.ok("ls")
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "LAST SEQ") ||
		!strings.Contains(table, string(id)) || !strings.Contains(lines[1], "demo") || !strings.Contains(lines[1], "owner") {
		t.Fatalf("ls printed:\n%s", table)
	}
	var list []session.Session
	if err := json.Unmarshal([]byte(c.ok("ls", "--json")), &list); err != nil || len(list) != 2 {
		t.Fatalf("ls --json = %v, %v", list, err)
	}

	if out := c.ok("send", string(id), "hello there"); strings.TrimSpace(out) != "2" {
		t.Fatalf("send printed %q, want the seq 2", out)
	}
	var seqOut struct{ Seq int64 }
	if err := json.Unmarshal([]byte(c.ok("send", string(id), "again", "--json")), &seqOut); err != nil || seqOut.Seq < 3 {
		t.Fatalf("send --json = %+v, %v", seqOut, err)
	}
	eventually(t, "two turns", func() bool { return srv.LastSeq(id) >= 9 })

	// logs --json prints exactly the server's bytes, one event per line.
	page, err := sdk(t, srv.URL, "alice").Events(cliContext(t), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, raw := range page.Raw {
		want.Write(raw)
		want.WriteByte('\n')
	}
	if got := c.ok("logs", string(id), "--json"); got != want.String() {
		t.Fatalf("logs --json:\n%s\nwant:\n%s", got, want.String())
	}
	human := c.ok("logs", string(id), "--after", "1")
	hl := strings.Split(strings.TrimSuffix(human, "\n"), "\n")
	if len(hl) != len(page.Events)-1 || !strings.Contains(hl[0], "message") || !strings.Contains(hl[0], "hello there") ||
		!strings.HasPrefix(strings.TrimSpace(hl[0]), "2 ") || !strings.Contains(human, "turn 1 ok (exit 0") {
		t.Fatalf("logs --after 1 printed:\n%s", human)
	}

	if out := c.ok("share", string(id), "bob", "--role", "driver"); !strings.Contains(out, "bob is now a driver") {
		t.Fatalf("share printed %q", out)
	}
	bob := newCLI(t, srv.URL)
	bob.env["USER"] = "bob"
	if out := bob.ok("ls"); !strings.Contains(out, "driver") {
		t.Fatalf("bob's ls after share:\n%s", out)
	}
	c.ok("share", string(id), "bob", "--role", "none")
	_, errs, err := bob.run(cliContext(t), nil, "logs", string(id))
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "atrium ls") {
		t.Fatalf("bob's logs after unshare = %v (stderr %q), want not found with a hint", err, errs)
	}

	_, _, err = c.run(cliContext(t), nil, "cancel", string(id))
	if err == nil || !strings.Contains(err.Error(), "nothing to cancel") {
		t.Fatalf("cancel with nothing running = %v", err)
	}
	_, _, err = c.run(cliContext(t), nil, "approve", string(id), "zz")
	if err == nil || !strings.Contains(err.Error(), `no pending approval "zz"`) {
		t.Fatalf("approve unknown = %v", err)
	}

	if out := c.ok("rm", string(id)); !strings.Contains(out, "deleted "+string(id)) {
		t.Fatalf("rm printed %q", out)
	}
	if out := c.ok("ls", "--json"); strings.Contains(out, string(id)) {
		t.Fatalf("ls after rm still lists %s", id)
	}
}

func TestCLI_SendWait(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newCLI(t, srv.URL)
	id := strings.TrimSpace(c.ok("new"))

	out, errs, err := c.run(cliContext(t), nil, "send", id, "hello world", "--wait")
	if err != nil || out != "hello world\n" || !strings.Contains(errs, "sent as seq 2") {
		t.Fatalf("send --wait: err %v, stdout %q, stderr %q", err, out, errs)
	}

	out, errs, err = c.run(cliContext(t), nil, "send", id, "fail now", "--wait")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "failed (exit code 3)") {
		t.Fatalf("send --wait of a failing turn: err %v", err)
	}
	if out != "" || !strings.Contains(errs, "failing as asked") {
		t.Fatalf("failing turn: stdout %q (want nothing), stderr %q (want the harness's stderr)", out, errs)
	}

	// The prompt from stdin, and --json lines of exactly this turn.
	out, _, err = c.run(cliContext(t), strings.NewReader("from stdin\n"), "send", id, "-", "--wait", "--json")
	if err != nil {
		t.Fatalf("send - --wait --json: %v", err)
	}
	var kinds []session.Kind
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev session.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q is not an event: %v", line, err)
		}
		kinds = append(kinds, ev.Kind)
	}
	wantKinds := []session.Kind{session.KindTurnStarted, session.KindOutput, session.KindTurnFinished}
	if len(kinds) != len(wantKinds) || kinds[0] != wantKinds[0] || kinds[1] != wantKinds[1] || kinds[2] != wantKinds[2] {
		t.Fatalf("send --wait --json printed kinds %v, want %v:\n%s", kinds, wantKinds, out)
	}
	if !strings.Contains(out, `"text":"from stdin\n"`) {
		t.Fatalf("the prompt from stdin was not echoed:\n%s", out)
	}
}

func TestCLI_SendWaitApproval(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newCLI(t, srv.URL)
	id := strings.TrimSpace(c.ok("new"))

	type result struct {
		out, errs string
		err       error
	}
	done := make(chan result, 1)
	go func() {
		out, errs, err := c.run(cliContext(t), nil, "send", id, "ask", "--wait")
		done <- result{out, errs, err}
	}()
	// send --wait tells how to answer; answer with the approve command.
	eventually(t, "the approval request", func() bool { return srv.LastSeq(session.ID(id)) >= 4 })
	if out := c.ok("approve", id, "a1", "--deny"); strings.TrimSpace(out) != "a1 denied" {
		t.Fatalf("approve --deny printed %q", out)
	}
	r := <-done
	if exitCode(r.err) != 1 || !strings.Contains(r.errs, "atrium approve "+id+" a1") || r.out != "denied\n" {
		t.Fatalf("send --wait with a denied approval: err %v, stdout %q, stderr %q", r.err, r.out, r.errs)
	}
}

func TestCLI_SendWaitInterrupted(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Harness: func(ctx context.Context, _ *clienttest.Turn) int {
		<-ctx.Done()
		return -1
	}})
	c := newCLI(t, srv.URL)
	id := strings.TrimSpace(c.ok("new"))
	ctx, cancel := context.WithCancel(cliContext(t))
	done := make(chan error, 1)
	go func() {
		_, _, err := c.run(ctx, nil, "send", id, "block", "--wait")
		done <- err
	}()
	eventually(t, "the watcher", func() bool { return srv.Watchers(session.ID(id)) == 1 })
	cancel() // Ctrl-C
	err := <-done
	if exitCode(err) != 130 || !strings.Contains(err.Error(), "atrium logs "+id+" --follow") {
		t.Fatalf("interrupted send --wait = %v", err)
	}
	c.ok("cancel", id)
}

func TestCLI_LogsFollow(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newCLI(t, srv.URL)
	id := session.ID(strings.TrimSpace(c.ok("new")))

	ctx, cancel := context.WithCancel(cliContext(t))
	var out, errs lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"logs", string(id), "--follow"}, strings.NewReader(""), &out, &errs, c.getenv)
	}()
	eventually(t, "the session_created line", func() bool { return strings.Contains(out.String(), "session_created") })
	srv.Append(id, session.KindOutput, session.BySystem, session.OutputData{Turn: 1, Stream: "stdout", Text: "live line\n"})
	eventually(t, "the live line", func() bool { return strings.Contains(out.String(), "live line") })
	srv.DropConnections()
	srv.Append(id, session.KindOutput, session.BySystem, session.OutputData{Turn: 1, Stream: "stdout", Text: "after the drop\n"})
	eventually(t, "the line after the drop", func() bool { return strings.Contains(out.String(), "after the drop") })
	if !strings.Contains(errs.String(), "reconnecting") || !strings.Contains(errs.String(), "resumed at seq 2") {
		t.Errorf("stderr after a drop: %q", errs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("logs --follow after Ctrl-C = %v, want a clean exit", err)
	}
	if n := strings.Count(out.String(), "\n"); n != 3 {
		t.Fatalf("logs --follow printed %d lines, want 3 (no repeats):\n%s", n, out.String())
	}
}

func TestCLI_Attach(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newCLI(t, srv.URL)
	id := session.ID(strings.TrimSpace(c.ok("new", "--title", "pair")))

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	var out, errs lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(cliContext(t), []string{"attach", string(id)}, stdinR, &out, &errs, c.getenv)
	}()
	eventually(t, "attached", func() bool {
		return strings.Contains(errs.String(), `attached to `+string(id)+` "pair" as alice (owner)`)
	})
	eventually(t, "presence", func() bool { return strings.Contains(errs.String(), "watching: alice") })

	io.WriteString(stdinW, "say hi\n")
	eventually(t, "the echoed prompt", func() bool {
		return strings.Contains(out.String(), "alice> say hi") && strings.Contains(out.String(), "say hi\n-- turn 1 ok")
	})
	eventually(t, "the ack", func() bool { return strings.Contains(errs.String(), "✓ prompt queued as seq 2") })

	// Someone else watches.
	if err := sdk(t, srv.URL, "alice").SetMember(cliContext(t), id, "bob", session.RoleViewer); err != nil {
		t.Fatal(err)
	}
	bst, err := sdk(t, srv.URL, "bob").Watch(cliContext(t), id, 0, client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "bob joined", func() bool {
		return strings.Contains(errs.String(), "bob joined") && strings.Contains(errs.String(), "watching: alice, bob")
	})
	bst.Close()
	eventually(t, "bob left", func() bool { return strings.Contains(errs.String(), "bob left") })

	io.WriteString(stdinW, "/cancel\n")
	eventually(t, "the cancel error", func() bool { return strings.Contains(errs.String(), "error: no turn is running") })

	srv.DropConnections()
	eventually(t, "the resume notice", func() bool {
		return strings.Contains(errs.String(), "reconnecting") && strings.Contains(errs.String(), "resumed at seq")
	})
	io.WriteString(stdinW, "ask\n")
	eventually(t, "the approval request", func() bool { return strings.Contains(out.String(), "/approve a1 or /deny a1") })
	io.WriteString(stdinW, "/approve a1\n")
	eventually(t, "the approved turn", func() bool {
		return strings.Contains(out.String(), "approval a1 allowed by alice") && strings.Contains(out.String(), "allowed\n-- turn 2 ok")
	})

	stdinW.Close() // Ctrl-D
	if err := <-done; err != nil {
		t.Fatalf("attach after EOF = %v", err)
	}
	if strings.Count(out.String(), "alice> say hi") != 1 {
		t.Fatalf("an event was shown twice across the reconnect:\n%s", out.String())
	}
}

func TestCLI_Errors(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	refused := httptest.NewServer(http.NotFoundHandler())
	refusedURL := refused.URL
	refused.Close()

	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		code int
		msg  []string
	}{
		"missing id":         {nil, []string{"send"}, 2, []string{"send takes 2 argument(s): ID TEXT", "atrium send --help"}},
		"unknown flag":       {nil, []string{"ls", "--bogus"}, 2, []string{"unknown flag: --bogus", "atrium ls --help"}},
		"harness and cmd":    {nil, []string{"new", "--harness", "x", "--command", "y"}, 2, []string{"not both"}},
		"bad command":        {nil, []string{"new", "--command", `"oops`}, 2, []string{"unterminated double quote"}},
		"share without role": {nil, []string{"share", "s_1", "bob"}, 2, []string{"--role is required"}},
		"bad role":           {nil, []string{"share", "s_1", "bob", "--role", "king"}, 2, []string{"want viewer, driver, owner or none"}},
		"empty prompt":       {nil, []string{"send", "s_1", "  "}, 2, []string{"prompt is empty"}},
		"bad server url":     {map[string]string{"ATRIUM_SERVER": "localhost:7080"}, []string{"ls"}, 2, []string{"http://"}},
		"bad token":          {map[string]string{"ATRIUM_TOKEN": "nope"}, []string{"ls"}, 1, []string{"invalid token", "pass --token or set ATRIUM_TOKEN"}},
		"refused":            {map[string]string{"ATRIUM_SERVER": refusedURL}, []string{"ls"}, 1, []string{"connection refused", "make run", "atrium dev"}},
		"not found":          {nil, []string{"logs", "s_nope"}, 1, []string{"not found", "atrium ls"}},
		"not found follow":   {nil, []string{"logs", "s_nope", "--follow"}, 1, []string{"not found", "atrium ls"}},
		"bad id":             {nil, []string{"rm", "a/b"}, 1, []string{"may contain only"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCLI(t, srv.URL)
			for k, v := range tc.env {
				c.env[k] = v
			}
			_, _, err := c.run(cliContext(t), nil, tc.args...)
			if got := exitCode(err); got != tc.code {
				t.Fatalf("exit code %d (err %v), want %d", got, err, tc.code)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
		})
	}
}

func TestCLI_TokenAndServerResolution(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	other := clienttest.New(t, clienttest.Options{})
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"dev user":       {map[string]string{"USER": "carol"}, nil, "Bearer dev:carol"},
		"no user":        {map[string]string{"USER": ""}, nil, "Bearer dev:" + devUser(func(string) string { return "" })},
		"env token":      {map[string]string{"ATRIUM_TOKEN": "dev:dave"}, nil, "Bearer dev:dave"},
		"flag over env":  {map[string]string{"ATRIUM_TOKEN": "dev:dave"}, []string{"--token", "dev:erin"}, "Bearer dev:erin"},
		"server flag":    {map[string]string{"ATRIUM_SERVER": "http://127.0.0.1:1"}, []string{"--server", other.URL}, ""},
		"default server": {nil, nil, "Bearer dev:alice"},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCLI(t, srv.URL)
			for k, v := range tc.env {
				c.env[k] = v
			}
			before := len(srv.Authorizations())
			c.ok(append([]string{"ls"}, tc.args...)...)
			got := srv.Authorizations()[before:]
			if tc.want == "" {
				if len(got) != 0 || len(other.Authorizations()) == 0 {
					t.Fatalf("--server did not win over ATRIUM_SERVER")
				}
				return
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("Authorization = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCLI_Help(t *testing.T) {
	c := newCLI(t, "http://127.0.0.1:1")
	for _, name := range []string{"new", "ls", "send", "logs", "attach", "cancel", "share", "approve", "rm"} {
		out := c.ok(name, "--help")
		for _, want := range []string{"Examples:", "--server", "--token", "dev:$USER", "ATRIUM_TOKEN"} {
			if !strings.Contains(out, want) {
				t.Errorf("atrium %s --help does not mention %q", name, want)
			}
		}
	}
}

func TestParseCommand(t *testing.T) {
	for in, want := range map[string][]string{
		`["python3","-u","a b.py"]`:      {"python3", "-u", "a b.py"},
		`claude -p --output-format json`: {"claude", "-p", "--output-format", "json"},
		`sh -c 'echo "$X"; ls'`:          {"sh", "-c", `echo "$X"; ls`},
		`echo "a \"b\" \$c \n" d\ e`:     {"echo", `a "b" $c \n`, "d e"},
		`  spaced   out  `:               {"spaced", "out"},
		`x '' y`:                         {"x", "", "y"},
	} {
		got, err := parseCommand(in)
		if err != nil || strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
			t.Errorf("parseCommand(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{``, `[]`, `[1,2]`, `'open`, `"open`, `trailing\`, `[""]`} {
		if got, err := parseCommand(bad); err == nil {
			t.Errorf("parseCommand(%s) = %q, want an error", bad, got)
		}
	}
}

func TestCLI_AttachPipedAnswers(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	alice := newCLI(t, srv.URL)
	id := strings.TrimSpace(alice.ok("new"))
	alice.ok("share", id, "bob", "--role", "viewer")
	bob := newCLI(t, srv.URL)
	bob.env["USER"] = "bob"

	// stdin ends right after the prompt: attach still waits for its answer.
	_, errs, err := bob.run(cliContext(t), strings.NewReader("let me in\n"), "attach", id)
	if err != nil || !strings.Contains(errs, "needs the driver role") || !strings.Contains(errs, "atrium share "+id+" YOU --role driver") ||
		!strings.HasSuffix(errs, "detached\n") {
		t.Fatalf("viewer's piped attach: err %v, stderr:\n%s", err, errs)
	}
	_, errs, err = alice.run(cliContext(t), strings.NewReader("echo piped\n"), "attach", id)
	if err != nil || !strings.Contains(errs, "✓ prompt queued as seq") {
		t.Fatalf("owner's piped attach: err %v, stderr:\n%s", err, errs)
	}
}
