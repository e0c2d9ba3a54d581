package main

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/session"
)

// agentTaskWait bounds an agent task: a cold Claude Code start, model calls,
// the clone, the workspace's way in and out, the push.
const agentTaskWait = 4 * time.Minute

// requireClaude skips the test loudly when the pinned claude agent is not
// in the agents cache, and fails it in CI, where .ci/deps installs it.
func requireClaude(t *testing.T) {
	t.Helper()
	cat, err := agents.New(agents.Config{Dir: agentsCacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := cat.Spec("claude")
	if in, err := cat.Lookup("claude"); err != nil || in.Version != spec.Version {
		msg := "SKIPPING REAL-AGENT TEST: claude " + spec.Version + " is not in the agents cache " + agentsCacheDir() + " (run .ci/deps)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// waitTaskWithin is waitTask with a deadline of wait.
func (st *taskStack) waitTaskWithin(t *testing.T, user, id string, wait time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		var task map[string]any
		(api{t: t, base: st.srv.URL(), user: user}).must(http.StatusOK, "GET", "/v1/tasks/"+id, nil, &task)
		if task["status"] != "running" {
			return task
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still running after %v: %v", id, wait, task)
		}
		time.Sleep(200 * time.Millisecond) // Polling interval, not synchronization.
	}
}

// TestTasks_Agent runs `atrium task run --agent claude` through the real
// server: the real Claude Code (claude-agent-acp from npm, in a bubblewrap
// sandbox) works in a workspace seeded with a real git repository served on
// loopback, its model a scripted Anthropic API; the server commits what it
// wrote, pushes the task's branch and opens the pull request on a
// GitHub-shaped forge. The agent's state is not committed; the workspace
// held the repository (its README) before the agent's turn.
func TestTasks_Agent(t *testing.T) {
	requireClaude(t)
	up := modeltest.New(t)
	up.Match(modeltest.HasTools) // Claude Code's side requests (titles) get the default answer.
	st := startTaskStackWith(t, forge.TypeGitHub, func(c *server.Config) {
		c.AgentsDir, c.AgentMode = agentsCacheDir(), "auto"
		c.Models.Providers = []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-real-upstream"}}
		// The workspace quota `atrium serve` turns on by default stays on
		// and is required (not best effort): the task's workspace is seeded
		// before its sandbox exists, then restored into the sandbox's
		// quota-limited workspace.
		if c.Sandbox.WorkspaceDiskBytes <= 0 {
			t.Fatalf("sandbox workspace quota is off by default: %+v", c.Sandbox)
		}
		c.Sandbox.WorkspaceDiskAuto = false
	})

	t.Run("pull request from the agent's work", func(t *testing.T) {
		// The agent reads the README the seed put in /workspace, then
		// writes a file next to it.
		up.Push(
			modeltest.Tool("Read", map[string]any{"file_path": "/workspace/README"}),
			modeltest.Tool("Write", map[string]any{"file_path": "/workspace/GREETING", "content": "hello from claude\n"}),
			modeltest.Text("I added GREETING."))
		out, errs, err := st.alice.run(cliContext(t), nil, "task", "run", "--repo", st.repo, "--base", "main", "--agent", "claude",
			"--title", "Greet from Claude", "Add a GREETING file next to the README.")
		if err != nil {
			t.Fatalf("task run --agent claude: %v\nstdout %q\nstderr %s", err, out, errs)
		}
		prURL := strings.TrimSpace(out)
		prs := st.forge.PRs()
		if len(prs) != 1 || prs[0].URL != prURL {
			t.Fatalf("task run printed %q; forge has %+v", prURL, prs)
		}
		pr := prs[0]
		if pr.Title != "Greet from Claude" || pr.Base != "main" || !strings.HasPrefix(pr.Head, "atrium/task_") {
			t.Errorf("pull request %+v", pr)
		}
		if got := st.git.Git("acme/widgets", "show", pr.Head+":GREETING"); got != "hello from claude" {
			t.Errorf("GREETING on %s = %q", pr.Head, got)
		}
		// One commit on main, by alice, with only the agent's work: the
		// README unchanged, no agent state, no workspace .git.
		if got := st.git.Git("acme/widgets", "log", "--format=%an|%s", "main.."+pr.Head); got != "alice|Greet from Claude" {
			t.Errorf("commits on the branch: %q", got)
		}
		if got := st.git.Git("acme/widgets", "diff", "--name-status", "main", pr.Head); got != "A\tGREETING" {
			t.Errorf("the branch changes %q, want only GREETING added", got)
		}
		// The task and the session say so.
		var task map[string]any
		taskID := "task_" + strings.TrimPrefix(pr.Head, "atrium/task_")
		(api{t: t, base: st.srv.URL(), user: "alice"}).must(http.StatusOK, "GET", "/v1/tasks/"+taskID, nil, &task)
		if task["status"] != "pr_opened" || task["agent"] != "claude" || task["pr_url"] != prURL {
			t.Fatalf("task %v", task)
		}
		id := session.ID(task["session"].(string))
		if evs := st.events(t, id, "pr_opened"); len(evs) != 1 {
			t.Errorf("pr_opened events %v", evs)
		}
		// The agent read the README the seed put into /workspace before
		// its turn, and wrote GREETING there.
		var readREADME, wroteGREETING bool
		for _, e := range st.events(t, id, "tool_call_update") {
			d := e["data"].(map[string]any)
			if d["status"] != "completed" {
				continue
			}
			content, _ := json.Marshal(d["content"])
			readREADME = readREADME || strings.Contains(string(content), "1→hello")
			wroteGREETING = wroteGREETING || d["id"] == "toolu_000000000000000000000004"
		}
		if !readREADME || !wroteGREETING {
			t.Errorf("completed tool calls (read the README %v, wrote GREETING %v): %v", readREADME, wroteGREETING,
				st.events(t, id, "tool_call_update"))
		}
		var final string
		for _, e := range st.events(t, id, "agent_message") {
			final, _ = e["data"].(map[string]any)["text"].(string)
		}
		if final != "I added GREETING." {
			t.Errorf("the agent's final message %q", final)
		}
		// The forge token never entered the session.
		st.noSecrets(t, id)
	})

	t.Run("nothing changed: no branch", func(t *testing.T) {
		up.Push(modeltest.Text("Nothing to change."))
		var started struct {
			Task    string
			Session session.ID
		}
		(api{t: t, base: st.srv.URL(), user: "alice"}).must(http.StatusAccepted, "POST", "/v1/tasks",
			map[string]any{"repo": st.repo, "base": "main", "prompt": "Is the README fine?", "agent": "claude"}, &started)
		task := st.waitTaskWithin(t, "alice", started.Task, agentTaskWait)
		if task["status"] != "nothing_to_do" {
			t.Fatalf("task %v", task)
		}
		if rev := st.git.Rev("acme/widgets", "atrium/"+started.Task); rev != "" {
			t.Errorf("a branch was pushed: %s", rev)
		}
		if n := len(st.forge.PRs()); n != 1 {
			t.Errorf("forge has %d pull requests, want still 1", n)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		_, errs, err := st.alice.run(cliContext(t), nil, "task", "run", "--repo", st.repo, "--agent", "claude", "--command", "true", "x")
		if err == nil || !strings.Contains(err.Error()+errs, "give --agent or --command, not both") {
			t.Errorf("--agent with --command: %v %s", err, errs)
		}
		code, body := (api{t: t, base: st.srv.URL(), user: "alice"}).do("POST", "/v1/tasks",
			map[string]any{"repo": st.repo, "base": "main", "prompt": "x", "harness": map[string]any{"agent": "no-such-agent"}})
		if code != http.StatusBadRequest || !strings.Contains(string(body), `unknown agent \"no-such-agent\"`) {
			t.Errorf("a task with an agent that is not installed: %d %s", code, body)
		}
	})
}
