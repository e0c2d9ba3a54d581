package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/atriumhq/atrium/gateway/hooks"
	"github.com/atriumhq/atrium/gateway/slack"
	"github.com/atriumhq/atrium/gateway/telegram"
	"github.com/atriumhq/atrium/session"
)

// Slack users of the tests, in workspace T0ACME (tenant acme).
const (
	alice   = "U0ALICE" // mapped to alice
	bob     = "U0BOB"   // mapped to bob
	vic     = "U0VIC"   // mapped to vic
	globex  = "U0GLOBEX"
	dana    = "U0DANA" // known by her verified email dana@acme.test
	eve     = "U0EVE"  // unknown
	general = "C0GENERAL"
)

// chatEnv is a gateway with Slack, Telegram and webhooks on, a fake node
// whose sessions run scripted turns (agent), a fake Slack and a fake
// Telegram.
type chatEnv struct {
	*env
	slack *fakeSlack
	tg    *fakeTelegram
	agent *agent
	chans *gateway.Channels
}

func chatConfig(fs *fakeSlack, ft *fakeTelegram) *gateway.Channels {
	return &gateway.Channels{
		Service: channel.Config{
			PublicURL: "https://atrium.test",
			Identity: channel.Identity{
				Workspaces: []channel.WorkspaceMapping{
					{Platform: slack.Platform, Workspace: fs.team, Tenant: "acme", EmailDomains: []string{"acme.test"}},
					{Platform: telegram.Platform, Workspace: "4242", Tenant: "acme"},
				},
				Users: []channel.UserMapping{
					{Platform: slack.Platform, ID: alice, User: "alice"},
					{Platform: slack.Platform, ID: bob, User: "bob"},
					{Platform: slack.Platform, ID: vic, User: "vic"},
					{Platform: slack.Platform, ID: globex, User: "gus", Tenant: "globex"},
					{Platform: telegram.Platform, ID: "1001", User: "alice"},
				},
			},
			EditEvery: 10 * time.Millisecond,
			IdleAfter: 300 * time.Millisecond,
			LeaseTTL:  2 * time.Second,
			Retry:     channel.Backoff{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond},
			HookRetry: channel.Backoff{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		},
		Slack:    &slack.Config{BotToken: fs.token, SigningSecret: fs.secret, APIURL: fs.srv.URL + "/api/"},
		Telegram: &telegram.Config{Token: ft.token, SecretToken: ft.secret, APIURL: ft.srv.URL},
		Hooks: &hooks.Config{
			Hooks: []hooks.Hook{
				{Name: "ci", Secret: "ci-secret-0123456789", User: "ci-bot", Tenant: "acme", Prompt: "fix {{.repo}}: {{.text}}",
					Title: "CI {{.repo}}", SessionKey: "{{.repo}}", DeliverTo: "results", DeliverKinds: []session.Kind{session.KindTurnFinished}},
				{Name: "plain", Secret: "plain-secret-0123456789", User: "alice", Tenant: "acme"},
			},
			// The webhook tests point the target at a receiver of theirs.
			Targets:  []hooks.Target{{Name: "results", URL: "http://127.0.0.1:9/nowhere", Secret: "results-secret-0123456789"}},
			Attempts: 3,
		},
	}
}

func newChatEnv(t *testing.T, tune ...func(*gateway.Channels)) *chatEnv {
	t.Helper()
	fs, ft := startFakeSlack(t), startFakeTelegram(t)
	c := &chatEnv{slack: fs, tg: ft, chans: chatConfig(fs, ft)}
	for _, f := range tune {
		f(c.chans)
	}
	c.env = newEnv(t, c.gatewayConfig)
	c.agent = startAgent(t, c.node, connectNATS(t, c.ns))
	fs.setAtrium(c.srv.URL)
	ft.setAtrium(c.srv.URL)
	return c
}

func (c *chatEnv) gatewayConfig(cfg *gateway.Config) {
	cfg.Auth = &auth.Dev{Tenant: "acme"}
	ch := *c.chans
	cfg.Channels = &ch
}

// secondGateway starts another gateway with the same channels on the same
// NATS, as a second replica.
func (c *chatEnv) secondGateway() (*gateway.Server, string) {
	c.t.Helper()
	gw, srv, _ := startGateway(c.t, c.ns, c.gatewayConfig)
	return gw, srv.URL
}

// sessionOf waits until user owns exactly n sessions and returns the newest.
func (c *chatEnv) sessionOf(user string, n int) session.CatalogEntry {
	c.t.Helper()
	var out []session.CatalogEntry
	eventually(c.t, user+" owning "+itoa(n)+" sessions", func() bool {
		out = c.node.sessionsOf(user)
		return len(out) == n
	})
	newest := out[0]
	for _, e := range out {
		if e.CreatedAt.After(newest.CreatedAt.Time) {
			newest = e
		}
	}
	return newest
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// messages waits until id has n message events and returns them.
func (c *chatEnv) messages(id session.ID, n int) []session.Event {
	c.t.Helper()
	var evs []session.Event
	eventually(c.t, "session "+string(id)+" having "+itoa(n)+" messages", func() bool {
		evs = c.node.messagesOf(id)
		return len(evs) >= n
	})
	if len(evs) != n {
		c.t.Fatalf("session %s has %d messages, want %d", id, len(evs), n)
	}
	return evs
}

func TestSlack_MentionStartsASessionBoundToTheThread(t *testing.T) {
	c := newChatEnv(t)
	const root = "1699990001.000100"
	if _, code := c.slack.mention(alice, general, root, "", "echo hello from slack"); code != http.StatusOK {
		t.Fatalf("app_mention: %d", code)
	}
	sess := c.sessionOf("alice", 1)
	if sess.Tenant != "acme" || sess.Title != "echo hello from slack" {
		t.Fatalf("session %+v: want alice's in acme, titled by the prompt", sess)
	}
	msgs := c.messages(sess.ID, 1)
	if msgs[0].By != "alice" {
		t.Fatalf("prompt by %q, want alice", msgs[0].By)
	}
	var md session.MessageData
	_ = json.Unmarshal(msgs[0].Data, &md)
	if md.Text != "echo hello from slack" || !strings.HasPrefix(md.ClientID, "slack:") {
		t.Fatalf("prompt %+v: want the text without the mention, client id from the event", md)
	}

	// The turn's status message is posted in the thread, then edited to
	// say how it ended; the result is posted with the output.
	result := c.slack.waitMsg("the result in the thread", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "hello from slack") && strings.Contains(m.Text, "finished")
	})
	if !strings.Contains(result.Blocks, "https://atrium.test/s/"+string(sess.ID)) {
		t.Errorf("result %q does not link to the session", result.Blocks)
	}
	status := c.slack.waitMsg("the status message", func(m *slackMsg) bool {
		return inThread(general, root)(m) && m.TS != result.TS && strings.Contains(m.Text, "Turn 1 finished")
	})
	if status.PostedAt.After(result.PostedAt) {
		t.Fatal("the result was posted before the status message")
	}

	// A later mention in the same thread is a prompt of the same session.
	if _, code := c.slack.mention(alice, general, "1699990002.000100", root, "echo again"); code != http.StatusOK {
		t.Fatalf("second mention: %d", code)
	}
	c.messages(sess.ID, 2)
	c.slack.waitMsg("the second result", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "again") && strings.Contains(m.Text, "Turn 2 finished")
	})
	if n := len(c.node.sessionsOf("alice")); n != 1 {
		t.Fatalf("alice owns %d sessions after two mentions in one thread, want 1", n)
	}

	// A mention in another thread starts another session.
	c.slack.mention(alice, general, "1699990003.000100", "", "echo other thread")
	other := c.sessionOf("alice", 2)
	if other.ID == sess.ID {
		t.Fatal("a new thread reused the first thread's session")
	}
	c.slack.waitMsg("the other thread's result", func(m *slackMsg) bool {
		return inThread(general, "1699990003.000100")(m) && strings.Contains(m.all(), "other thread")
	})
	// Plain thread messages without a mention are not prompts by default.
	id := c.slack.newEventID()
	c.slack.deliver(id, map[string]any{"type": "message", "channel_type": "channel", "user": alice, "text": "just chatting",
		"ts": "1699990004.000100", "thread_ts": root, "channel": general}, 0)
	time.Sleep(50 * time.Millisecond) // nothing to wait for: the message must be ignored
	if n := len(c.node.messagesOf(sess.ID)); n != 2 {
		t.Fatalf("an unmentioned message became a prompt (%d messages)", n)
	}

	// The thread's session is deleted: the next mention starts a new one.
	if code, body := c.call("DELETE", "/v1/sessions/"+string(sess.ID), "alice", nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	c.slack.mention(alice, general, "1699990005.000100", root, "echo after the delete")
	eventually(t, "a new session for the thread", func() bool {
		for _, e := range c.node.sessionsOf("alice") {
			if e.ID != other.ID && len(c.node.messagesOf(e.ID)) == 1 {
				return true
			}
		}
		return false
	})
}

func TestSlack_TwoPeopleInOneThread(t *testing.T) {
	c := newChatEnv(t)
	const root = "1699990101.000100"
	c.slack.mention(alice, general, root, "", "echo from alice")
	sess := c.sessionOf("alice", 1)
	c.messages(sess.ID, 1)

	// Bob has no role on alice's session: speaking in its thread makes him
	// a driver (Config.ThreadRole), and his prompt goes to the same session.
	c.slack.mention(bob, general, "1699990102.000100", root, "echo from bob")
	msgs := c.messages(sess.ID, 2)
	if msgs[1].By != "bob" {
		t.Fatalf("second prompt by %q, want bob", msgs[1].By)
	}
	if r := c.node.role(sess.ID, "bob"); r != session.RoleDriver {
		t.Fatalf("bob's role %q, want driver", r)
	}
	if n := len(c.node.sessionsOf("bob")); n != 0 {
		t.Fatalf("bob got %d sessions of his own", n)
	}
	c.slack.waitMsg("bob's result in the thread", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "from bob") && strings.Contains(m.Text, "finished")
	})
	// Alice sees the session in the REST API with bob as a member.
	code, body := c.call("GET", "/v1/sessions/"+string(sess.ID), "alice", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"role":"owner"`) {
		t.Fatalf("GET session as alice: %d %s", code, body)
	}

	// Someone of another tenant is told so, and nothing reaches the session.
	c.slack.mention(globex, general, "1699990103.000100", root, "echo intruder")
	c.slack.waitWhisper(globex, "another Atrium organisation")
	if n := len(c.node.messagesOf(sess.ID)); n != 2 {
		t.Fatalf("a user of another tenant prompted the session (%d messages)", n)
	}

	// A viewer set by the owner stays a viewer, and is told.
	c.member(sess.ID, "alice", "vic", session.RoleViewer)
	c.slack.mention(vic, general, "1699990104.000100", root, "echo from vic")
	c.slack.waitWhisper(vic, "You're a viewer")
	if n := len(c.node.messagesOf(sess.ID)); n != 2 {
		t.Fatalf("a viewer's message became a prompt (%d messages)", n)
	}
}

func TestSlack_ApprovalButtons(t *testing.T) {
	c := newChatEnv(t)
	const root = "1699990201.000100"
	c.slack.mention(alice, general, root, "", "ask delete the build cache?")
	sess := c.sessionOf("alice", 1)
	c.member(sess.ID, "alice", "vic", session.RoleViewer)

	req := c.slack.waitMsg("the approval request with buttons", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.Text, "Approval needed") && strings.Contains(m.Blocks, "atrium_approve")
	})
	if !strings.Contains(req.Text, "delete the build cache?") || !strings.Contains(req.Blocks, "atrium_deny") {
		t.Fatalf("approval message %q %s", req.Text, req.Blocks)
	}
	var blocks []struct {
		Type     string `json:"type"`
		Elements []struct {
			ActionID string `json:"action_id"`
			Value    string `json:"value"`
			Style    string `json:"style"`
		} `json:"elements"`
	}
	if err := json.Unmarshal([]byte(req.Blocks), &blocks); err != nil {
		t.Fatalf("blocks: %v", err)
	}
	value := ""
	for _, b := range blocks {
		for _, e := range b.Elements {
			if e.ActionID == "atrium_approve" {
				value = e.Value
				if e.Style != "primary" {
					t.Errorf("approve button style %q", e.Style)
				}
			}
		}
	}
	if value == "" {
		t.Fatalf("no approve button in %s", req.Blocks)
	}

	// A viewer presses Approve: refused, privately, and nothing is approved.
	if code := c.slack.press(vic, req, "atrium_approve", value); code != http.StatusOK {
		t.Fatalf("press: %d", code)
	}
	c.slack.waitWhisper(vic, "Only drivers of this session can answer approvals")
	if w := c.slack.whispersTo(vic); len(w) != 1 {
		t.Fatalf("the viewer was told %d things: %+v", len(w), w)
	}
	// (The gateway asks the active session's actor, which is authoritative
	// and refused it: the fake node records refused commands too.)
	refused := len(c.node.commands(session.OpApprove))
	// Someone unknown: told how to get access.
	c.slack.press(eve, req, "atrium_approve", value)
	c.slack.waitWhisper(eve, "I don't know who you are in Atrium")

	// The owner (a driver and more) presses Approve: accepted.
	c.slack.press(alice, req, "atrium_approve", value)
	c.slack.waitWhisper(alice, "You approved: delete the build cache?")
	eventually(t, "the approval reaching the node", func() bool { return len(c.node.commands(session.OpApprove)) == refused+1 })
	cmd := c.node.commands(session.OpApprove)[refused]
	if cmd.ApprovalID != "a1" || !cmd.Allow {
		t.Fatalf("approve command %+v", cmd)
	}
	status := c.slack.waitMsg("the status message, waiting", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.Text, "Waiting for approval")
	})
	c.agent.resolve(sess.ID, "alice", true)
	c.slack.waitMsg("the status message edited in place", func(m *slackMsg) bool {
		return m.TS == status.TS && m.Edits > 0 && strings.Contains(m.Text, "Turn 1 finished")
	})
	c.slack.waitMsg("the approval message without its buttons", func(m *slackMsg) bool {
		return m.TS == req.TS && m.Edits > 0 && strings.Contains(m.Text, "Approved by alice") && !strings.Contains(m.Blocks, "atrium_approve")
	})
	c.slack.waitMsg("the result", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.Text, "Turn 1 finished") && strings.Contains(m.all(), "done")
	})
}

func TestSlack_Signatures(t *testing.T) {
	c := newChatEnv(t)
	body := c.slack.eventBody("Ev0FORGED", map[string]any{"type": "app_mention", "user": alice, "text": "<@U0BOT> echo x",
		"ts": "1699990301.000100", "channel": general})
	now := time.Now().Unix()
	for name, hdr := range map[string]http.Header{
		"forged": {"X-Slack-Request-Timestamp": {itoa(int(now))}, "X-Slack-Signature": {c.slack.sign(now, body, "not-the-secret")}},
		"stale": {"X-Slack-Request-Timestamp": {itoa(int(now - 600))},
			"X-Slack-Signature": {c.slack.sign(now-600, body, c.slack.secret)}},
		"future": {"X-Slack-Request-Timestamp": {itoa(int(now + 600))},
			"X-Slack-Signature": {c.slack.sign(now+600, body, c.slack.secret)}},
		"missing":   {},
		"malformed": {"X-Slack-Request-Timestamp": {itoa(int(now))}, "X-Slack-Signature": {"v0=zz"}},
		"body changed": {"X-Slack-Request-Timestamp": {itoa(int(now))},
			"X-Slack-Signature": {c.slack.sign(now, append([]byte(" "), body...), c.slack.secret)}},
	} {
		t.Run(name, func(t *testing.T) {
			for _, path := range []string{slack.EventsPath, slack.InteractivityPath, slack.CommandsPath} {
				h := http.Header{"Content-Type": {"application/json"}}
				for k, v := range hdr {
					h[k] = v
				}
				code, resp := callURL(t, c.srv.URL, "POST", path, "", body, h)
				if code != http.StatusUnauthorized {
					t.Errorf("%s: %d %s, want 401", path, code, resp)
				}
			}
		})
	}
	if n := len(c.node.sessionsOf("alice")); n != 0 {
		t.Fatalf("a forged event started %d sessions", n)
	}

	// The url_verification handshake, signed, echoes the challenge.
	hs, _ := json.Marshal(map[string]string{"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"})
	code, resp := c.slack.post(slack.EventsPath, "application/json", hs, nil)
	if code != http.StatusOK || !strings.Contains(string(resp), "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P") {
		t.Fatalf("url_verification: %d %s", code, resp)
	}
}

func TestSlack_DuplicateEventsMakeOnePrompt(t *testing.T) {
	c := newChatEnv(t)
	inner := map[string]any{"type": "app_mention", "user": alice, "text": "<@U0BOT> echo once",
		"ts": "1699990401.000100", "channel": general, "event_ts": "1699990401.000100"}
	id := c.slack.newEventID()
	for retry := range 3 { // Slack's first delivery and two retries
		if code := c.slack.deliver(id, inner, retry); code != http.StatusOK {
			t.Fatalf("delivery %d: %d", retry, code)
		}
	}
	sess := c.sessionOf("alice", 1)
	c.messages(sess.ID, 1)

	// Dedupe is durable: a gateway started later (a restart, or another
	// replica) does not handle the event again either.
	_, url2 := c.secondGateway()
	c.slack.setAtrium(url2)
	if code := c.slack.deliver(id, inner, 3); code != http.StatusOK {
		t.Fatalf("delivery to the second gateway: %d", code)
	}
	// …while a new event in the thread is a prompt.
	c.slack.mention(alice, general, "1699990402.000100", "1699990401.000100", "echo twice")
	msgs := c.messages(sess.ID, 2)
	var md session.MessageData
	_ = json.Unmarshal(msgs[1].Data, &md)
	if md.Text != "echo twice" {
		t.Fatalf("second prompt %q: the duplicate was handled again", md.Text)
	}
	if n := len(c.node.sessionsOf("alice")); n != 1 {
		t.Fatalf("%d sessions: a duplicate started another", n)
	}
}

func TestSlack_DownThenUp(t *testing.T) {
	c := newChatEnv(t)
	const root = "1699990501.000100"
	c.slack.setDown(true)
	c.slack.mention(alice, general, root, "", "echo while slack is down")
	sess := c.sessionOf("alice", 1)
	c.messages(sess.ID, 1)
	eventually(t, "attempts to post while Slack is down", func() bool { return c.slack.callCount("chat.postMessage") >= 3 })
	if n := len(c.slack.messages(inThread(general, root))); n != 0 {
		t.Fatalf("%d messages posted while Slack was down", n)
	}
	c.slack.setDown(false)
	c.slack.waitMsg("the result once Slack is back", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "while slack is down") && strings.Contains(m.Text, "finished")
	})
	// In order, and each message once: the status first, then the result.
	msgs := c.slack.messages(inThread(general, root))
	if len(msgs) != 2 || !strings.Contains(msgs[0].Text, "Turn 1 finished") || !strings.Contains(msgs[1].Text, "Turn 1 finished") ||
		!strings.Contains(msgs[1].all(), "while slack is down") {
		t.Fatalf("thread after the outage: %+v", msgs)
	}
}

func TestSlack_RateLimitsAreHonoured(t *testing.T) {
	c := newChatEnv(t)
	const root = "1699990551.000100"
	c.slack.limit(1)
	c.slack.mention(alice, general, root, "", "echo slowly")
	c.slack.waitMsg("the result after a 429", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "slowly") && strings.Contains(m.Text, "finished")
	})
	first := c.slack.messages(inThread(general, root))[0]
	c.slack.mu.Lock()
	limited := append([]time.Time(nil), c.slack.limitAt...)
	c.slack.mu.Unlock()
	if len(limited) != 1 {
		t.Fatalf("%d calls got a 429, want 1", len(limited))
	}
	if wait := first.PostedAt.Sub(limited[0]); wait < 900*time.Millisecond {
		t.Fatalf("retried %s after a 429 with Retry-After: 1", wait)
	}
}

func TestSlack_UnknownPeopleGetAPoliteAnswer(t *testing.T) {
	c := newChatEnv(t)
	c.slack.addUser(eve, slackUser{email: "eve@elsewhere.test", confirmed: true})
	c.slack.mention(eve, general, "1699990601.000100", "", "echo let me in")
	w := c.slack.waitWhisper(eve, "I don't know who you are in Atrium")
	if !strings.Contains(w.Text, eve) || w.ThreadTS != "1699990601.000100" {
		t.Fatalf("reply %+v: want it in the thread, naming the Slack user id to map", w)
	}
	// Verified emails in the workspace's domains are known…
	c.slack.addUser(dana, slackUser{email: "Dana@ACME.test", confirmed: true})
	c.slack.mention(dana, general, "1699990602.000100", "", "echo by email")
	sess := c.sessionOf("dana@acme.test", 1)
	c.messages(sess.ID, 1)
	// …but not unconfirmed ones, guests or bots.
	for id, u := range map[string]slackUser{
		"U0UNCONF": {email: "mallory@acme.test"},
		"U0GUEST":  {email: "guest@acme.test", confirmed: true, restricted: true},
		"U0ROBOT":  {email: "robot@acme.test", confirmed: true, bot: true},
	} {
		c.slack.addUser(id, u)
		c.slack.mention(id, general, "1699990603.000100", "", "echo hi")
		c.slack.waitWhisper(id, "I don't know who you are")
	}
	if n := len(c.node.sessionsOf("mallory@acme.test")) + len(c.node.sessionsOf("guest@acme.test")) + len(c.node.sessionsOf("robot@acme.test")); n != 0 {
		t.Fatalf("%d sessions for people who should be unknown", n)
	}
}

func TestSlack_SlashCommand(t *testing.T) {
	c := newChatEnv(t)
	code, reply := c.slack.slash(alice, general, "help")
	if code != http.StatusOK || !strings.Contains(reply, "/atrium new") {
		t.Fatalf("help: %d %q", code, reply)
	}
	code, reply = c.slack.slash(alice, general, "status")
	if code != http.StatusOK || !strings.Contains(reply, "no Atrium session here yet") {
		t.Fatalf("status with no session: %d %q", code, reply)
	}
	_, reply = c.slack.slash(alice, general, "new echo from the command")
	sess := c.sessionOf("alice", 1)
	if !strings.Contains(reply, "Started session "+string(sess.ID)) || !strings.Contains(reply, "https://atrium.test/s/"+string(sess.ID)) {
		t.Fatalf("new: %q", reply)
	}
	// The session got its own thread: a message in the channel, whose
	// thread gets the turn's messages.
	rootMsg := c.slack.waitMsg("the new session's root message", func(m *slackMsg) bool {
		return m.Channel == general && m.ThreadTS == "" && strings.Contains(m.Text, "started an Atrium session")
	})
	c.slack.waitMsg("the result in the new thread", func(m *slackMsg) bool {
		return inThread(general, rootMsg.TS)(m) && strings.Contains(m.all(), "from the command")
	})
	_, reply = c.slack.slash(alice, general, "status")
	if !strings.Contains(reply, string(sess.ID)) || !strings.Contains(reply, "you are a owner") {
		t.Fatalf("status: %q", reply)
	}
	_, reply = c.slack.slash(alice, general, "link "+string(sess.ID))
	if !strings.Contains(reply, "https://atrium.test/s/"+string(sess.ID)) {
		t.Fatalf("link: %q", reply)
	}
	_, reply = c.slack.slash(alice, general, "cancel")
	if !strings.Contains(reply, "Cancelling") || len(c.node.commands(session.OpCancel)) != 1 {
		t.Fatalf("cancel: %q", reply)
	}
	// Viewers cannot cancel; strangers are told how to get access.
	c.member(sess.ID, "alice", "vic", session.RoleViewer)
	_, reply = c.slack.slash(vic, general, "cancel")
	if !strings.Contains(reply, "You're a viewer") {
		t.Fatalf("cancel by a viewer: %q", reply)
	}
	_, reply = c.slack.slash(eve, general, "new do things")
	if !strings.Contains(reply, "I don't know who you are") {
		t.Fatalf("new by a stranger: %q", reply)
	}
	_, reply = c.slack.slash(alice, general, "frobnicate")
	if !strings.Contains(reply, "don't know the command") {
		t.Fatalf("unknown command: %q", reply)
	}
}

func TestSlack_LongOutputIsAttached(t *testing.T) {
	c := newChatEnv(t)
	const root = "1699990701.000100"
	c.slack.mention(alice, general, root, "", "long 20000")
	sess := c.sessionOf("alice", 1)
	var up slackUpload
	eventually(t, "the output uploaded into the thread", func() bool {
		c.slack.mu.Lock()
		defer c.slack.mu.Unlock()
		if len(c.slack.uploads) == 0 {
			return false
		}
		up = c.slack.uploads[0]
		return true
	})
	if up.Channel != general || up.ThreadTS != root || up.Name != "turn-1-output.txt" || len(up.Content) != 20000 {
		t.Fatalf("upload %+v (%d bytes)", up, len(up.Content))
	}
	if !strings.Contains(up.Comment, "Turn 1 finished") || !strings.Contains(up.Comment, "https://atrium.test/s/"+string(sess.ID)) {
		t.Fatalf("upload comment %q", up.Comment)
	}
	// The status message showed the tail of the output while it ran, never
	// more than a message holds.
	for _, m := range c.slack.messages(inThread(general, root)) {
		if len(m.Blocks) > 8000 {
			t.Fatalf("a message of %d bytes of blocks", len(m.Blocks))
		}
	}
}

func TestChannels_OneGatewayPostsEachEvent(t *testing.T) {
	c := newChatEnv(t)
	_, url2 := c.secondGateway()
	const root = "1699990801.000100"
	c.slack.mention(alice, general, root, "", "echo one")
	sess := c.sessionOf("alice", 1)
	c.slack.waitMsg("the first result", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "one") && strings.Contains(m.Text, "finished")
	})
	// A prompt from the web UI (REST), through the other gateway: both
	// gateways watch the catalog, only the lease holder posts.
	prompt := func(base, text string) {
		t.Helper()
		code, body := callURL(t, base, "POST", "/v1/sessions/"+string(sess.ID)+"/messages", "alice", map[string]string{"text": text}, nil)
		if code != http.StatusAccepted {
			t.Fatalf("prompt: %d %s", code, body)
		}
	}
	prompt(url2, "echo from the web")
	c.slack.waitMsg("the web prompt's result in the thread", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "from the web") && strings.Contains(m.Text, "finished")
	})
	time.Sleep(200 * time.Millisecond) // let a second poster, if any, post too
	if msgs := c.slack.messages(inThread(general, root)); len(msgs) != 4 {
		for _, m := range msgs {
			t.Logf("%s: %q", m.TS, m.Text)
		}
		t.Fatalf("%d messages in the thread, want 4 (status and result of two turns)", len(msgs))
	}

	// The first gateway goes away: the other delivers the next turn, once.
	if err := c.gw.Close(ctxT(t)); err != nil {
		t.Fatalf("close gateway: %v", err)
	}
	prompt(url2, "echo after a restart")
	c.slack.waitMsg("the third result, from the other gateway", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "after a restart") && strings.Contains(m.Text, "finished")
	})
	time.Sleep(200 * time.Millisecond)
	if n := len(c.slack.messages(inThread(general, root))); n != 6 {
		t.Fatalf("%d messages in the thread, want 6", n)
	}
}

func TestTelegram_Flow(t *testing.T) {
	c := newChatEnv(t)
	if code := c.tg.send(map[string]any{"message": map[string]any{"message_id": 1, "text": "echo hi",
		"from": map[string]any{"id": 1001}, "chat": map[string]any{"id": 1001, "type": "private"}}}, "wrong-secret"); code != http.StatusUnauthorized {
		t.Fatalf("wrong secret token: %d, want 401", code)
	}
	if code := c.tg.send(map[string]any{"message": map[string]any{"message_id": 1, "text": "echo hi",
		"from": map[string]any{"id": 1001}, "chat": map[string]any{"id": 1001, "type": "private"}}}, ""); code != http.StatusUnauthorized {
		t.Fatalf("no secret token: %d, want 401", code)
	}

	if code := c.tg.text(1001, "echo hello telegram"); code != http.StatusOK {
		t.Fatalf("message: %d", code)
	}
	sess := c.sessionOf("alice", 1)
	c.messages(sess.ID, 1)
	res := c.tg.waitMsg("the result in the chat", func(m *tgMsg) bool {
		return m.Chat == "1001" && strings.Contains(m.Text, "hello telegram") && strings.Contains(m.Text, "finished")
	})
	if !strings.Contains(res.Text, "<pre>") || !strings.Contains(res.Text, `href="https://atrium.test/s/`+string(sess.ID)) {
		t.Fatalf("result %q: want the output preformatted and a link", res.Text)
	}
	// Duplicate update ids are handled once.
	dup := map[string]any{"update_id": 777, "message": map[string]any{"message_id": 9, "text": "echo dup",
		"from": map[string]any{"id": 1001, "first_name": "Alice"}, "chat": map[string]any{"id": 1001, "type": "private"}}}
	c.tg.send(dup, c.tg.secret)
	c.tg.send(dup, c.tg.secret)
	c.messages(sess.ID, 2)

	// Approvals: inline keyboard, answered through a callback query.
	c.tg.text(1001, "ask ship it?")
	ask := c.tg.waitMsg("the approval request", func(m *tgMsg) bool {
		return strings.Contains(m.Text, "Approval needed") && strings.Contains(m.Markup, "approve:")
	})
	var kb struct {
		InlineKeyboard [][]struct {
			Text         string `json:"text"`
			CallbackData string `json:"callback_data"`
		} `json:"inline_keyboard"`
	}
	if err := json.Unmarshal([]byte(ask.Markup), &kb); err != nil || len(kb.InlineKeyboard) != 1 || len(kb.InlineKeyboard[0]) != 2 {
		t.Fatalf("keyboard %s: %v", ask.Markup, err)
	}
	c.tg.send(map[string]any{"callback_query": map[string]any{"id": "cb1", "data": kb.InlineKeyboard[0][0].CallbackData,
		"from":    map[string]any{"id": 1001, "first_name": "Alice"},
		"message": map[string]any{"message_id": ask.ID, "chat": map[string]any{"id": 1001, "type": "private"}}}}, c.tg.secret)
	eventually(t, "the press answered", func() bool {
		c.tg.mu.Lock()
		defer c.tg.mu.Unlock()
		return len(c.tg.answers) == 1 && strings.Contains(c.tg.answers[0].Text, "You approved")
	})
	if cmds := c.node.commands(session.OpApprove); len(cmds) != 1 || !cmds[0].Allow {
		t.Fatalf("approve commands %+v", cmds)
	}
	c.agent.resolve(sess.ID, "alice", true)
	c.tg.waitMsg("the approval message edited, without its keyboard", func(m *tgMsg) bool {
		return m.ID == ask.ID && m.Edits > 0 && strings.Contains(m.Text, "Approved by alice") && !strings.Contains(m.Markup, "approve:")
	})

	// /new starts a new session for the chat; /status tells about it.
	c.tg.text(1001, "/new echo fresh start")
	next := c.sessionOf("alice", 2)
	c.messages(next.ID, 1)
	c.tg.text(1001, "echo continues")
	c.messages(next.ID, 2)
	c.tg.text(1001, "/status")
	c.tg.waitMsg("the status reply", func(m *tgMsg) bool {
		return strings.Contains(m.Text, string(next.ID)) && strings.Contains(m.Text, "owner alice")
	})

	// Unknown Telegram users get the polite answer.
	c.tg.text(2002, "echo hi")
	c.tg.waitMsg("the answer to a stranger", func(m *tgMsg) bool { return m.Chat == "2002" && strings.Contains(m.Text, "I don't know who you are") })
}

func TestSlack_DirectMessagesAndAllMessages(t *testing.T) {
	c := newChatEnv(t, func(ch *gateway.Channels) {
		sc := *ch.Slack
		sc.AllMessages = true
		ch.Slack = &sc
	})
	// A direct message conversation is one session.
	dm := func(ts, text string) {
		id := c.slack.newEventID()
		c.slack.deliver(id, map[string]any{"type": "message", "channel_type": "im", "user": alice, "text": text,
			"ts": ts, "channel": "D0ALICE"}, 0)
	}
	dm("1699990901.000100", "echo first dm")
	sess := c.sessionOf("alice", 1)
	dm("1699990902.000100", "echo second dm")
	c.messages(sess.ID, 2)
	c.slack.waitMsg("a result in the DM", func(m *slackMsg) bool {
		return m.Channel == "D0ALICE" && m.ThreadTS == "" && strings.Contains(m.all(), "second dm") && strings.Contains(m.Text, "finished")
	})

	// With all_messages, replies in a session's thread are prompts without a
	// mention; a reply with a mention (which Slack sends both as app_mention
	// and as message) is one prompt.
	const root = "1699990903.000100"
	c.slack.mention(bob, general, root, "", "echo started")
	thread := c.sessionOf("bob", 1)
	reply := func(ts, text string) {
		id := c.slack.newEventID()
		c.slack.deliver(id, map[string]any{"type": "message", "channel_type": "channel", "user": bob, "text": text,
			"ts": ts, "thread_ts": root, "channel": general}, 0)
	}
	reply("1699990904.000100", "echo no mention")
	c.slack.mention(bob, general, "1699990905.000100", root, "echo mentioned")
	reply("1699990905.000100", "<@U0BOT> echo mentioned")
	msgs := c.messages(thread.ID, 3)
	var md session.MessageData
	_ = json.Unmarshal(msgs[1].Data, &md)
	if md.Text != "echo no mention" {
		t.Fatalf("second prompt %q", md.Text)
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(c.node.messagesOf(thread.ID)); n != 3 {
		t.Fatalf("%d prompts: a mentioned reply counted twice", n)
	}
	// Messages in threads Atrium is not part of, and messages of bots, are ignored.
	id := c.slack.newEventID()
	c.slack.deliver(id, map[string]any{"type": "message", "channel_type": "channel", "user": bob, "text": "elsewhere",
		"ts": "1699990906.000100", "thread_ts": "1699990000.000001", "channel": general}, 0)
	id = c.slack.newEventID()
	c.slack.deliver(id, map[string]any{"type": "message", "subtype": "bot_message", "bot_id": "B0BOT", "text": "echo loop",
		"ts": "1699990907.000100", "thread_ts": root, "channel": general}, 0)
	time.Sleep(100 * time.Millisecond)
	if n := len(c.node.messagesOf(thread.ID)); n != 3 || len(c.node.sessionsOf("bob")) != 1 {
		t.Fatalf("ignored messages were handled (%d prompts)", n)
	}
}

func TestChannels_TakeoverDeliversWhatWasPending(t *testing.T) {
	c := newChatEnv(t, func(ch *gateway.Channels) { ch.Drain = 100 * time.Millisecond })
	c.secondGateway()
	const root = "1699991001.000100"
	c.slack.setDown(true)
	c.slack.mention(alice, general, root, "", "echo survives a gateway")
	sess := c.sessionOf("alice", 1)
	c.messages(sess.ID, 1)
	eventually(t, "failing attempts to post", func() bool { return c.slack.callCount("chat.postMessage") >= 2 })

	// The gateway that drives the thread stops before Slack is back: its
	// pending messages are dropped, its cursor stays before them, and the
	// other gateway delivers them.
	if err := c.gw.Close(ctxT(t)); err != nil {
		t.Fatalf("close: %v", err)
	}
	c.slack.setDown(false)
	c.slack.waitMsg("the result, from the other gateway", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "survives a gateway") && strings.Contains(m.Text, "finished")
	})
	time.Sleep(200 * time.Millisecond)
	if msgs := c.slack.messages(inThread(general, root)); len(msgs) != 2 {
		t.Fatalf("%d messages in the thread, want 2 (status and result, once each)", len(msgs))
	}
}

func TestChannels_TakeoverMidTurn(t *testing.T) {
	c := newChatEnv(t)
	c.secondGateway()
	const root = "1699991101.000100"
	c.slack.mention(alice, general, root, "", "ask deploy now?")
	sess := c.sessionOf("alice", 1)
	req := c.slack.waitMsg("the approval request", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.Text, "Approval needed")
	})
	status := c.slack.waitMsg("the status", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.Text, "Waiting for approval")
	})
	// The driving gateway stops while the turn waits; the other one edits
	// the same messages when the turn goes on.
	if err := c.gw.Close(ctxT(t)); err != nil {
		t.Fatalf("close: %v", err)
	}
	c.agent.resolve(sess.ID, "alice", true)
	c.slack.waitMsg("the approval message edited by the other gateway", func(m *slackMsg) bool {
		return m.TS == req.TS && strings.Contains(m.Text, "Approved by alice")
	})
	c.slack.waitMsg("the status edited by the other gateway", func(m *slackMsg) bool {
		return m.TS == status.TS && strings.Contains(m.Text, "Turn 1 finished")
	})
	c.slack.waitMsg("the result", func(m *slackMsg) bool {
		return inThread(general, root)(m) && strings.Contains(m.all(), "done") && strings.Contains(m.Text, "Turn 1 finished") && m.TS != status.TS
	})
	time.Sleep(200 * time.Millisecond)
	if msgs := c.slack.messages(inThread(general, root)); len(msgs) != 3 {
		t.Fatalf("%d messages in the thread, want 3 (status, approval, result)", len(msgs))
	}
}
