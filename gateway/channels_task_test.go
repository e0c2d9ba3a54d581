package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/forge"
	"github.com/atriumhq/atrium/gateway/forge/forgetest"
	"github.com/atriumhq/atrium/gateway/task"
)

// The repository of the task tests, on a forge whose API is forgetest's
// fake GitHub. The fake node's agent plays the task wrapper: a task's
// prompt ends with the wrapper's task_result line (chatfake_test.go).
const (
	taskRepo       = "https://git.acme.test/acme/widgets"
	taskForgeToken = "forge-token-0123456789"
)

// newTaskChatEnv is newChatEnv with repository tasks on, alice having
// write access to acme/widgets and bob read access.
func newTaskChatEnv(t *testing.T) (*chatEnv, *forgetest.Server) {
	t.Helper()
	fg := forgetest.Start(t, forge.TypeGitHub, taskForgeToken)
	fg.Grant("acme/widgets", "alice-gh", forge.PermWrite)
	fg.Grant("acme/widgets", "bob-gh", forge.PermRead)
	api, err := forge.New(forge.Config{Type: forge.TypeGitHub, APIURL: fg.URL, Token: taskForgeToken})
	if err != nil {
		t.Fatal(err)
	}
	fs, ft := startFakeSlack(t), startFakeTelegram(t)
	c := &chatEnv{slack: fs, tg: ft, chans: chatConfig(fs, ft)}
	c.env = newEnv(t, c.gatewayConfig, func(cfg *gateway.Config) {
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
			Forges: []task.Forge{{Host: "git.acme.test", Type: forge.TypeGitHub, API: api, Token: "git-push-token",
				Users: map[string]string{"alice": "alice-gh", "bob": "bob-gh"}}},
			PublicURL:    "https://atrium.test",
			PollInterval: 20 * time.Millisecond,
			Backoff:      dlq.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond, Attempts: 3},
		}}
	})
	c.agent = startAgent(t, c.node, connectNATS(t, c.ns))
	fs.setAtrium(c.srv.URL)
	ft.setAtrium(c.srv.URL)
	return c, fg
}

func TestSlack_TaskFromTheSlashCommand(t *testing.T) {
	c, fg := newTaskChatEnv(t)
	code, reply := c.slack.slash(alice, general, "help")
	if code != http.StatusOK || !strings.Contains(reply, "/atrium task REPO-URL [--base BRANCH] PROMPT") {
		t.Fatalf("help: %d %q", code, reply)
	}
	_, reply = c.slack.slash(alice, general, "task "+taskRepo+" --base develop make the widgets spin")
	sess := c.sessionOf("alice", 1)
	if !strings.HasPrefix(sess.Title, "Task: make the widgets spin") || !strings.Contains(reply, "Started a task on "+taskRepo+" (base develop) in session "+string(sess.ID)) {
		t.Fatalf("task: %q; session %q", reply, sess.Title)
	}
	// The task got its own thread, whose messages show the turn and then
	// the pull request's link.
	root := c.slack.waitMsg("the task's root message", func(m *slackMsg) bool {
		return m.Channel == general && m.ThreadTS == "" && strings.Contains(m.Text, "started a repository task on "+taskRepo)
	})
	pr := c.slack.waitMsg("the pull request's link in the task's thread", func(m *slackMsg) bool {
		return inThread(general, root.TS)(m) && strings.Contains(m.all(), "Pull request opened")
	})
	prs := fg.PRs()
	if len(prs) != 1 || prs[0].Repo != "acme/widgets" || prs[0].Base != "develop" || !strings.HasPrefix(prs[0].Head, "atrium/task_") {
		t.Fatalf("pull requests %+v", prs)
	}
	if !strings.Contains(pr.all(), prs[0].URL) || !strings.Contains(pr.all(), prs[0].Head) {
		t.Fatalf("the thread's message %q does not link %s", pr.all(), prs[0].URL)
	}
	if ms := c.messages(sess.ID, 1); !strings.Contains(string(ms[0].Data), "make the widgets spin") {
		t.Fatalf("the session's prompt %s", ms[0].Data)
	}
}

func TestSlack_TaskFromAMention(t *testing.T) {
	c, fg := newTaskChatEnv(t)
	const root = "1699990801.000100"
	// Slack marks the URL up as a link; the base defaults to main.
	if _, code := c.slack.mention(alice, general, root, "", "task <"+taskRepo+"> fix the flaky test"); code != http.StatusOK {
		t.Fatalf("mention: %d", code)
	}
	sess := c.sessionOf("alice", 1)
	c.slack.waitMsg("the pull request's link in the thread of the mention", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "Pull request opened") && strings.Contains(m.all(), fg.URL+"/acme/widgets/pull/1")
	})
	if prs := fg.PRs(); len(prs) != 1 || prs[0].Base != "main" {
		t.Fatalf("pull requests %+v", prs)
	}
	// The thread is the task's session's: a later mention is a prompt in it.
	_, reply := c.slack.slash(alice, general, "status")
	if !strings.Contains(reply, string(sess.ID)) {
		t.Fatalf("status: %q", reply)
	}
	// A mention of "task" without a URL is an ordinary prompt.
	const other = "1699990802.000100"
	c.slack.mention(alice, general, other, "", "task list is long, shorten it")
	if s := c.sessionOf("alice", 2); strings.HasPrefix(s.Title, "Task:") {
		t.Fatalf("an ordinary mention became a task: %q", s.Title)
	}
	// A second task in a thread that has a session is refused.
	c.slack.mention(alice, general, "1699990803.000100", root, "task "+taskRepo+" more")
	c.slack.waitWhisper(alice, "This thread already belongs to session "+string(sess.ID))
	if n := len(fg.PRs()); n != 1 {
		t.Fatalf("%d pull requests", n)
	}
}

func TestSlack_TaskRefusals(t *testing.T) {
	c, fg := newTaskChatEnv(t)
	// bob may only read the repository: the forge says no before anything
	// exists, and he is told why.
	_, reply := c.slack.slash(bob, general, "task "+taskRepo+" delete everything")
	if !strings.Contains(reply, "Atrium didn't start the task") || !strings.Contains(reply, "tasks need write access") {
		t.Fatalf("task by a reader: %q", reply)
	}
	const root = "1699990901.000100"
	c.slack.mention(bob, general, root, "", "task "+taskRepo+" delete everything")
	w := c.slack.waitWhisper(bob, "tasks need write access")
	if w.Channel != general {
		t.Fatalf("refusal whispered in %q", w.Channel)
	}
	// vic has no login on the forge; strangers are told how to get access.
	_, reply = c.slack.slash(vic, general, "task "+taskRepo+" go")
	if !strings.Contains(reply, "has no git.acme.test login configured") {
		t.Fatalf("task by a user without a forge login: %q", reply)
	}
	_, reply = c.slack.slash(eve, general, "task "+taskRepo+" go")
	if !strings.Contains(reply, "I don't know who you are") {
		t.Fatalf("task by a stranger: %q", reply)
	}
	// Bad requests get the usage or the task service's reason.
	_, reply = c.slack.slash(alice, general, "task "+taskRepo)
	if !strings.Contains(reply, "Tell me the repository and what to do") {
		t.Fatalf("task without a prompt: %q", reply)
	}
	_, reply = c.slack.slash(alice, general, "task https://elsewhere.test/acme/widgets go")
	if !strings.Contains(reply, "no forge is configured for elsewhere.test") {
		t.Fatalf("task on an unknown forge: %q", reply)
	}
	if n := len(c.node.sessionsOf("bob")) + len(c.node.sessionsOf("vic")) + len(c.node.sessionsOf("alice")); n != 0 {
		t.Fatalf("%d sessions after refusals", n)
	}
	if n := len(fg.PRs()); n != 0 {
		t.Fatalf("%d pull requests after refusals", n)
	}
	if n := len(c.slack.messages(func(m *slackMsg) bool { return m.ThreadTS == root })); n != 0 {
		t.Fatalf("%d messages in the thread of a refused task", n)
	}
}

func TestSlack_TaskWithoutTasksConfigured(t *testing.T) {
	c := newChatEnv(t)
	_, reply := c.slack.slash(alice, general, "task "+taskRepo+" make the widgets spin")
	if !strings.Contains(reply, "Repository tasks are not set up on this Atrium") {
		t.Fatalf("task: %q", reply)
	}
	c.slack.mention(alice, general, "1699991001.000100", "", "task "+taskRepo+" make the widgets spin")
	c.slack.waitWhisper(alice, "Repository tasks are not set up on this Atrium")
	if n := len(c.node.sessionsOf("alice")); n != 0 {
		t.Fatalf("%d sessions", n)
	}
}
