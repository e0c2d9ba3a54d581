package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/gateway/forge/forgetest"
	"github.com/atriumhq/atrium/gateway/task"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// taskAgents is scriptedAgents with the scripted agent's state outside
// /workspace, as real agents keep theirs in their home: a task must commit
// the agent's work, not its state.
type taskAgents struct{ scriptedAgents }

func (f taskAgents) Launch(name string, id session.ID, ep compute.ModelEndpoints, mode string) (actor.AgentLaunch, error) {
	l, err := f.scriptedAgents.Launch(name, id, ep, mode)
	for i, kv := range l.Env {
		if strings.HasPrefix(kv, "FAKE_ACP_STATE=") {
			l.Env[i] = "FAKE_ACP_STATE=/tmp/fakeacp"
		}
	}
	return l, err
}

// TestSlack_AgentTask: "/atrium task REPO --agent fake PROMPT" runs the
// prompt as an agent session's turn on a real node, with a real git
// repository served on loopback: the task's thread shows the agent's final
// message (not raw JSON) and then the pull request's link, whose branch
// holds the agent's edit and nothing of its state.
func TestSlack_AgentTask(t *testing.T) {
	git := forgetest.StartGit(t, taskForgeToken)
	repo := git.Repo("acme/widgets", "main")
	fg := forgetest.Start(t, forge.TypeGitHub, taskForgeToken)
	fg.Grant("acme/widgets", "alice-gh", forge.PermWrite)
	api, err := forge.New(forge.Config{Type: forge.TypeGitHub, APIURL: fg.URL, Token: taskForgeToken})
	if err != nil {
		t.Fatal(err)
	}
	ns := startNATS(t)
	// A real node with an object store, so the workspace moves in and out
	// through the files archive.
	startFilesNode(t, ns, &blob.Dir{Path: t.TempDir()}, func(c *actor.Config) {
		c.Agents = taskAgents{scriptedAgents{dir: scriptedAgentDir(t)}}
		c.SecretKeys = testSecretKeys(t)
	})
	fs, ft := startFakeSlack(t), startFakeTelegram(t)
	c := &chatEnv{slack: fs, tg: ft, chans: chatConfig(fs, ft), env: &env{t: t, ns: ns}}
	c.gw, c.srv, c.reg = startGateway(t, ns, c.gatewayConfig, func(cfg *gateway.Config) {
		js, err := jetstream.New(cfg.NATS)
		if err != nil {
			t.Fatal(err)
		}
		q, err := dlq.Open(context.Background(), dlq.Config{JetStream: js, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Tasks = &gateway.Tasks{Service: task.Config{
			DLQ: q,
			Forges: []task.Forge{{Host: strings.TrimPrefix(git.URL, "http://"), Type: forge.TypeGitHub, API: api, Token: taskForgeToken,
				Users: map[string]string{"alice": "alice-gh"}}},
			PollInterval: 20 * time.Millisecond,
			Backoff:      dlq.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond, Attempts: 2},
		}}
	})
	fs.setAtrium(c.srv.URL)
	ft.setAtrium(c.srv.URL)

	code, reply := c.slack.slash(alice, general, "task "+repo+" --agent fake tool")
	if code != http.StatusOK || !strings.Contains(reply, "Started a task on "+repo+" (base main)") {
		t.Fatalf("task: %d %q", code, reply)
	}
	root := c.slack.waitMsg("the task's root message", func(m *slackMsg) bool {
		return m.Channel == general && m.ThreadTS == "" && strings.Contains(m.Text, "started a repository task on "+repo)
	})
	_, rest, _ := strings.Cut(reply, "in session ")
	id := session.ID(strings.TrimRight(strings.Fields(rest)[0], ";.,"))
	var done slackMsg
	deadline := time.Now().Add(waitTimeout)
	for {
		if ms := c.slack.messages(func(m *slackMsg) bool {
			return inThread(general, root.TS)(m) && strings.Contains(m.all(), "Done.")
		}); len(ms) > 0 {
			done = ms[0]
			break
		}
		if time.Now().After(deadline) {
			_, evs := c.call("GET", "/v1/sessions/"+string(id)+"/events", "alice", nil)
			t.Fatalf("no final message in the thread; thread: %+v\nsession events: %s",
				c.slack.messages(inThread(general, root.TS)), evs)
		}
		time.Sleep(20 * time.Millisecond) // Polling interval, not synchronization.
	}
	if !strings.Contains(done.Text, "Done.") || strings.Contains(done.Text, `{"`) || strings.Contains(done.all(), "agent_message") {
		t.Errorf("the thread shows raw events, not the agent's final message: %q", done.all())
	}
	c.slack.waitMsg("the pull request's link in the task's thread", func(m *slackMsg) bool {
		return inThread(general, root.TS)(m) && strings.Contains(m.all(), "Pull request opened")
	})
	prs := fg.PRs()
	if len(prs) != 1 || !strings.HasPrefix(prs[0].Head, "atrium/task_") {
		t.Fatalf("pull requests %+v", prs)
	}
	if got := git.Git("acme/widgets", "show", prs[0].Head+":a.txt"); got != "new" {
		t.Errorf("a.txt on the branch = %q, want the agent's edit", got)
	}
	if got := git.Git("acme/widgets", "diff", "--name-status", "main", prs[0].Head); got != "A\ta.txt" {
		t.Errorf("the branch changes %q, want only a.txt added", got)
	}
	// The session ran the agent: its history has the agent's kinds.
	code, body := c.call("GET", "/v1/sessions/"+string(id)+"/events", "alice", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"kind":"agent_message"`) || !strings.Contains(string(body), `"kind":"pr_opened"`) {
		t.Errorf("session %s events: %d %s", id, code, body)
	}
}
