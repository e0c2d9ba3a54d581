package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// invokeEvent is one Server-Sent Event of an invoke stream.
type invokeEvent struct {
	name string
	data []byte
}

// invokeStream is an open invoke: its response and its events, read by a
// goroutine the test's cleanup waits for.
type invokeStream struct {
	t      testing.TB
	resp   *http.Response
	id     string           // Atrium-Invoke-Id
	ch     chan invokeEvent // closed when the stream ends
	end    error            // the read error that ended it (io.EOF: it ended); set before ch is closed
	cancel context.CancelFunc
}

// startInvoke posts an invoke as user. It returns the open stream on 200;
// otherwise the status and body of the refusal.
func startInvoke(t testing.TB, base string, id session.ID, user, text string) (*invokeStream, int, []byte, http.Header) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]string{"text": text})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/sessions/"+string(id)+"/invoke", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	req.Header.Set("Authorization", "Bearer dev:"+user)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("invoke: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return nil, resp.StatusCode, body, resp.Header
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	s := &invokeStream{t: t, resp: resp, id: resp.Header.Get(gateway.HeaderInvokeID), ch: make(chan invokeEvent, 1024), cancel: cancel}
	if !strings.HasPrefix(s.id, "inv_") {
		t.Errorf("invoke id header %q", s.id)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		rd := bufio.NewReader(resp.Body)
		var ev invokeEvent
		defer close(s.ch)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				s.end = err
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "":
				if ev.name != "" {
					s.ch <- ev
				}
				ev = invokeEvent{}
			case strings.HasPrefix(line, ":"): // comment
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = append(ev.data, strings.TrimPrefix(line, "data: ")...)
			default:
				t.Errorf("unexpected SSE line %q", line)
			}
		}
	})
	t.Cleanup(func() {
		s.close()
		wg.Wait()
	})
	return s, http.StatusOK, nil, resp.Header
}

func mustInvoke(t testing.TB, base string, id session.ID, user, text string) *invokeStream {
	t.Helper()
	s, code, body, _ := startInvoke(t, base, id, user, text)
	if s == nil {
		t.Fatalf("invoke: %d %s", code, body)
	}
	return s
}

// close closes the stream as a client that goes away.
func (s *invokeStream) close() {
	s.cancel()
	_ = s.resp.Body.Close()
}

// next returns the next event; it fails the test if the stream ended.
func (s *invokeStream) next() invokeEvent {
	s.t.Helper()
	select {
	case ev, ok := <-s.ch:
		if !ok {
			s.t.Fatalf("stream ended: %v", s.end)
		}
		return ev
	case <-time.After(waitTimeout):
		s.t.Fatal("no event in time")
	}
	return invokeEvent{}
}

// untilExit reads the events up to and including exit, and checks that the
// stream then ends.
func (s *invokeStream) untilExit() []invokeEvent {
	s.t.Helper()
	var evs []invokeEvent
	for {
		ev := s.next()
		evs = append(evs, ev)
		if ev.name == "exit" {
			break
		}
	}
	select {
	case ev, ok := <-s.ch:
		if ok {
			s.t.Fatalf("event %s %s after exit", ev.name, ev.data)
		}
		if !errors.Is(s.end, io.EOF) {
			s.t.Fatalf("stream ended with %v after exit", s.end)
		}
	case <-time.After(waitTimeout):
		s.t.Fatal("stream did not end after exit")
	}
	return evs
}

// exitOf decodes an exit event.
func exitOf(t testing.TB, ev invokeEvent) (code int, status session.TurnStatus) {
	t.Helper()
	var d struct {
		ExitCode   *int               `json:"exit_code"`
		Status     session.TurnStatus `json:"status"`
		DurationMS *int64             `json:"duration_ms"`
	}
	if ev.name != "exit" || json.Unmarshal(ev.data, &d) != nil || d.ExitCode == nil || d.DurationMS == nil {
		t.Fatalf("not an exit event: %s %s", ev.name, ev.data)
	}
	return *d.ExitCode, d.Status
}

func TestInvoke_StreamShape(t *testing.T) {
	e := newE2E(t, time.Minute)
	s := e.create("alice", "invoke")
	st := mustInvoke(t, e.srv.URL, s.ID, "alice",
		`echo out; echo '{"type":"note","n":1}'; echo err >&2; exit 3`)
	evs := st.untilExit()

	var start struct {
		InvokeID string      `json:"invoke_id"`
		Session  session.ID  `json:"session"`
		Seq      session.Seq `json:"seq"`
		Turn     int64       `json:"turn"`
	}
	if evs[0].name != "start" || json.Unmarshal(evs[0].data, &start) != nil {
		t.Fatalf("first event %s %s, want start", evs[0].name, evs[0].data)
	}
	if start.InvokeID != st.id || start.Session != s.ID || start.Turn != 1 || start.Seq != 2 {
		t.Fatalf("start %s: want invoke %s, session %s, seq 2 (after session_created), turn 1", evs[0].data, st.id, s.ID)
	}
	text := map[string]string{}
	var agent map[string]any
	for _, ev := range evs[1 : len(evs)-1] {
		switch ev.name {
		case "stdout", "stderr":
			var d struct{ Text string }
			if err := json.Unmarshal(ev.data, &d); err != nil {
				t.Fatalf("%s data %s: %v", ev.name, ev.data, err)
			}
			text[ev.name] += d.Text
		case "agent":
			if err := json.Unmarshal(ev.data, &agent); err != nil {
				t.Fatalf("agent data %s: %v", ev.data, err)
			}
		default:
			t.Fatalf("unexpected event %s %s", ev.name, ev.data)
		}
	}
	if text["stdout"] != "out\n" || text["stderr"] != "err\n" {
		t.Fatalf("stdout %q, stderr %q", text["stdout"], text["stderr"])
	}
	if agent["type"] != "note" || agent["n"] != float64(1) || agent["turn"] != float64(1) {
		t.Fatalf("agent event %v", agent)
	}
	if code, status := exitOf(t, evs[len(evs)-1]); code != 3 || status != session.TurnFailed {
		t.Fatalf("exit %d %s, want 3 failed", code, status)
	}

	// A second invoke follows its own turn only.
	evs = mustInvoke(t, e.srv.URL, s.ID, "alice", "echo second").untilExit()
	if len(evs) != 3 || evs[0].name != "start" || evs[1].name != "stdout" || !strings.Contains(string(evs[1].data), `"second\n"`) {
		t.Fatalf("second invoke: %q", evs)
	}
	if code, status := exitOf(t, evs[2]); code != 0 || status != session.TurnOK {
		t.Fatalf("second exit %d %s", code, status)
	}
}

func TestInvoke_BadRequests(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "x")
	e.member(s.ID, "alice", "vic", session.RoleViewer)
	path := "/v1/sessions/" + string(s.ID) + "/invoke"
	for _, tc := range []struct {
		name, user string
		body       any
		status     int
		code       session.Code
	}{
		{"no text", "alice", map[string]string{}, 400, session.CodeBadRequest},
		{"unknown field", "alice", `{"text":"x","nope":1}`, 400, session.CodeBadRequest},
		{"viewer", "vic", map[string]string{"text": "x"}, 403, session.CodeForbidden},
		{"stranger", "mallory", map[string]string{"text": "x"}, 404, session.CodeNotFound},
		{"no credentials", "", map[string]string{"text": "x"}, 401, session.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := e.call("POST", path, tc.user, tc.body)
			if code != tc.status || errCode(t, body) != tc.code {
				t.Fatalf("%d %s, want %d %s", code, body, tc.status, tc.code)
			}
		})
	}
	for _, tc := range []struct {
		name string
		body any
		code session.Code
	}{
		{"no invoke id", `{}`, session.CodeBadRequest},
		{"unknown invoke", map[string]string{"invoke_id": "inv_nope"}, session.CodeNotFound},
	} {
		t.Run("cancel "+tc.name, func(t *testing.T) {
			code, body := e.call("POST", path+"/cancel", "alice", tc.body)
			if errCode(t, body) != tc.code || code != tc.code.HTTPStatus() {
				t.Fatalf("%d %s, want %s", code, body, tc.code)
			}
		})
	}
}

// invokesKV opens the bucket of invoke slots and registry entries.
func invokesKV(t testing.TB, ns *server.Server) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(connectNATS(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, "atrium_invokes")
	if err != nil {
		t.Fatalf("open invokes bucket: %v", err)
	}
	return kv
}

// registered reports whether an invoke is in the KV registry.
func registered(t testing.TB, kv jetstream.KeyValue, invokeID string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := kv.Get(ctx, "entry."+base64.RawURLEncoding.EncodeToString([]byte("invoke/"+invokeID)))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("read registry: %v", err)
	}
	return err == nil
}

// turnOf finds the turn of the prompt whose text is text in id's history
// and returns its events (turn_started … turn_finished, as far as they go).
func (e e2eEnv) turnOf(id session.ID, text string) (turn []session.Event) {
	e.t.Helper()
	var promptSeq session.Seq
	n := int64(-1)
	for _, raw := range e.page(id, "alice", 0) {
		var ev session.Event
		if err := json.Unmarshal(raw, &ev); err != nil {
			e.t.Fatal(err)
		}
		var d struct {
			Text      string      `json:"text"`
			Turn      int64       `json:"turn"`
			PromptSeq session.Seq `json:"prompt_seq"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		switch {
		case ev.Kind == session.KindMessage && d.Text == text:
			promptSeq = ev.Seq
		case ev.Kind == session.KindTurnStarted && promptSeq != 0 && d.PromptSeq == promptSeq:
			n = d.Turn
			turn = append(turn, ev)
		case n >= 0 && d.Turn == n && ev.Kind != session.KindTurnStarted:
			turn = append(turn, ev)
		}
	}
	return turn
}

// finishedAs returns the status of a turn's turn_finished, or "" if it
// has not finished.
func finishedAs(t testing.TB, turn []session.Event) (session.TurnStatus, int) {
	t.Helper()
	for _, ev := range turn {
		if ev.Kind == session.KindTurnFinished {
			var d session.TurnFinishedData
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			return d.Status, d.ExitCode
		}
	}
	return "", 0
}

// Closing the stream cancels the invoke's turn: the running one, and a
// queued one, which then never runs.
func TestInvoke_CancelByClosing(t *testing.T) {
	e := newE2E(t, time.Minute)
	s := e.create("alice", "close")
	const running, queued = "echo started; sleep 60", "echo QUEUED-RAN"
	a := mustInvoke(t, e.srv.URL, s.ID, "alice", running)
	if ev := a.next(); ev.name != "start" {
		t.Fatalf("first event %s", ev.name)
	}
	if ev := a.next(); ev.name != "stdout" || !strings.Contains(string(ev.data), "started") {
		t.Fatalf("want stdout started, got %s %s", ev.name, ev.data)
	}
	b := mustInvoke(t, e.srv.URL, s.ID, "alice", queued)
	kv := invokesKV(t, e.ns) // made by the first invoke
	if !registered(t, kv, b.id) {
		t.Fatal("an open invoke is not in the registry")
	}
	// Close the queued one, and wait until its gateway has let it go (it
	// cancels the turn before it leaves the registry).
	b.close()
	eventually(t, "the closed invoke to leave the registry", func() bool { return !registered(t, kv, b.id) })
	a.close()
	eventually(t, "both turns to finish", func() bool {
		st1, _ := finishedAs(t, e.turnOf(s.ID, running))
		st2, _ := finishedAs(t, e.turnOf(s.ID, queued))
		return st1 != "" && st2 != ""
	})
	if st, _ := finishedAs(t, e.turnOf(s.ID, running)); st != session.TurnCancelled {
		t.Fatalf("the running turn finished %s, want cancelled", st)
	}
	turn := e.turnOf(s.ID, queued)
	if st, code := finishedAs(t, turn); st != session.TurnCancelled || code != -1 {
		t.Fatalf("the queued turn finished %s (exit %d), want cancelled (-1)", st, code)
	}
	if len(turn) != 2 {
		t.Fatalf("the cancelled queued turn has events %v: want only turn_started and turn_finished", turn)
	}
	// The session still runs the next prompt.
	evs := mustInvoke(t, e.srv.URL, s.ID, "alice", "echo after").untilExit()
	if code, status := exitOf(t, evs[len(evs)-1]); code != 0 || status != session.TurnOK {
		t.Fatalf("next invoke exit %d %s", code, status)
	}
}

// Any gateway cancels an invoke by its id; its stream ends with exit
// cancelled.
func TestInvoke_CancelByID(t *testing.T) {
	e := newE2E(t, time.Minute)
	_, other, _ := startGateway(t, e.ns)
	s := e.create("alice", "cancel")
	e.member(s.ID, "alice", "vic", session.RoleViewer)
	st := mustInvoke(t, e.srv.URL, s.ID, "alice", "echo started; sleep 60")
	if ev := st.next(); ev.name != "start" {
		t.Fatalf("first event %s", ev.name)
	}
	if ev := st.next(); ev.name != "stdout" {
		t.Fatalf("second event %s", ev.name)
	}
	path := "/v1/sessions/" + string(s.ID) + "/invoke/cancel"
	body := map[string]string{"invoke_id": st.id}
	if code, b := callURL(t, other.URL, "POST", path, "vic", body, nil); code != 403 || errCode(t, b) != session.CodeForbidden {
		t.Fatalf("a viewer's cancel: %d %s", code, b)
	}
	s2 := e.create("alice", "other")
	if code, b := callURL(t, other.URL, "POST", "/v1/sessions/"+string(s2.ID)+"/invoke/cancel", "alice", body, nil); code != 404 {
		t.Fatalf("cancel through another session: %d %s", code, b)
	}
	if code, b := callURL(t, other.URL, "POST", path, "alice", body, nil); code != 202 {
		t.Fatalf("cancel: %d %s", code, b)
	}
	evs := st.untilExit()
	if code, status := exitOf(t, evs[len(evs)-1]); status != session.TurnCancelled {
		t.Fatalf("exit %d %s, want cancelled", code, status)
	}
	eventually(t, "the finished invoke to leave the registry", func() bool {
		code, _ := callURL(t, other.URL, "POST", path, "alice", body, nil)
		return code == 404
	})
}

// quotaBody decodes a 429's structured error.
type quotaBody struct {
	Error struct {
		Code        session.Code `json:"code"`
		Message     string       `json:"message"`
		Quota       string       `json:"quota"`
		Limit       int          `json:"limit"`
		Scope       string       `json:"scope"`
		RetryAfterS int64        `json:"retry_after_s"`
	} `json:"error"`
}

func refused(t testing.TB, code int, body []byte, hdr http.Header, quota, scope string, limit int) quotaBody {
	t.Helper()
	var q quotaBody
	if code != http.StatusTooManyRequests || json.Unmarshal(body, &q) != nil {
		t.Fatalf("want 429, got %d %s", code, body)
	}
	e := q.Error
	if e.Code != session.CodeTooManyRequests || e.Message == "" || e.Quota != quota || e.Scope != scope || e.Limit != limit || e.RetryAfterS < 1 {
		t.Fatalf("429 body %s: want quota %s, scope %s, limit %d", body, quota, scope, limit)
	}
	if ra := hdr.Get("Retry-After"); ra != strconv.FormatInt(e.RetryAfterS, 10) {
		t.Fatalf("Retry-After %q, body says %d", ra, e.RetryAfterS)
	}
	return q
}

// The caps on invokes at once per session and per tenant hold across
// gateways, and a finished invoke gives its slot back.
func TestInvoke_Caps(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.Quotas = gateway.Quotas{InvokesPerSession: 2, InvokesPerTenant: 3, RetryAfter: 7 * time.Second}
	})
	_, other, _ := startGateway(t, e.ns, func(c *gateway.Config) {
		c.Quotas = gateway.Quotas{InvokesPerSession: 2, InvokesPerTenant: 3, RetryAfter: 7 * time.Second}
	})
	s1, s2, s3 := e.create("alice", "1"), e.create("alice", "2"), e.create("bob", "3")
	// The fake node never runs turns: these invokes stay open.
	first := mustInvoke(t, e.srv.URL, s1.ID, "alice", "a")
	mustInvoke(t, other.URL, s1.ID, "alice", "b")
	_, code, body, hdr := startInvoke(t, e.srv.URL, s1.ID, "alice", "c")
	if q := refused(t, code, body, hdr, "invokes", "session", 2); q.Error.RetryAfterS != 7 {
		t.Fatalf("retry after %d, want the configured 7", q.Error.RetryAfterS)
	}
	mustInvoke(t, other.URL, s2.ID, "alice", "d")
	// Every dev user is in the same (empty) tenant.
	_, code, body, hdr = startInvoke(t, other.URL, s3.ID, "bob", "e")
	refused(t, code, body, hdr, "invokes", "tenant", 3)
	// A refused invoke sent nothing.
	for _, id := range []session.ID{s1.ID, s3.ID} {
		for _, raw := range e.node.Events(id) {
			if strings.Contains(string(raw), `"text":"c"`) || strings.Contains(string(raw), `"text":"e"`) {
				t.Fatalf("a refused invoke prompted the session: %s", raw)
			}
		}
	}
	// Closing one frees its slot (and cancels its prompt's turn).
	first.close()
	eventually(t, "the closed invoke's slot to be free", func() bool {
		st, code, body, _ := startInvoke(t, other.URL, s3.ID, "bob", "f")
		if st != nil {
			return true
		}
		if code != http.StatusTooManyRequests {
			t.Fatalf("invoke: %d %s", code, body)
		}
		return false
	})
	if !cancelledPrompt(e.node, 2) {
		t.Fatal("closing the invoke did not cancel its prompt's turn (OpCancel with prompt_seq 2)")
	}
}

// cancelledPrompt reports whether the node got an OpCancel for the prompt
// at seq.
func cancelledPrompt(n *fakeNode, seq session.Seq) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.cmds {
		if c.Op == session.OpCancel && c.PromptSeq == seq {
			return true
		}
	}
	return false
}

// clock is a settable time for the turns window.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Turns per hour count invokes and REST prompts of the whole tenant, on
// every gateway.
func TestInvoke_TurnsPerHour(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)}
	tune := func(cfg *gateway.Config) { cfg.Quotas = gateway.Quotas{TurnsPerHour: 3, Now: c.now} }
	e := newEnv(t, tune)
	_, other, _ := startGateway(t, e.ns, tune)
	s1, s2 := e.create("alice", "1"), e.create("bob", "2")
	msgs := "/v1/sessions/" + string(s1.ID) + "/messages"
	if code, body := e.call("POST", msgs, "alice", map[string]string{"text": "one"}); code != 202 {
		t.Fatalf("message: %d %s", code, body)
	}
	c.add(20 * time.Minute)
	mustInvoke(t, other.URL, s2.ID, "bob", "two")
	c.add(20 * time.Minute)
	if code, body := callURL(t, other.URL, "POST", msgs, "alice", map[string]string{"text": "three"}, nil); code != 202 {
		t.Fatalf("message: %d %s", code, body)
	}
	c.add(10 * time.Minute)
	_, code, body, hdr := startInvoke(t, e.srv.URL, s1.ID, "alice", "four")
	if q := refused(t, code, body, hdr, "turns", "tenant", 3); q.Error.RetryAfterS != 600 {
		t.Fatalf("retry after %ds, want 600 (until the first turn is an hour old)", q.Error.RetryAfterS)
	}
	code, body = e.call("POST", msgs, "alice", map[string]string{"text": "four"})
	refused(t, code, body, http.Header{"Retry-After": {"600"}}, "turns", "tenant", 3)
	// The first turn leaves the window an hour after it.
	c.add(10 * time.Minute)
	if code, body := e.call("POST", msgs, "alice", map[string]string{"text": "five"}); code != 202 {
		t.Fatalf("message an hour later: %d %s", code, body)
	}
}

// A prompt that would wake a sandbox is refused while the tenant has its
// quota of awake sandboxes; one to a session whose sandbox is awake is not.
func TestInvoke_SandboxQuota(t *testing.T) {
	e := newEnv(t, func(cfg *gateway.Config) { cfg.Quotas = gateway.Quotas{SandboxesPerTenant: 1} })
	awake, asleep := e.create("alice", "awake"), e.create("alice", "asleep")
	// The node records the sandbox's state in the catalog.
	ctx := context.Background()
	entry, err := e.node.kv.Get(ctx, string(awake.ID))
	if err != nil {
		t.Fatal(err)
	}
	var ce session.CatalogEntry
	if err := json.Unmarshal(entry.Value(), &ce); err != nil {
		t.Fatal(err)
	}
	ce.Sandbox = session.SandboxReady
	b, _ := json.Marshal(ce)
	if _, err := e.node.kv.Put(ctx, string(awake.ID), b); err != nil {
		t.Fatal(err)
	}
	path := func(id session.ID) string { return "/v1/sessions/" + string(id) + "/messages" }
	eventually(t, "the gateway to see the awake sandbox", func() bool {
		code, _ := e.call("POST", path(asleep.ID), "alice", map[string]string{"text": "x"})
		return code == http.StatusTooManyRequests
	})
	_, code, body, hdr := startInvoke(t, e.srv.URL, asleep.ID, "alice", "y")
	if q := refused(t, code, body, hdr, "sandboxes", "tenant", 1); q.Error.RetryAfterS != int64(gateway.DefaultSandboxRetryAfter/time.Second) {
		t.Fatalf("retry after %d", q.Error.RetryAfterS)
	}
	if code, body := e.call("POST", path(awake.ID), "alice", map[string]string{"text": "z"}); code != 202 {
		t.Fatalf("a prompt to the awake sandbox: %d %s", code, body)
	}
}

// An invoke follows its own prompt's turn and nothing else of the session,
// in the order the session logged it.
func TestInvoke_FollowsOnlyItsTurn(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "x")
	if code, body := e.call("POST", "/v1/sessions/"+string(s.ID)+"/messages", "alice", map[string]string{"text": "before"}); code != 202 {
		t.Fatalf("message: %d %s", code, body)
	}
	st := mustInvoke(t, e.srv.URL, s.ID, "alice", "mine") // seq 3
	id := s.ID
	e.node.Append(id, session.KindTurnStarted, session.TurnStartedData{Turn: 1, PromptSeq: 2})
	e.node.Append(id, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "not mine\n"})
	e.node.Append(id, session.KindTurnFinished, session.TurnFinishedData{Turn: 1, Status: session.TurnOK})
	e.node.Append(id, session.KindTurnStarted, session.TurnStartedData{Turn: 2, PromptSeq: 3})
	e.node.Append(id, session.KindOutput, session.OutputData{Turn: 2, Stream: "stdout", Text: "mine\n"})
	e.node.Append(id, session.KindMemberChanged, session.MemberChangedData{User: "bob", Role: session.RoleViewer})
	e.node.Append(id, session.KindError, session.ErrorData{Code: session.CodeBadRequest, Message: "bad harness"})
	e.node.Append(id, session.KindOutput, session.OutputData{Turn: 2, Stream: "stderr", Text: "oops\n"})
	e.node.Append(id, session.KindTurnFinished, session.TurnFinishedData{Turn: 2, Status: session.TurnFailed, ExitCode: 3, DurationMS: 12})
	e.node.Append(id, session.KindOutput, session.OutputData{Turn: 3, Stream: "stdout", Text: "after\n"})
	var got []string
	for _, ev := range st.untilExit() {
		got = append(got, ev.name+" "+string(ev.data))
	}
	want := []string{
		`start {"invoke_id":"` + st.id + `","session":"` + string(id) + `","seq":3,"turn":2}`,
		`stdout {"text":"mine\n"}`,
		`error {"code":"bad_request","message":"bad harness"}`,
		`stderr {"text":"oops\n"}`,
		`exit {"exit_code":3,"status":"failed","duration_ms":12}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if cancelledPrompt(e.node, 3) {
		t.Fatal("a finished invoke cancelled its turn")
	}
}

// A gateway that shuts down ends its invokes with an error event and
// cancels their turns.
func TestInvoke_GatewayClose(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "x")
	st := mustInvoke(t, e.srv.URL, s.ID, "alice", "long") // seq 2
	e.node.Append(s.ID, session.KindTurnStarted, session.TurnStartedData{Turn: 1, PromptSeq: 2})
	if ev := st.next(); ev.name != "start" {
		t.Fatalf("first event %s", ev.name)
	}
	closed := make(chan error, 1)
	go func() { // owned: the test waits on closed.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		closed <- e.gw.Close(ctx)
	}()
	ev := st.next()
	var d session.Error
	if ev.name != "error" || json.Unmarshal(ev.data, &d) != nil || d.Code != session.CodeUnavailable || d.Message == "" {
		t.Fatalf("want an unavailable error event, got %s %s", ev.name, ev.data)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if !cancelledPrompt(e.node, 2) {
		t.Fatal("the gateway's shutdown did not cancel the invoke's turn")
	}
}
