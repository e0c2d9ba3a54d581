package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/hooks"
	"github.com/atriumhq/atrium/session"
)

// receiver is an outbound webhook endpoint that checks signatures and can
// be told to fail.
type receiver struct {
	t      testing.TB
	srv    *httptest.Server
	secret string

	mu     sync.Mutex
	got    []hooks.Payload // guarded by mu: verified deliveries, in order
	heads  []http.Header   // guarded by mu
	flaky  bool            // guarded by mu: answer the first attempt of each delivery with 500
	reject bool            // guarded by mu: answer 400
	bad    int             // guarded by mu: requests whose signature did not verify
}

func startReceiver(t testing.TB, secret string) *receiver {
	rc := &receiver{t: t, secret: secret}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if _, err := hooks.Verify([]byte(rc.secret), r.Header.Get(hooks.SignatureHeader), body, time.Now(), time.Minute); err != nil {
			rc.bad++
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if rc.flaky && r.Header.Get(hooks.AttemptHeader) == "1" {
			http.Error(w, "try later", http.StatusInternalServerError)
			return
		}
		if rc.reject {
			http.Error(w, "no thanks", http.StatusBadRequest)
			return
		}
		var p hooks.Payload
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		rc.got = append(rc.got, p)
		rc.heads = append(rc.heads, r.Header.Clone())
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// kinds returns the kinds of the deliveries received for id.
func (rc *receiver) kinds(id session.ID) []session.Kind {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []session.Kind
	for _, p := range rc.got {
		var ev session.Event
		_ = json.Unmarshal(p.Event, &ev)
		if p.Session == id {
			out = append(out, ev.Kind)
		}
	}
	return out
}

// hookEnv is a chat env whose "results" target is a receiver.
func newHookEnv(t *testing.T) (*chatEnv, *receiver) {
	rc := startReceiver(t, "results-secret-0123456789")
	c := newChatEnv(t, func(ch *gateway.Channels) {
		hc := *ch.Hooks
		hc.Targets = []hooks.Target{{Name: "results", URL: rc.srv.URL + "/atrium?token=s3cr3t", Secret: rc.secret}}
		ch.Hooks = &hc
	})
	return c, rc
}

// hook posts body to /v1/hooks/name, signed with secret at t.
func (c *chatEnv) hook(name, secret string, t time.Time, body string, hdr http.Header) (int, []byte, http.Header) {
	c.t.Helper()
	req, err := http.NewRequest("POST", c.srv.URL+"/v1/hooks/"+name, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if secret != "" {
		req.Header.Set(hooks.SignatureHeader, hooks.Sign([]byte(secret), t, []byte(body)))
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("POST hook: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func TestHooks_SignedRequestsBecomePrompts(t *testing.T) {
	c, _ := newHookEnv(t)
	const secret = "plain-secret-0123456789"
	now := time.Now()
	code, body, _ := c.hook("plain", secret, now, `{"text":"echo from a hook"}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("hook: %d %s", code, body)
	}
	var ans hooks.Answer
	if err := json.Unmarshal(body, &ans); err != nil || !ans.Created || ans.Seq == 0 || ans.URL != "https://atrium.test/s/"+string(ans.Session) {
		t.Fatalf("answer %s", body)
	}
	msgs := c.messages(ans.Session, 1)
	if msgs[0].By != "alice" {
		t.Fatalf("prompt by %q, want the hook's user alice", msgs[0].By)
	}

	for name, tc := range map[string]struct {
		hook, secret string
		at           time.Time
		hdr          http.Header
		code         int
		says         string
	}{
		"wrong secret":    {"plain", "not-the-secret-0123456789", now, nil, 401, "signature does not match"},
		"no signature":    {"plain", "", now, nil, 401, "no X-Atrium-Signature"},
		"stale":           {"plain", secret, now.Add(-6 * time.Minute), nil, 401, "outside the replay window"},
		"from the future": {"plain", secret, now.Add(6 * time.Minute), nil, 401, "outside the replay window"},
		"malformed":       {"plain", "", now, http.Header{hooks.SignatureHeader: {"sha256=abc"}}, 401, "X-Atrium-Signature is not t="},
		"unknown hook":    {"nope", secret, now, nil, 404, `no webhook named \"nope\"`},
	} {
		t.Run(name, func(t *testing.T) {
			code, body, _ := c.hook(tc.hook, tc.secret, tc.at, `{"text":"echo sneaky"}`, tc.hdr)
			if code != tc.code || !strings.Contains(string(body), tc.says) {
				t.Fatalf("%d %s, want %d saying %q", code, body, tc.code, tc.says)
			}
		})
	}
	if n := len(c.node.sessionsOf("alice")); n != 1 {
		t.Fatalf("refused requests made sessions (%d)", n)
	}

	// The signature covers the body: a different body fails.
	sig := hooks.Sign([]byte(secret), now, []byte(`{"text":"echo a"}`))
	code, body, _ = c.hook("plain", "", now, `{"text":"echo b"}`, http.Header{hooks.SignatureHeader: {sig}})
	if code != http.StatusUnauthorized {
		t.Fatalf("tampered body: %d %s", code, body)
	}
	// Bodies that do not fit the hook's template are bad requests.
	code, body, _ = c.hook("plain", secret, now, `{"message":"no text field"}`, nil)
	if code != http.StatusBadRequest || !strings.Contains(string(body), `no entry for key \"text\"`) {
		t.Fatalf("body without the template's field: %d %s", code, body)
	}
	code, body, _ = c.hook("plain", secret, now, `["not an object"]`, nil)
	if code != http.StatusBadRequest {
		t.Fatalf("non-object body: %d %s", code, body)
	}
}

func TestHooks_Idempotency(t *testing.T) {
	c, _ := newHookEnv(t)
	const secret = "plain-secret-0123456789"
	key := http.Header{hooks.IdempotencyHeader: {"deploy-42"}}
	code, first, _ := c.hook("plain", secret, time.Now(), `{"text":"echo deploy"}`, key)
	if code != http.StatusAccepted {
		t.Fatalf("first: %d %s", code, first)
	}
	var ans hooks.Answer
	_ = json.Unmarshal(first, &ans)

	// The same request again (re-signed, as a sender's retry would be):
	// the same answer, and nothing more happens.
	code, again, hdr := c.hook("plain", secret, time.Now().Add(time.Second), `{"text":"echo deploy"}`, key)
	if code != http.StatusAccepted || string(again) != string(first) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat: %d %s (%v), want the first answer %s", code, again, hdr, first)
	}
	// The same key with another body is a mistake.
	code, body, _ := c.hook("plain", secret, time.Now(), `{"text":"echo something else"}`, key)
	if code != http.StatusConflict || !strings.Contains(string(body), "different body") {
		t.Fatalf("key reuse: %d %s", code, body)
	}
	// Without a key, an exact replay of a signed request (inside the
	// window) gets the same answer too.
	at := time.Now()
	_, r1, _ := c.hook("plain", secret, at, `{"text":"echo replayed"}`, nil)
	code, r2, hdr := c.hook("plain", secret, at, `{"text":"echo replayed"}`, nil)
	if code != http.StatusAccepted || string(r1) != string(r2) || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s vs %s", code, r2, r1)
	}
	if n := len(c.node.sessionsOf("alice")); n != 2 {
		t.Fatalf("%d sessions, want 2 (one per distinct request)", n)
	}
	c.messages(ans.Session, 1)
}

func TestHooks_SessionKeysAndDeliveries(t *testing.T) {
	c, rc := newHookEnv(t)
	const secret = "ci-secret-0123456789"
	rc.mu.Lock()
	rc.flaky = true // first attempts fail: they are retried
	rc.mu.Unlock()

	code, body, _ := c.hook("ci", secret, time.Now(), `{"repo":"atrium","text":"tests fail"}`, nil)
	if code != http.StatusAccepted {
		t.Fatalf("hook: %d %s", code, body)
	}
	var first hooks.Answer
	_ = json.Unmarshal(body, &first)
	code, body, _ = c.hook("ci", secret, time.Now(), `{"repo":"atrium","text":"lint fails"}`, nil)
	var second hooks.Answer
	_ = json.Unmarshal(body, &second)
	if code != http.StatusAccepted || second.Session != first.Session || second.Created {
		t.Fatalf("second request of the same repo: %d %s, want session %s", code, body, first.Session)
	}
	code, body, _ = c.hook("ci", secret, time.Now(), `{"repo":"other","text":"tests fail"}`, nil)
	var other hooks.Answer
	_ = json.Unmarshal(body, &other)
	if code != http.StatusAccepted || other.Session == first.Session || !other.Created {
		t.Fatalf("another repo: %d %s", code, body)
	}
	msgs := c.messages(first.Session, 2)
	var md session.MessageData
	_ = json.Unmarshal(msgs[0].Data, &md)
	if md.Text != "fix atrium: tests fail" || msgs[0].By != "ci-bot" {
		t.Fatalf("prompt %q by %s", md.Text, msgs[0].By)
	}
	entry := c.sessionOf("ci-bot", 2)
	_ = entry

	// The hook's sessions deliver their turn_finished events, signed, to
	// the target; the failed first attempt was retried.
	eventually(t, "two turn_finished deliveries", func() bool { return len(rc.kinds(first.Session)) == 2 })
	for _, k := range rc.kinds(first.Session) {
		if k != session.KindTurnFinished {
			t.Fatalf("delivered a %s event, subscribed to turn_finished only", k)
		}
	}
	rc.mu.Lock()
	var h http.Header
	for i, p := range rc.got {
		if p.Session == first.Session {
			h = rc.heads[i]
			break
		}
	}
	bad := rc.bad
	rc.mu.Unlock()
	if bad != 0 || !strings.HasPrefix(h.Get(hooks.DeliveryHeader), string(first.Session)+".") ||
		h.Get(hooks.EventHeader) != "turn_finished" || h.Get(hooks.AttemptHeader) != "2" {
		t.Fatalf("delivery headers %v (%d unsigned)", h, bad)
	}

	// The delivery log, for the session's owner.
	var log struct {
		Deliveries []hooks.Delivery `json:"deliveries"`
	}
	eventually(t, "the log to show both deliveries", func() bool {
		code, body := c.call("GET", "/v1/hooks/deliveries?session="+string(first.Session), "ci-bot", nil)
		if code != http.StatusOK {
			t.Fatalf("deliveries: %d %s", code, body)
		}
		_ = json.Unmarshal(body, &log)
		return len(log.Deliveries) == 2 && log.Deliveries[0].Status == hooks.StatusDelivered && log.Deliveries[1].Status == hooks.StatusDelivered
	})
	if d := log.Deliveries[1]; d.Attempts != 2 || d.Target != "results" || d.Kind != session.KindTurnFinished || d.Seq >= log.Deliveries[0].Seq {
		t.Fatalf("oldest delivery %+v: want the retried one, after 2 attempts", d)
	}
	raw, _ := json.Marshal(log)
	if strings.Contains(string(raw), "s3cr3t") || strings.Contains(string(raw), rc.srv.URL) {
		t.Fatal("the delivery log shows the target's URL")
	}
	// Others may not read it.
	if code, body := c.call("GET", "/v1/hooks/deliveries?session="+string(first.Session), "bob", nil); code != http.StatusNotFound {
		t.Fatalf("deliveries as a stranger: %d %s", code, body)
	}
	if code, body := c.call("GET", "/v1/hooks/deliveries", "ci-bot", nil); code != http.StatusBadRequest {
		t.Fatalf("deliveries without a session: %d %s", code, body)
	}
}

func TestHooks_SubscriptionsByREST(t *testing.T) {
	c, rc := newHookEnv(t)
	sess := c.create("alice", "watched")
	c.member(sess.ID, "alice", "vic", session.RoleViewer)
	path := "/v1/sessions/" + string(sess.ID) + "/hooks/results"
	if code, body := c.call("PUT", path, "vic", map[string]any{"kinds": []string{"message"}}); code != http.StatusForbidden {
		t.Fatalf("subscribe as a viewer: %d %s", code, body)
	}
	if code, body := c.call("PUT", "/v1/sessions/"+string(sess.ID)+"/hooks/nowhere", "alice", nil); code != http.StatusNotFound {
		t.Fatalf("subscribe to an unknown target: %d %s", code, body)
	}
	if code, body := c.call("PUT", path, "alice", map[string]any{"kinds": []string{"message", "turn_finished"}}); code != http.StatusOK {
		t.Fatalf("subscribe: %d %s", code, body)
	}
	code, body := c.call("GET", "/v1/sessions/"+string(sess.ID)+"/hooks", "alice", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"target":"results"`) {
		t.Fatalf("list: %d %s", code, body)
	}
	// Events from before the subscription are not delivered.
	c.call("POST", "/v1/sessions/"+string(sess.ID)+"/messages", "alice", map[string]string{"text": "echo watched"})
	eventually(t, "the message and turn_finished delivered", func() bool { return len(rc.kinds(sess.ID)) == 2 })
	if k := rc.kinds(sess.ID); k[0] != session.KindMessage || k[1] != session.KindTurnFinished {
		t.Fatalf("delivered %v", k)
	}
	if code, body := c.call("DELETE", path, "alice", nil); code != http.StatusNoContent {
		t.Fatalf("unsubscribe: %d %s", code, body)
	}
	c.call("POST", "/v1/sessions/"+string(sess.ID)+"/messages", "alice", map[string]string{"text": "echo unwatched"})
	c.messages(sess.ID, 2)
	time.Sleep(200 * time.Millisecond) // nothing to wait for: nothing must be delivered
	if n := len(rc.kinds(sess.ID)); n != 2 {
		t.Fatalf("%d deliveries after unsubscribing, want 2", n)
	}

	// A target that refuses (400) fails the delivery for good: the log says so.
	rc.mu.Lock()
	rc.reject = true
	rc.mu.Unlock()
	c.call("PUT", path, "alice", map[string]any{"kinds": []string{"message"}})
	c.call("POST", "/v1/sessions/"+string(sess.ID)+"/messages", "alice", map[string]string{"text": "echo refused"})
	eventually(t, "the refused delivery in the log", func() bool {
		_, body := c.call("GET", "/v1/hooks/deliveries?session="+string(sess.ID), "alice", nil)
		var log struct {
			Deliveries []hooks.Delivery `json:"deliveries"`
		}
		_ = json.Unmarshal(body, &log)
		return len(log.Deliveries) == 3 && log.Deliveries[0].Status == hooks.StatusFailed && log.Deliveries[0].LastCode == 400 &&
			log.Deliveries[0].Attempts == 1
	})
}
