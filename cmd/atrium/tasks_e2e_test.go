package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/gateway/forge/forgetest"
	"github.com/atriumhq/atrium/gateway/hooks"
	"github.com/atriumhq/atrium/session"
)

// taskStack is a real server (node, local bubblewrap sandboxes, egress
// proxy) configured from a file with one forge: a real git server on
// loopback (git http-backend) and a fake forge API following the GitHub or
// Gitea endpoint shapes.
type taskStack struct {
	srv    *server.Server
	cfg    server.Config
	git    *forgetest.Git
	forge  *forgetest.Server
	repo   string // repository URL
	alice  *cli
	hooked chan []byte // callback bodies that verified

	callbackURL string
}

const (
	taskForgeToken = "forge-token-123456"
	taskHookSecret = "callback-secret-0123456789"
)

func startTaskStack(t *testing.T, typ string) *taskStack {
	t.Helper()
	return startTaskStackWith(t, typ, nil)
}

// startTaskStackWith is startTaskStack with tune applied to the server's
// configuration before it starts.
func startTaskStackWith(t *testing.T, typ string, tune func(*server.Config)) *taskStack {
	t.Helper()
	st := &taskStack{hooked: make(chan []byte, 16)}
	st.git = forgetest.StartGit(t, taskForgeToken)
	st.repo = st.git.Repo("acme/widgets", "main")
	st.forge = forgetest.Start(t, typ, taskForgeToken)
	st.forge.Grant("acme/widgets", "alice-gh", forge.PermWrite)
	st.forge.Grant("acme/widgets", "bob-gh", forge.PermRead)
	gitHost := strings.TrimPrefix(st.git.URL, "http://")

	callbacks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if _, err := hooks.Verify([]byte(taskHookSecret), r.Header.Get(hooks.SignatureHeader), b, time.Now(), time.Minute); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		st.hooked <- b
	}))
	t.Cleanup(callbacks.Close)
	st.callbackURL = callbacks.URL

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "atrium.yaml")
	os.WriteFile(cfgPath, []byte(`
listen: 127.0.0.1:0
data_dir: `+filepath.Join(dir, "data")+`
auth: {mode: dev}
sandbox:
  egress_permit: ["`+gitHost+`"]
tasks:
  callback_secret_env: TEST_TASK_CALLBACK
  attempts: 3
  retry_base: 10ms
  retry_max: 50ms
  forges:
    - host: "`+gitHost+`"
      type: `+typ+`
      api_url: `+st.forge.URL+`
      token_env: TEST_FORGE_TOKEN
      users: {alice: alice-gh, bob: bob-gh}
`), 0o600)
	getenv := func(k string) string {
		return map[string]string{"TEST_FORGE_TOKEN": taskForgeToken, "TEST_TASK_CALLBACK": taskHookSecret}[k]
	}
	f, err := config.Load(cfgPath, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(true); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	st.cfg, err = serverConfig(f, &logs, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(&st.cfg)
	}
	st.srv, err = server.Start(context.Background(), st.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st.srv.Close(ctx)
		if strings.Contains(logs.String(), taskForgeToken) {
			t.Errorf("the forge token is in the server's logs")
		}
	})
	st.alice = newCLI(t, st.srv.URL())
	return st
}

// waitTask polls GET /v1/tasks/{id} as user until the task is no longer
// running.
func (st *taskStack) waitTask(t *testing.T, user, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var task map[string]any
		(api{t: t, base: st.srv.URL(), user: user}).must(http.StatusOK, "GET", "/v1/tasks/"+id, nil, &task)
		if task["status"] != "running" {
			return task
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still running: %v", id, task)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// events returns the session's events of kind, as alice.
func (st *taskStack) events(t *testing.T, id session.ID, kind string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range nodeHistory(t, st.srv, session.Principal{User: "alice"}, id) {
		if e["kind"] == kind {
			out = append(out, e)
		}
	}
	return out
}

// TestTasks_EndToEnd runs repository tasks through the real server with
// GitHub- and Gitea-shaped forges.
func TestTasks_EndToEnd(t *testing.T) {
	for _, typ := range []string{forge.TypeGitHub, forge.TypeGitea} {
		t.Run(typ, func(t *testing.T) { testTasks(t, typ) })
	}
}

func testTasks(t *testing.T, typ string) {
	st := startTaskStack(t, typ)
	alice := api{t: t, base: st.srv.URL(), user: "alice"}
	bob := api{t: t, base: st.srv.URL(), user: "bob"}

	t.Run("permission denied before any session", func(t *testing.T) {
		code, body := bob.do("POST", "/v1/tasks", map[string]any{"repo": st.repo, "base": "main", "prompt": "touch x"})
		if code != http.StatusForbidden || !strings.Contains(string(body), `"forbidden"`) || !strings.Contains(string(body), "write access") {
			t.Fatalf("bob (read access): %d %s", code, body)
		}
		var list struct{ Sessions []session.Session }
		bob.must(http.StatusOK, "GET", "/v1/sessions", nil, &list)
		if len(list.Sessions) != 0 {
			t.Fatalf("bob has sessions after a refused task: %v", list.Sessions)
		}
		code, body = (api{t: t, base: st.srv.URL(), user: "carol"}).do("POST", "/v1/tasks",
			map[string]any{"repo": st.repo, "base": "main", "prompt": "touch x"})
		if code != http.StatusForbidden || !strings.Contains(string(body), "tasks.forges[].users") {
			t.Fatalf("carol (no forge login): %d %s", code, body)
		}
		code, body = alice.do("POST", "/v1/tasks", map[string]any{"repo": "https://elsewhere.example/a/b", "base": "main", "prompt": "x"})
		if code != http.StatusBadRequest || !strings.Contains(string(body), "no forge is configured for elsewhere.example") {
			t.Fatalf("unknown forge: %d %s", code, body)
		}
	})

	t.Run("task opens a pull request", func(t *testing.T) {
		cb := st.callbackURL
		var started struct {
			Task    string
			Session session.ID
			Branch  string
		}
		alice.must(http.StatusAccepted, "POST", "/v1/tasks", map[string]any{
			"repo": st.repo, "base": "main", "title": "Add greeting",
			"prompt":       "echo 'hello from the task' > GREETING && test -z \"$TASK_GIT_TOKEN\"",
			"callback_url": cb,
		}, &started)
		task := st.waitTask(t, "alice", started.Task)
		if task["status"] != "pr_opened" {
			t.Fatalf("task: %v\noutput: %v", task, st.events(t, started.Session, "output"))
		}
		branch := "atrium/" + started.Task
		if started.Branch != branch {
			t.Errorf("branch %q, want %q", started.Branch, branch)
		}
		// The branch is pushed, with the work, by alice.
		if rev := st.git.Rev("acme/widgets", branch); rev == "" || rev != task["commit"] {
			t.Fatalf("bare repo has %s at %q, task says %v", branch, rev, task["commit"])
		}
		if got := st.git.Git("acme/widgets", "show", branch+":GREETING"); got != "hello from the task" {
			t.Errorf("GREETING = %q", got)
		}
		if got := st.git.Git("acme/widgets", "log", "-1", "--format=%an|%s", branch); got != "alice|Add greeting" {
			t.Errorf("commit = %q", got)
		}
		// The pull request has the right title, body, head and base.
		prs := st.forge.PRs()
		if len(prs) != 1 {
			t.Fatalf("forge has %d pull requests", len(prs))
		}
		pr := prs[0]
		if pr.Repo != "acme/widgets" || pr.Title != "Add greeting" || pr.Head != branch || pr.Base != "main" ||
			!strings.Contains(pr.Body, string(started.Session)) || !strings.Contains(pr.Body, "echo 'hello from the task'") {
			t.Errorf("pull request %+v", pr)
		}
		if task["pr_url"] != pr.URL {
			t.Errorf("task pr_url %v, forge %s", task["pr_url"], pr.URL)
		}
		// pr_opened is in the session, by alice.
		evs := st.events(t, started.Session, "pr_opened")
		if len(evs) != 1 {
			t.Fatalf("pr_opened events: %v", evs)
		}
		if d := evs[0]["data"].(map[string]any); d["url"] != pr.URL || d["branch"] != branch || evs[0]["by"] != "alice" {
			t.Errorf("pr_opened %v", evs[0])
		}
		// Nobody else sees the task.
		if code, body := bob.do("GET", "/v1/tasks/"+started.Task, nil); code != http.StatusNotFound {
			t.Errorf("bob reads alice's task: %d %s", code, body)
		}
		// The credential was a secret only while the turn ran.
		st.noSecrets(t, started.Session)
		// The link was delivered to the callback, signed.
		select {
		case b := <-st.hooked:
			var got struct {
				Type string
				Task struct {
					ID     string
					PRURL  string `json:"pr_url"`
					Status string
				}
			}
			json.Unmarshal(b, &got)
			if got.Type != "task_result" || got.Task.ID != started.Task || got.Task.PRURL != pr.URL || got.Task.Status != "pr_opened" {
				t.Errorf("callback %s", b)
			}
		case <-time.After(e2eWait):
			t.Fatal("no signed callback")
		}
	})

	t.Run("no changes: nothing to do", func(t *testing.T) {
		var started struct {
			Task    string
			Session session.ID
		}
		alice.must(http.StatusAccepted, "POST", "/v1/tasks", map[string]any{"repo": st.repo, "base": "main", "prompt": "cat README"}, &started)
		task := st.waitTask(t, "alice", started.Task)
		if task["status"] != "nothing_to_do" {
			t.Fatalf("task: %v", task)
		}
		if rev := st.git.Rev("acme/widgets", "atrium/"+started.Task); rev != "" {
			t.Errorf("a branch was pushed: %s", rev)
		}
		var said bool
		for _, e := range st.events(t, started.Session, "output") {
			said = said || strings.Contains(e["data"].(map[string]any)["text"].(string), "Nothing to do")
		}
		if !said {
			t.Errorf("the session does not say there was nothing to do")
		}
		if n := len(st.forge.PRs()); n != 1 {
			t.Errorf("forge has %d pull requests, want still 1", n)
		}
	})

	t.Run("forge down: retried, dead letter, retried by hand", func(t *testing.T) {
		st.forge.SetPullsDown(true)
		calls := st.forge.Calls()
		var started struct {
			Task    string
			Session session.ID
		}
		alice.must(http.StatusAccepted, "POST", "/v1/tasks", map[string]any{"repo": st.repo, "base": "main", "prompt": "date > STAMP"}, &started)
		task := st.waitTask(t, "alice", started.Task)
		dl, _ := task["dead_letter"].(string)
		if task["status"] != "failed" || dl == "" || !strings.Contains(task["error"].(string), "503") {
			t.Fatalf("task: %v", task)
		}
		// The permission check, then 3 attempts to open the pull request.
		if n := st.forge.Calls() - calls; n != 1+3 {
			t.Errorf("forge got %d calls, want 4", n)
		}
		if st.git.Rev("acme/widgets", "atrium/"+started.Task) == "" {
			t.Fatal("the branch was not pushed before the forge failed")
		}
		q := st.cfg.Tasks.Service.DLQ
		e, err := q.Get(context.Background(), dl)
		if err != nil || e.Kind != "task" || e.Ref != started.Task || e.User != "alice" || e.Permanent || e.Attempts != 3 {
			t.Fatalf("dead letter %+v, %v", e, err)
		}
		st.forge.SetPullsDown(false)
		if err := q.Retry(context.Background(), dl); err != nil {
			t.Fatalf("retry: %v", err)
		}
		task = st.waitTask(t, "alice", started.Task)
		if task["status"] != "pr_opened" || task["pr_url"] == "" {
			t.Fatalf("after retry: %v", task)
		}
		if _, err := q.Get(context.Background(), dl); err == nil {
			t.Error("the dead letter is still there after a successful retry")
		}
		if len(st.events(t, started.Session, "pr_opened")) != 1 {
			t.Error("no pr_opened after the retry")
		}
	})

	t.Run("CLI", func(t *testing.T) {
		out := st.alice.ok("task", "run", "--repo", st.repo, "--base", "main", "--title", "From the CLI", "echo cli > CLI.txt")
		if _, err := url.Parse(strings.TrimSpace(out)); err != nil || !strings.HasPrefix(strings.TrimSpace(out), st.forge.URL) {
			t.Fatalf("task run printed %q (%v)", out, err)
		}
		prs := st.forge.PRs()
		last := prs[len(prs)-1]
		if last.Title != "From the CLI" {
			t.Errorf("last pull request %+v", last)
		}
		id := strings.TrimPrefix(last.Head, "atrium/")
		if _, _, err := st.alice.run(cliContext(t), nil, "task", "show", "task_nope"); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("task show of an unknown task: %v", err)
		}
		show := st.alice.ok("task", "show", id)
		if !strings.Contains(show, "pr_opened") || !strings.Contains(show, last.URL) {
			t.Errorf("task show:\n%s", show)
		}
	})

	t.Run("list", func(t *testing.T) {
		// GET /v1/tasks: alice's tasks, newest (the CLI's) first, the
		// shape GET /v1/tasks/{id} has.
		var all struct{ Tasks []map[string]any }
		alice.must(http.StatusOK, "GET", "/v1/tasks", nil, &all)
		if len(all.Tasks) != 4 {
			t.Fatalf("alice has %d tasks, want 4: %v", len(all.Tasks), all.Tasks)
		}
		newest := all.Tasks[0]
		if newest["title"] != "From the CLI" || newest["user"] != "alice" || newest["status"] != "pr_opened" {
			t.Errorf("newest task %v", newest)
		}
		id, sess := newest["id"].(string), newest["session"].(string)
		var one map[string]any
		alice.must(http.StatusOK, "GET", "/v1/tasks/"+id, nil, &one)
		if fmt.Sprint(one) != fmt.Sprint(newest) {
			t.Errorf("listed task %v, GET /v1/tasks/{id} %v", newest, one)
		}
		var bySession struct{ Tasks []map[string]any }
		alice.must(http.StatusOK, "GET", "/v1/tasks?session="+sess, nil, &bySession)
		if len(bySession.Tasks) != 1 || bySession.Tasks[0]["id"] != id {
			t.Errorf("tasks of session %s: %v", sess, bySession.Tasks)
		}
		// Nobody else sees them.
		if code, body := bob.do("GET", "/v1/tasks", nil); code != http.StatusOK || strings.TrimSpace(string(body)) != `{"tasks":[]}` {
			t.Errorf("bob lists tasks: %d %s", code, body)
		}
		if code, body := bob.do("GET", "/v1/tasks?session="+sess, nil); code != http.StatusOK || strings.TrimSpace(string(body)) != `{"tasks":[]}` {
			t.Errorf("bob lists the tasks of alice's session: %d %s", code, body)
		}
		for q, want := range map[string]string{"?colour=red": `unknown query parameter \"colour\"`, "?session=a%20b": "session"} {
			if code, body := alice.do("GET", "/v1/tasks"+q, nil); code != http.StatusBadRequest || !strings.Contains(string(body), want) {
				t.Errorf("GET /v1/tasks%s: %d %s, want 400 containing %s", q, code, body, want)
			}
		}
		// atrium task ls.
		ls := st.alice.ok("task", "ls")
		if lines := strings.Split(strings.TrimSpace(ls), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[1], id) || !strings.Contains(lines[1], "From the CLI") {
			t.Errorf("task ls:\n%s", ls)
		}
		var listed []map[string]any
		if err := json.Unmarshal([]byte(st.alice.ok("task", "ls", "--session", sess, "--json")), &listed); err != nil || len(listed) != 1 || listed[0]["id"] != id {
			t.Errorf("task ls --session --json: %v %v", listed, err)
		}
	})
}

// noSecrets checks the session has no secrets left.
func (st *taskStack) noSecrets(t *testing.T, id session.ID) {
	t.Helper()
	var list struct {
		Secrets []session.SecretInfo
	}
	(api{t: t, base: st.srv.URL(), user: "alice"}).must(http.StatusOK, "GET", "/v1/sessions/"+string(id)+"/secrets", nil, &list)
	if len(list.Secrets) != 0 {
		t.Errorf("secrets left after the task: %v", list.Secrets)
	}
}
