package gateway_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// fakeSlack is a local Slack: the Web API methods Atrium calls, with the
// shapes Slack documents (form-encoded requests, {"ok":…} answers, 429 with
// Retry-After), and the sending side of the Events API, interactivity and
// slash commands, signed with the app's signing secret like Slack signs
// them.
type fakeSlack struct {
	t      testing.TB
	srv    *httptest.Server
	token  string
	secret string
	team   string
	bot    string // the app's bot user id

	mu       sync.Mutex
	atrium   string                // guarded by mu: base URL events are sent to
	next     int                   // guarded by mu: ts counter
	msgs     []*slackMsg           // guarded by mu: posted messages, in order
	byTS     map[string]*slackMsg  // guarded by mu
	whispers []slackWhisper        // guarded by mu: ephemeral messages
	uploads  []slackUpload         // guarded by mu: completed uploads
	pending  map[string]*slackFile // guarded by mu: files uploaded, not completed
	users    map[string]slackUser  // guarded by mu: users.info answers
	calls    map[string]int        // guarded by mu: Web API calls by method
	down     bool                  // guarded by mu: every API call gets 503
	limited  int                   // guarded by mu: this many next calls get 429
	limitAt  []time.Time           // guarded by mu: when 429s were answered
	events   int                   // guarded by mu: event id counter
}

type slackMsg struct {
	Channel, TS, ThreadTS, Text string
	Blocks                      string
	Edits                       int
	EditedAt                    time.Time
	PostedAt                    time.Time
}

// all is the message's text and blocks, for matching.
func (m *slackMsg) all() string { return m.Text + "\n" + m.Blocks }

type slackWhisper struct{ Channel, User, ThreadTS, Text string }

type slackUpload struct {
	Channel, ThreadTS, Name, Title, Comment string
	Content                                 []byte
}

type slackFile struct {
	name    string
	content []byte
}

type slackUser struct {
	email              string
	confirmed, bot     bool
	restricted, delete bool
}

func startFakeSlack(t testing.TB) *fakeSlack {
	t.Helper()
	f := &fakeSlack{
		t: t, token: "xoxb-test-token", secret: "8f742231b10e8888abcd99yyyzzz85a5", team: "T0ACME", bot: "U0BOT",
		byTS: make(map[string]*slackMsg), pending: make(map[string]*slackFile),
		users: make(map[string]slackUser), calls: make(map[string]int),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/{method}", f.api)
	mux.HandleFunc("POST /upload/{id}", f.upload)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSlack) setAtrium(base string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.atrium = base
}

// setDown makes every Web API call fail with 503 (or work again).
func (f *fakeSlack) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// limit makes the next n Web API calls get 429 with Retry-After: 1.
func (f *fakeSlack) limit(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limited = n
}

func (f *fakeSlack) addUser(id string, u slackUser) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[id] = u
}

func (f *fakeSlack) answer(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeSlack) api(w http.ResponseWriter, r *http.Request) {
	method := r.PathValue("method")
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if f.down {
		http.Error(w, "<html>service unavailable</html>", http.StatusServiceUnavailable)
		return
	}
	if f.limited > 0 {
		f.limited--
		f.limitAt = append(f.limitAt, time.Now())
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		f.answer(w, map[string]any{"ok": false, "error": "ratelimited"})
		return
	}
	tok := r.Form.Get("token")
	if h := r.Header.Get("Authorization"); h != "" {
		tok = strings.TrimPrefix(h, "Bearer ")
	}
	if tok != f.token {
		f.answer(w, map[string]any{"ok": false, "error": "invalid_auth"})
		return
	}
	switch method {
	case "auth.test":
		f.answer(w, map[string]any{"ok": true, "url": "https://acme.slack.com/", "team": "Acme", "user": "atrium",
			"team_id": f.team, "user_id": f.bot, "bot_id": "B0BOT"})
	case "chat.postMessage":
		ch := r.Form.Get("channel")
		if ch == "" {
			f.answer(w, map[string]any{"ok": false, "error": "channel_not_found"})
			return
		}
		f.next++
		ts := fmt.Sprintf("1700000%03d.000100", f.next)
		m := &slackMsg{Channel: ch, TS: ts, ThreadTS: r.Form.Get("thread_ts"), Text: r.Form.Get("text"),
			Blocks: r.Form.Get("blocks"), PostedAt: time.Now()}
		f.msgs = append(f.msgs, m)
		f.byTS[ts] = m
		f.answer(w, map[string]any{"ok": true, "channel": ch, "ts": ts,
			"message": map[string]any{"type": "message", "text": m.Text, "ts": ts, "thread_ts": m.ThreadTS, "bot_id": "B0BOT"}})
	case "chat.update":
		m := f.byTS[r.Form.Get("ts")]
		if m == nil || m.Channel != r.Form.Get("channel") {
			f.answer(w, map[string]any{"ok": false, "error": "message_not_found"})
			return
		}
		m.Text, m.Blocks = r.Form.Get("text"), r.Form.Get("blocks")
		m.Edits++
		m.EditedAt = time.Now()
		f.answer(w, map[string]any{"ok": true, "channel": m.Channel, "ts": m.TS, "text": m.Text})
	case "chat.postEphemeral":
		f.whispers = append(f.whispers, slackWhisper{Channel: r.Form.Get("channel"), User: r.Form.Get("user"),
			ThreadTS: r.Form.Get("thread_ts"), Text: r.Form.Get("text")})
		f.answer(w, map[string]any{"ok": true, "message_ts": "1700000999.000001"})
	case "users.info":
		u, ok := f.users[r.Form.Get("user")]
		if !ok {
			f.answer(w, map[string]any{"ok": false, "error": "user_not_found"})
			return
		}
		f.answer(w, map[string]any{"ok": true, "user": map[string]any{
			"id": r.Form.Get("user"), "team_id": f.team, "name": "someone", "deleted": u.delete, "is_bot": u.bot,
			"is_restricted": u.restricted, "is_email_confirmed": u.confirmed,
			"profile": map[string]any{"email": u.email, "real_name": "Someone"},
		}})
	case "files.getUploadURLExternal":
		id := fmt.Sprintf("F%04d", len(f.pending)+len(f.uploads)+1)
		f.pending[id] = &slackFile{name: r.Form.Get("filename")}
		f.answer(w, map[string]any{"ok": true, "upload_url": f.srv.URL + "/upload/" + id, "file_id": id})
	case "files.completeUploadExternal":
		var files []struct {
			ID    string `json:"id"`
			Title string `json:"title"`
		}
		if err := json.Unmarshal([]byte(r.Form.Get("files")), &files); err != nil || len(files) != 1 || f.pending[files[0].ID] == nil {
			f.answer(w, map[string]any{"ok": false, "error": "invalid_arguments"})
			return
		}
		p := f.pending[files[0].ID]
		delete(f.pending, files[0].ID)
		f.uploads = append(f.uploads, slackUpload{Channel: r.Form.Get("channel_id"), ThreadTS: r.Form.Get("thread_ts"),
			Name: p.name, Title: files[0].Title, Comment: r.Form.Get("initial_comment"), Content: p.content})
		f.answer(w, map[string]any{"ok": true, "files": []map[string]string{{"id": files[0].ID, "title": files[0].Title}}})
	default:
		f.answer(w, map[string]any{"ok": false, "error": "unknown_method"})
	}
}

// upload receives the file of an upload URL (multipart, field "file").
func (f *fakeSlack) upload(w http.ResponseWriter, r *http.Request) {
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		http.Error(w, "not multipart", http.StatusBadRequest)
		return
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	var content []byte
	for {
		part, err := mr.NextPart()
		if err != nil {
			break
		}
		if part.FormName() == "file" {
			content, _ = io.ReadAll(part)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pending[r.PathValue("id")]
	if p == nil {
		http.Error(w, "unknown upload", http.StatusNotFound)
		return
	}
	p.content = content
	_, _ = io.WriteString(w, "OK - "+strconv.Itoa(len(content)))
}

// sign returns the v0 signature of body at ts.
func (f *fakeSlack) sign(ts int64, body []byte, secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "v0:%d:", ts)
	m.Write(body)
	return "v0=" + hex.EncodeToString(m.Sum(nil))
}

// post sends a signed request to Atrium the way Slack does.
func (f *fakeSlack) post(path, ctype string, body []byte, hdr http.Header) (int, []byte) {
	f.t.Helper()
	ts := time.Now().Unix()
	h := http.Header{"Content-Type": {ctype}, "X-Slack-Request-Timestamp": {strconv.FormatInt(ts, 10)},
		"X-Slack-Signature": {f.sign(ts, body, f.secret)}}
	for k, v := range hdr {
		h[k] = v
	}
	f.mu.Lock()
	base := f.atrium
	f.mu.Unlock()
	return callURL(f.t, base, http.MethodPost, path, "", body, h)
}

// eventBody is an Events API callback carrying inner.
func (f *fakeSlack) eventBody(eventID string, inner map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{
		"token": "legacy-verification-token", "team_id": f.team, "api_app_id": "A0ATRIUM", "event": inner,
		"type": "event_callback", "event_id": eventID, "event_time": time.Now().Unix(),
		"authorizations": []map[string]any{{"team_id": f.team, "user_id": f.bot, "is_bot": true}},
	})
	return b
}

// newEventID returns a fresh Slack event id.
func (f *fakeSlack) newEventID() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events++
	return fmt.Sprintf("Ev%08d", f.events)
}

// deliver sends an event callback; retry > 0 sets X-Slack-Retry-Num.
func (f *fakeSlack) deliver(eventID string, inner map[string]any, retry int) int {
	f.t.Helper()
	var hdr http.Header
	if retry > 0 {
		hdr = http.Header{"X-Slack-Retry-Num": {strconv.Itoa(retry)}, "X-Slack-Retry-Reason": {"http_timeout"}}
	}
	code, _ := f.post("/channels/slack/events", "application/json", f.eventBody(eventID, inner), hdr)
	return code
}

// mention sends an app_mention by user in channel; threadTS "" starts a
// thread at ts. It returns the event id and Atrium's status code.
func (f *fakeSlack) mention(user, channel, ts, threadTS, text string) (string, int) {
	f.t.Helper()
	id := f.newEventID()
	inner := map[string]any{"type": "app_mention", "user": user, "text": "<@" + f.bot + "> " + text, "ts": ts,
		"channel": channel, "event_ts": ts}
	if threadTS != "" {
		inner["thread_ts"] = threadTS
	}
	return id, f.deliver(id, inner, 0)
}

// press sends a block_actions interaction: user pressed the button with
// actionID and value on message m.
func (f *fakeSlack) press(user string, m *slackMsg, actionID, value string) int {
	f.t.Helper()
	payload, _ := json.Marshal(map[string]any{
		"type": "block_actions", "team": map[string]string{"id": f.team, "domain": "acme"},
		"user": map[string]string{"id": user, "name": strings.ToLower(user)}, "api_app_id": "A0ATRIUM",
		"channel":    map[string]string{"id": m.Channel, "name": "general"},
		"container":  map[string]any{"type": "message", "message_ts": m.TS, "channel_id": m.Channel, "thread_ts": m.ThreadTS},
		"message":    map[string]any{"type": "message", "ts": m.TS, "thread_ts": m.ThreadTS, "text": m.Text},
		"trigger_id": "13345224609.738474920.8088930838d88f008e0", "response_url": "https://hooks.slack.test/actions/x",
		"actions": []map[string]any{{"action_id": actionID, "block_id": "atrium_actions", "value": value, "type": "button",
			"action_ts": "1700000000.1"}},
	})
	code, _ := f.post("/channels/slack/interactivity", "application/x-www-form-urlencoded",
		[]byte(url.Values{"payload": {string(payload)}}.Encode()), nil)
	return code
}

// slash sends "/atrium text" by user in channel and returns the reply.
func (f *fakeSlack) slash(user, channel, text string) (int, string) {
	f.t.Helper()
	form := url.Values{"token": {"legacy"}, "team_id": {f.team}, "team_domain": {"acme"}, "channel_id": {channel},
		"channel_name": {"general"}, "user_id": {user}, "user_name": {strings.ToLower(user)}, "command": {"/atrium"},
		"text": {text}, "api_app_id": {"A0ATRIUM"}, "response_url": {"https://hooks.slack.test/commands/x"},
		"trigger_id": {"13345224609.738474920.8088930838d88f008e0"}}
	code, body := f.post("/channels/slack/commands", "application/x-www-form-urlencoded", []byte(form.Encode()), nil)
	var r struct {
		ResponseType string `json:"response_type"`
		Text         string `json:"text"`
	}
	if code == http.StatusOK {
		if err := json.Unmarshal(body, &r); err != nil || r.ResponseType != "ephemeral" {
			f.t.Fatalf("slash command answer %s: want an ephemeral JSON response", body)
		}
	}
	return code, r.Text
}

// waitMsg waits for a posted message that satisfies ok.
func (f *fakeSlack) waitMsg(what string, ok func(m *slackMsg) bool) *slackMsg {
	f.t.Helper()
	var found *slackMsg
	eventually(f.t, what, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, m := range f.msgs {
			if ok(m) {
				c := *m
				found = &c
				return true
			}
		}
		return false
	})
	return found
}

// messages returns a copy of the posted messages matching ok.
func (f *fakeSlack) messages(ok func(m *slackMsg) bool) []slackMsg {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []slackMsg
	for _, m := range f.msgs {
		if ok(m) {
			out = append(out, *m)
		}
	}
	return out
}

// waitWhisper waits for an ephemeral message to user containing text.
func (f *fakeSlack) waitWhisper(user, text string) slackWhisper {
	f.t.Helper()
	var found slackWhisper
	eventually(f.t, "an ephemeral message to "+user+" saying "+strconv.Quote(text), func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, w := range f.whispers {
			if w.User == user && strings.Contains(w.Text, text) {
				found = w
				return true
			}
		}
		return false
	})
	return found
}

func (f *fakeSlack) whispersTo(user string) []slackWhisper {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []slackWhisper
	for _, w := range f.whispers {
		if w.User == user {
			out = append(out, w)
		}
	}
	return out
}

func (f *fakeSlack) callCount(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// inThread matches messages of a thread.
func inThread(channel, ts string) func(*slackMsg) bool {
	return func(m *slackMsg) bool { return m.Channel == channel && m.ThreadTS == ts }
}

// fakeTelegram is a local Telegram Bot API with the methods Atrium calls,
// and the sending side of the webhook.
type fakeTelegram struct {
	t      testing.TB
	srv    *httptest.Server
	token  string
	secret string

	mu      sync.Mutex
	atrium  string   // guarded by mu
	next    int64    // guarded by mu: message ids
	update  int64    // guarded by mu: update ids
	msgs    []*tgMsg // guarded by mu
	answers []tgAnswer
	docs    []tgDoc
}

type tgMsg struct {
	Chat, Thread string
	ID           int64
	Text         string
	Markup       string
	Edits        int
}

type tgAnswer struct{ ID, Text string }

type tgDoc struct {
	Chat, Caption, Name string
	Content             []byte
}

func startFakeTelegram(t testing.TB) *fakeTelegram {
	t.Helper()
	f := &fakeTelegram{t: t, token: "4242:AAtestTOKEN", secret: "tg-secret_0123456789"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /{bot}/{method}", f.api)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeTelegram) api(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.PathValue("bot") != "bot"+f.token {
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 401, "description": "Unauthorized"})
		return
	}
	ok := func(result any) { _ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "result": result}) }
	method := r.PathValue("method")
	if method == "sendDocument" {
		if err := r.ParseMultipartForm(1 << 20); err != nil {
			http.Error(w, "bad multipart", http.StatusBadRequest)
			return
		}
		file, hdr, err := r.FormFile("document")
		if err != nil {
			http.Error(w, "no document", http.StatusBadRequest)
			return
		}
		content, _ := io.ReadAll(file)
		f.mu.Lock()
		f.docs = append(f.docs, tgDoc{Chat: r.FormValue("chat_id"), Caption: r.FormValue("caption"), Name: hdr.Filename, Content: content})
		f.next++
		id := f.next
		f.mu.Unlock()
		ok(map[string]any{"message_id": id})
		return
	}
	var req map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	str := func(k string) string {
		var s string
		if json.Unmarshal(req[k], &s) != nil {
			var n json.Number
			_ = json.Unmarshal(req[k], &n)
			return n.String()
		}
		return s
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch method {
	case "getMe":
		ok(map[string]any{"id": 4242, "is_bot": true, "first_name": "Atrium", "username": "atrium_bot"})
	case "sendMessage":
		f.next++
		m := &tgMsg{Chat: str("chat_id"), Thread: str("message_thread_id"), ID: f.next, Text: str("text"), Markup: string(req["reply_markup"])}
		f.msgs = append(f.msgs, m)
		chatID, _ := strconv.ParseInt(m.Chat, 10, 64)
		ok(map[string]any{"message_id": m.ID, "date": time.Now().Unix(), "chat": map[string]any{"id": chatID, "type": "private"}, "text": m.Text})
	case "editMessageText":
		id, _ := strconv.ParseInt(str("message_id"), 10, 64)
		for _, m := range f.msgs {
			if m.ID == id && m.Chat == str("chat_id") {
				if m.Text == str("text") && m.Markup == string(req["reply_markup"]) {
					w.WriteHeader(http.StatusBadRequest)
					_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 400,
						"description": "Bad Request: message is not modified"})
					return
				}
				m.Text, m.Markup = str("text"), string(req["reply_markup"])
				m.Edits++
				ok(map[string]any{"message_id": m.ID})
				return
			}
		}
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message to edit not found"})
	case "answerCallbackQuery":
		f.answers = append(f.answers, tgAnswer{ID: str("callback_query_id"), Text: str("text")})
		ok(true)
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error_code": 404, "description": "Not Found"})
	}
}

func (f *fakeTelegram) setAtrium(base string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.atrium = base
}

// send posts an update to Atrium's webhook with the secret token (or
// another one) and returns the status code.
func (f *fakeTelegram) send(u map[string]any, secret string) int {
	f.t.Helper()
	f.mu.Lock()
	if _, ok := u["update_id"]; !ok {
		f.update++
		u["update_id"] = 5000 + f.update
	}
	base := f.atrium
	f.mu.Unlock()
	body, _ := json.Marshal(u)
	hdr := http.Header{"Content-Type": {"application/json"}}
	if secret != "" {
		hdr.Set("X-Telegram-Bot-Api-Secret-Token", secret)
	}
	code, _ := callURL(f.t, base, http.MethodPost, "/channels/telegram/webhook", "", body, hdr)
	return code
}

// text sends a private-chat message from user id uid.
func (f *fakeTelegram) text(uid int64, text string) int {
	f.t.Helper()
	return f.send(map[string]any{"message": map[string]any{
		"message_id": time.Now().UnixNano() % 100000, "date": time.Now().Unix(), "text": text,
		"from": map[string]any{"id": uid, "is_bot": false, "first_name": "User" + strconv.FormatInt(uid, 10)},
		"chat": map[string]any{"id": uid, "type": "private"},
	}}, f.secret)
}

func (f *fakeTelegram) waitMsg(what string, ok func(m *tgMsg) bool) tgMsg {
	f.t.Helper()
	var found tgMsg
	eventually(f.t, what, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, m := range f.msgs {
			if ok(m) {
				found = *m
				return true
			}
		}
		return false
	})
	return found
}

// agent plays the harness of every session of a fake node, so that chat
// tests see real turns: each prompt (a message event) starts a turn
// scripted by its text, as the node's turn runner would record it:
//
//	echo TEXT   prints TEXT and succeeds
//	long N      prints N bytes
//	ask SUMMARY asks for an approval (id "a1") and waits; the test answers
//	            with resolve
//	fail        exits 3
//
// After each turn it writes the catalog, as the node does when a turn ends.
type agent struct {
	t   testing.TB
	n   *fakeNode
	mu  sync.Mutex
	run map[session.ID]int64 // guarded by mu: turns started
}

func startAgent(t testing.TB, n *fakeNode, nc *nats.Conn) *agent {
	t.Helper()
	a := &agent{t: t, n: n, run: make(map[session.ID]int64)}
	sub, err := nc.Subscribe("atrium.session.*.events", a.onEvent)
	if err != nil {
		t.Fatalf("agent: subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("agent: flush: %v", err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return a
}

func (a *agent) onEvent(m *nats.Msg) {
	var ev session.Event
	if json.Unmarshal(m.Data, &ev) != nil || ev.Kind != session.KindMessage {
		return
	}
	var md session.MessageData
	_ = json.Unmarshal(ev.Data, &md)
	id := session.ID(strings.Split(m.Subject, ".")[2])
	a.mu.Lock()
	a.run[id]++
	turn := a.run[id]
	a.mu.Unlock()
	a.append(id, ev.By, session.KindTurnStarted, session.TurnStartedData{Turn: turn, PromptSeq: ev.Seq})
	verb, arg, _ := strings.Cut(md.Text, " ")
	if taskID, _, ok := strings.Cut(md.ClientID, "."); ok && strings.HasPrefix(taskID, "task_") {
		// A repository task's prompt (channels_task_test.go): what the
		// task wrapper prints when the work changed something and its
		// branch was pushed.
		a.append(id, session.BySystem, session.KindAgent, map[string]any{"turn": turn, "type": "task_result",
			"changes": true, "branch": "atrium/" + taskID, "commit": "0123456789abcdef0123456789abcdef01234567"})
		a.finish(id, turn, session.TurnOK, 0)
		return
	}
	switch verb {
	case "echo":
		a.append(id, session.BySystem, session.KindOutput, session.OutputData{Turn: turn, Stream: "stdout", Text: arg + "\n"})
		a.finish(id, turn, session.TurnOK, 0)
	case "long":
		n, _ := strconv.Atoi(arg)
		line := strings.Repeat("x", 99) + "\n"
		a.append(id, session.BySystem, session.KindOutput, session.OutputData{Turn: turn, Stream: "stdout", Text: strings.Repeat(line, n/100)})
		a.finish(id, turn, session.TurnOK, 0)
	case "ask":
		a.append(id, session.BySystem, session.KindApprovalRequested, session.ApprovalRequestedData{Turn: turn, ID: "a1", Summary: arg})
		a.put(id)
	case "fail":
		a.append(id, session.BySystem, session.KindOutput, session.OutputData{Turn: turn, Stream: "stderr", Text: "boom\n"})
		a.finish(id, turn, session.TurnFailed, 3)
	default:
		a.append(id, session.BySystem, session.KindOutput, session.OutputData{Turn: turn, Stream: "stdout", Text: "ok: " + md.Text + "\n"})
		a.finish(id, turn, session.TurnOK, 0)
	}
}

// resolve answers the pending approval of id's running turn, as by, and
// ends the turn.
func (a *agent) resolve(id session.ID, by string, allow bool) {
	a.mu.Lock()
	turn := a.run[id]
	a.mu.Unlock()
	a.append(id, by, session.KindApprovalResolved, session.ApprovalResolvedData{Turn: turn, ID: "a1", Allow: allow})
	a.append(id, session.BySystem, session.KindOutput, session.OutputData{Turn: turn, Stream: "stdout", Text: "done\n"})
	a.finish(id, turn, session.TurnOK, 0)
}

func (a *agent) finish(id session.ID, turn int64, status session.TurnStatus, code int) {
	a.append(id, session.BySystem, session.KindTurnFinished, session.TurnFinishedData{Turn: turn, Status: status, ExitCode: code, DurationMS: 1200})
	a.put(id)
}

func (a *agent) append(id session.ID, by string, kind session.Kind, data any) {
	a.n.mu.Lock()
	defer a.n.mu.Unlock()
	if s := a.n.sessions[id]; s != nil {
		a.n.appendLocked(s, kind, by, data)
	}
}

// put writes id's catalog entry (its last seq), as the node does.
func (a *agent) put(id session.ID) {
	a.n.mu.Lock()
	defer a.n.mu.Unlock()
	if s := a.n.sessions[id]; s != nil {
		a.n.putLocked(s)
	}
}

// commands returns the commands of op the node received.
func (n *fakeNode) commands(op session.Op) []session.Command {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []session.Command
	for _, c := range n.cmds {
		if c.Op == op {
			out = append(out, c)
		}
	}
	return out
}

// sessionsOf returns the sessions owned by user.
func (n *fakeNode) sessionsOf(user string) []session.CatalogEntry {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []session.CatalogEntry
	for _, s := range n.sessions {
		if s.entry.Owner == user {
			out = append(out, s.entry)
		}
	}
	return out
}

// messagesOf returns the message events of id: their text and author.
func (n *fakeNode) messagesOf(id session.ID) []session.Event {
	var out []session.Event
	for _, raw := range n.Events(id) {
		var ev session.Event
		if json.Unmarshal(raw, &ev) == nil && ev.Kind == session.KindMessage {
			out = append(out, ev)
		}
	}
	return out
}

// role returns user's member role on id.
func (n *fakeNode) role(id session.ID, user string) session.Role {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sessions[id].entry.Members[user]
}

// ctxT returns a context bounded by waitTimeout.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}
