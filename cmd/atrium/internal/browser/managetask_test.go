package browser

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/gateway/forge/forgetest"
	"github.com/atriumhq/atrium/gateway/task"
	"github.com/atriumhq/atrium/session"
)

// TestBrowser_ManageTask: the Manage dialog of a repository task's session
// lists that task from GET /v1/tasks (title as text, repo, base, status,
// branch, its pull request's link once opened); another session's dialog says
// it is not a task's. The task runs for real: the shell harness in a
// sandbox clones a repository served on loopback and the server opens the
// pull request on a fake GitHub.
func TestBrowser_ManageTask(t *testing.T) {
	t.Parallel()
	const token = "forge-token-0123456789"
	git := forgetest.StartGit(t, token)
	repo := git.Repo("acme/widgets", "main")
	fg := forgetest.Start(t, forge.TypeGitHub, token)
	fg.Grant("acme/widgets", "alice-gh", forge.PermWrite)
	api, err := forge.New(forge.Config{Type: forge.TypeGitHub, APIURL: fg.URL, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	gitHost := strings.TrimPrefix(git.URL, "http://")
	st := startStack(t, func(c *server.Config) {
		c.Sandbox.EgressPermit = []string{gitHost}
		c.Tasks = &gateway.Tasks{Service: task.Config{
			Forges:       []task.Forge{{Host: gitHost, Type: forge.TypeGitHub, API: api, Token: token, Users: map[string]string{"alice": "alice-gh"}}},
			PollInterval: 50 * time.Millisecond,
		}}
	})
	title := "Greet " + hostileText
	var started struct {
		Task    string     `json:"task"`
		Session session.ID `json:"session"`
	}
	st.api("alice", http.StatusAccepted, "POST", "/v1/tasks", map[string]any{"repo": repo, "base": "main", "title": title, "prompt": "echo hi > HI"}, &started)
	var tk struct {
		Status string `json:"status"`
		PRURL  string `json:"pr_url"`
		Error  string `json:"error"`
	}
	for deadline := time.Now().Add(waitLong); ; {
		st.api("alice", http.StatusOK, "GET", "/v1/tasks/"+started.Task, nil, &tk)
		if tk.Status != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still running", started.Task)
		}
		time.Sleep(50 * time.Millisecond) // polling the server's state, not synchronizing
	}
	if tk.Status != "pr_opened" || tk.PRURL == "" {
		t.Fatalf("task %s: %+v", started.Task, tk)
	}
	plain := st.create("alice", "not a task", "shell")

	alice := st.open("alice")
	alice.openSession(started.Session)
	alice.waitLive()
	alice.click("#manage-open")
	alice.waitJS("the Manage dialog", `document.querySelector('#manage').open`)
	row := `#manage-tasks li[data-task="` + started.Task + `"]`
	alice.waitJS("the session's task listed", `document.querySelector(`+jsString(row)+`) !== null`)
	if msg := eval[string](alice, noMarkup("#manage-tasks")); msg != "" {
		t.Fatal(msg)
	}
	text := eval[string](alice, `document.querySelector(`+jsString(row)+`).textContent`)
	for _, want := range []string{`<img src=x onerror=`, "␛[31mred", repo + " @ main", "status pr_opened", "branch atrium/" + started.Task} {
		if !strings.Contains(text, want) {
			t.Errorf("the task's row %q lacks %q", text, want)
		}
	}
	if href := eval[string](alice, `document.querySelector(`+jsString(row+` a`)+`).href`); href != tk.PRURL {
		t.Errorf("the pull request link is %q, want %q", href, tk.PRURL)
	}
	if n := eval[int](alice, `document.querySelectorAll('#manage-tasks li').length`); n != 1 {
		t.Errorf("%d tasks listed, want the session's one", n)
	}

	other := st.open("alice")
	other.openSession(plain.ID)
	other.waitLive()
	other.click("#manage-open")
	other.waitJS("the Manage dialog", `document.querySelector('#manage').open`)
	other.waitJS("the not-a-task note", `document.querySelector('#manage-tasks-note').textContent.includes("not a repository task's")`)
	if n := eval[int](other, `document.querySelectorAll('#manage-tasks li').length`); n != 0 {
		t.Errorf("%d tasks listed in a session that is no task's", n)
	}
}
