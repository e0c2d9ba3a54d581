package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server v2.15's addStream does not check for shutdown: a
		// bucket or stream request a test's client sent just before the
		// test ended can be served after Shutdown stopped the existing
		// streams, and that stream's file store (with the access-time ticker
		// it registers) is never stopped. Seen once in fresh-clone CI; it is
		// the embedded server's goroutine, not one of ours.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}

func TestGateway_Auth(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "auth")

	t.Run("no credentials", func(t *testing.T) {
		code, body := e.call("GET", "/v1/sessions", "", nil)
		if code != http.StatusUnauthorized || errCode(t, body) != session.CodeUnauthenticated {
			t.Fatalf("got %d %s", code, body)
		}
	})
	t.Run("invalid token", func(t *testing.T) {
		code, body := callURL(t, e.srv.URL, "GET", "/v1/sessions", "", nil, http.Header{"Authorization": {"Bearer not-a-dev-token"}})
		if code != http.StatusUnauthorized || errCode(t, body) != session.CodeUnauthenticated {
			t.Fatalf("got %d %s", code, body)
		}
	})
	t.Run("invalid dev user", func(t *testing.T) {
		code, body := callURL(t, e.srv.URL, "GET", "/v1/sessions", "", nil, http.Header{"Authorization": {"Bearer dev: spaced "}})
		if code != http.StatusUnauthorized || errCode(t, body) != session.CodeUnauthenticated {
			t.Fatalf("got %d %s", code, body)
		}
	})
	t.Run("non-loopback dev auth", func(t *testing.T) {
		req := httptest.NewRequest("GET", "/v1/sessions/"+string(s.ID), nil)
		req.Host = "127.0.0.1:7080" // a loopback name: the dev gateway's Host check passes
		req.RemoteAddr = "192.0.2.7:40000"
		req.Header.Set("Authorization", "Bearer dev:alice")
		rec := httptest.NewRecorder()
		e.gw.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || errCode(t, rec.Body.Bytes()) != session.CodeUnauthenticated {
			t.Fatalf("got %d %s", rec.Code, rec.Body)
		}
		if !strings.Contains(rec.Body.String(), "loopback") {
			t.Errorf("message does not say dev auth is loopback-only: %s", rec.Body)
		}
	})
	t.Run("every API route needs credentials", func(t *testing.T) {
		for _, r := range []struct{ method, path string }{
			{"POST", "/v1/sessions"}, {"GET", "/v1/sessions/" + string(s.ID)}, {"DELETE", "/v1/sessions/" + string(s.ID)},
			{"POST", "/v1/sessions/" + string(s.ID) + "/messages"}, {"POST", "/v1/sessions/" + string(s.ID) + "/cancel"},
			{"POST", "/v1/sessions/" + string(s.ID) + "/approvals/a1"}, {"PUT", "/v1/sessions/" + string(s.ID) + "/members/bob"},
			{"GET", "/v1/sessions/" + string(s.ID) + "/events"}, {"GET", "/v1/sessions/" + string(s.ID) + "/ws"},
			{"GET", "/v1/nope"},
		} {
			if code, body := e.call(r.method, r.path, "", nil); code != http.StatusUnauthorized {
				t.Errorf("%s %s: got %d %s", r.method, r.path, code, body)
			}
		}
	})
	t.Run("open routes", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz", "/metrics", "/"} {
			if code, body := e.call("GET", path, "", nil); code != http.StatusOK {
				t.Errorf("GET %s: %d %s", path, code, body)
			}
		}
	})
	t.Run("browser login cookie", func(t *testing.T) {
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Get(e.srv.URL + "/auth/dev?user=alice")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
			t.Fatalf("login: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
		}
		cookies := resp.Cookies()
		if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteLaxMode {
			t.Fatalf("cookie %+v", cookies)
		}
		req, _ := http.NewRequest("GET", e.srv.URL+"/v1/sessions/"+string(s.ID), nil)
		req.AddCookie(cookies[0])
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("with cookie: %d", resp.StatusCode)
		}
	})
	t.Run("security headers", func(t *testing.T) {
		resp, err := http.Get(e.srv.URL + "/v1/sessions")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for _, h := range []string{"X-Content-Type-Options", "X-Frame-Options", "Content-Security-Policy", "Referrer-Policy"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("missing %s", h)
			}
		}
	})
	t.Run("cross-origin POST refused", func(t *testing.T) {
		code, body := callURL(t, e.srv.URL, "POST", "/v1/sessions/"+string(s.ID)+"/messages", "alice",
			map[string]string{"text": "hi"}, http.Header{"Origin": {"http://evil.example"}})
		if code != http.StatusForbidden || errCode(t, body) != session.CodeForbidden {
			t.Fatalf("got %d %s", code, body)
		}
	})
}

func TestGateway_REST(t *testing.T) {
	e := newEnv(t)
	a := e.create("alice", "first")
	b := e.create("alice", "second")
	path := "/v1/sessions/" + string(a.ID)

	t.Run("create", func(t *testing.T) {
		if a.Role != session.RoleOwner || a.Owner != "alice" || a.Title != "first" || a.State != session.StateActive ||
			a.LastSeq != 1 || a.Epoch == "" || a.ID.Validate() != nil {
			t.Fatalf("session %+v", a)
		}
	})
	t.Run("create bad input", func(t *testing.T) {
		for name, c := range map[string]struct {
			body string
			code int
			want session.Code
		}{
			"malformed":     {`{"title":`, 400, session.CodeBadRequest},
			"unknown field": {`{"title":"x","colour":"red"}`, 400, session.CodeBadRequest},
			"trailing data": {`{"title":"x"} {}`, 400, session.CodeBadRequest},
			"not an object": {`[1]`, 400, session.CodeBadRequest},
			"long title":    {`{"title":"` + strings.Repeat("t", session.MaxTitleBytes+1) + `"}`, 400, session.CodeBadRequest},
			"bad harness":   {`{"harness":{"command":[]}}`, 400, session.CodeBadRequest},
			"too large":     {`{"title":"` + strings.Repeat("x", session.MaxFrameBytes) + `"}`, 413, session.CodePayloadTooLarge},
		} {
			code, body := e.call("POST", "/v1/sessions", "alice", c.body)
			if code != c.code || errCode(t, body) != c.want {
				t.Errorf("%s: got %d %s", name, code, body)
			}
		}
	})
	t.Run("list", func(t *testing.T) {
		e.member(a.ID, "alice", "bob", session.RoleViewer)
		var got struct{ Sessions []session.Session }
		code, body := e.call("GET", "/v1/sessions", "bob", nil)
		if code != 200 || json.Unmarshal(body, &got) != nil {
			t.Fatalf("got %d %s", code, body)
		}
		if len(got.Sessions) != 1 || got.Sessions[0].ID != a.ID || got.Sessions[0].Role != session.RoleViewer {
			t.Fatalf("bob sees %+v", got.Sessions)
		}
		code, body = e.call("GET", "/v1/sessions", "alice", nil)
		if code != 200 || json.Unmarshal(body, &got) != nil {
			t.Fatalf("got %d %s", code, body)
		}
		if len(got.Sessions) != 2 || got.Sessions[0].ID != b.ID || got.Sessions[1].ID != a.ID || got.Sessions[0].Role != session.RoleOwner {
			t.Fatalf("alice sees %+v, want newest first", got.Sessions)
		}
		code, body = e.call("GET", "/v1/sessions", "carol", nil)
		if code != 200 || string(body) != "{\"sessions\":[]}\n" {
			t.Fatalf("carol: %d %s", code, body)
		}
	})
	t.Run("get", func(t *testing.T) {
		var got session.Session
		code, body := e.call("GET", path, "bob", nil)
		if code != 200 || json.Unmarshal(body, &got) != nil || got.ID != a.ID || got.Role != session.RoleViewer || got.State != session.StateActive {
			t.Fatalf("got %d %s", code, body)
		}
	})
	t.Run("get hibernated does not wake", func(t *testing.T) {
		e.node.Hibernate(b.ID)
		before := e.node.Activations()
		var got session.Session
		code, body := e.call("GET", "/v1/sessions/"+string(b.ID), "alice", nil)
		if code != 200 || json.Unmarshal(body, &got) != nil || got.State != session.StateHibernated || got.Role != session.RoleOwner || got.Title != "second" {
			t.Fatalf("got %d %s", code, body)
		}
		if e.node.Activations() != before || e.node.Active(b.ID) {
			t.Fatal("GET woke a hibernated session")
		}
	})
	t.Run("not found", func(t *testing.T) {
		for name, c := range map[string]struct{ user, path string }{
			"unknown id":   {"alice", "/v1/sessions/s_nope"},
			"malformed id": {"alice", "/v1/sessions/bad.id"},
			"no role":      {"carol", path},
			"no role msgs": {"carol", path + "/events"},
		} {
			code, body := e.call("GET", c.path, c.user, nil)
			if code != 404 || errCode(t, body) != session.CodeNotFound {
				t.Errorf("%s: got %d %s", name, code, body)
			}
		}
	})
	t.Run("messages", func(t *testing.T) {
		code, body := e.call("POST", path+"/messages", "alice", map[string]string{"text": "hello", "client_id": "c1"})
		var got struct{ Seq session.Seq }
		if code != 202 || json.Unmarshal(body, &got) != nil || got.Seq < 2 {
			t.Fatalf("got %d %s", code, body)
		}
		evs := e.node.Events(a.ID)
		if seqOf(t, evs[got.Seq-1]) != got.Seq || !strings.Contains(string(evs[got.Seq-1]), `"client_id":"c1"`) {
			t.Fatalf("event %s", evs[got.Seq-1])
		}
	})
	t.Run("messages wake a hibernated session", func(t *testing.T) {
		before := e.node.Activations()
		code, body := e.call("POST", "/v1/sessions/"+string(b.ID)+"/messages", "alice", map[string]string{"text": "wake"})
		if code != 202 {
			t.Fatalf("got %d %s", code, body)
		}
		if e.node.Activations() != before+1 || !e.node.Active(b.ID) {
			t.Fatal("session was not activated")
		}
	})
	t.Run("messages bad input", func(t *testing.T) {
		for name, c := range map[string]struct {
			user, body string
			code       int
			want       session.Code
		}{
			"viewer":         {"bob", `{"text":"hi"}`, 403, session.CodeForbidden},
			"stranger":       {"carol", `{"text":"hi"}`, 404, session.CodeNotFound},
			"empty text":     {"alice", `{"text":""}`, 400, session.CodeBadRequest},
			"no body":        {"alice", ``, 400, session.CodeBadRequest},
			"unknown field":  {"alice", `{"text":"hi","x":1}`, 400, session.CodeBadRequest},
			"long client_id": {"alice", `{"text":"hi","client_id":"` + strings.Repeat("c", 200) + `"}`, 400, session.CodeBadRequest},
			"long text":      {"alice", `{"text":"` + strings.Repeat("t", session.MaxTextBytes+1) + `"}`, 413, session.CodePayloadTooLarge},
		} {
			code, body := e.call("POST", path+"/messages", c.user, c.body)
			if code != c.code || errCode(t, body) != c.want {
				t.Errorf("%s: got %d %s", name, code, body)
			}
		}
	})
	t.Run("cancel and approve", func(t *testing.T) {
		if code, body := e.call("POST", path+"/cancel", "alice", nil); code != 202 {
			t.Fatalf("cancel: %d %s", code, body)
		}
		if code, body := e.call("POST", path+"/approvals/a1", "alice", `{"allow":true}`); code != 202 {
			t.Fatalf("approve: %d %s", code, body)
		}
		if code, body := e.call("POST", path+"/approvals/a1", "alice", `{}`); code != 400 || errCode(t, body) != session.CodeBadRequest {
			t.Fatalf("approve without allow: %d %s", code, body)
		}
		if code, body := e.call("POST", path+"/cancel", "bob", nil); code != 403 || errCode(t, body) != session.CodeForbidden {
			t.Fatalf("viewer cancel: %d %s", code, body)
		}
	})
	t.Run("agent sessions and options", func(t *testing.T) {
		if code, body := e.call("POST", path+"/approvals/a2", "alice", `{"option_id":"allow_always_1"}`); code != 202 {
			t.Fatalf("approve with an option: %d %s", code, body)
		}
		e.node.mu.Lock()
		last := e.node.cmds[len(e.node.cmds)-1]
		e.node.mu.Unlock()
		if last.Op != session.OpApprove || last.ApprovalID != "a2" || last.OptionID != "allow_always_1" {
			t.Errorf("node got %+v", last)
		}
		for name, body := range map[string]string{
			"bad agent name":     `{"agent":"no such/agent"}`,
			"two agents":         `{"agent":"claude","harness":{"agent":"codex"}}`,
			"agent and template": `{"agent":"claude","harness":"shell"}`,
		} {
			if code, got := e.call("POST", "/v1/sessions", "alice", body); code != 400 || errCode(t, got) != session.CodeBadRequest {
				t.Errorf("%s: got %d %s", name, code, got)
			}
		}
	})
	t.Run("members", func(t *testing.T) {
		if code, body := e.call("PUT", path+"/members/dave", "bob", `{"role":"driver"}`); code != 403 || errCode(t, body) != session.CodeForbidden {
			t.Fatalf("viewer manages: %d %s", code, body)
		}
		if code, body := e.call("PUT", path+"/members/dave", "alice", `{"role":"admin"}`); code != 400 || errCode(t, body) != session.CodeBadRequest {
			t.Fatalf("bad role: %d %s", code, body)
		}
		if code, body := e.call("PUT", path+"/members/dave", "alice", `{"role":"driver"}`); code != 200 || !strings.Contains(string(body), `"role":"driver"`) {
			t.Fatalf("add driver: %d %s", code, body)
		}
		if code, body := e.call("POST", path+"/messages", "dave", `{"text":"as driver"}`); code != 202 {
			t.Fatalf("driver prompt: %d %s", code, body)
		}
	})
	t.Run("events", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			e.node.Append(a.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "<b>&amp;</b>"})
		}
		all := e.node.Events(a.ID)
		var page struct {
			Events  []json.RawMessage
			LastSeq session.Seq `json:"last_seq"`
			Epoch   string
		}
		code, body := e.call("GET", path+"/events?after=2&limit=3", "bob", nil)
		if code != 200 || json.Unmarshal(body, &page) != nil {
			t.Fatalf("got %d %s", code, body)
		}
		if page.LastSeq != session.Seq(len(all)) || page.Epoch != a.Epoch || len(page.Events) != 3 {
			t.Fatalf("page %+v", page)
		}
		for i, ev := range page.Events {
			if string(ev) != string(all[2+i]) {
				t.Fatalf("event %d re-encoded:\n got %s\nwant %s", i, ev, all[2+i])
			}
		}
		code, body = e.call("GET", path+"/events", "bob", nil)
		if code != 200 || json.Unmarshal(body, &page) != nil || len(page.Events) != len(all) {
			t.Fatalf("default: %d %s", code, body)
		}
		for name, q := range map[string]string{
			"after beyond": "?after=999", "negative after": "?after=-1", "bad after": "?after=x",
			"zero limit": "?limit=0", "big limit": "?limit=1001", "bad limit": "?limit=ten",
		} {
			if code, body := e.call("GET", path+"/events"+q, "bob", nil); code != 400 || errCode(t, body) != session.CodeBadRequest {
				t.Errorf("%s: got %d %s", name, code, body)
			}
		}
	})
	t.Run("delete", func(t *testing.T) {
		if code, body := e.call("DELETE", path, "bob", nil); code != 403 {
			t.Fatalf("viewer delete: %d %s", code, body)
		}
		if code, body := e.call("DELETE", path, "alice", nil); code != 204 {
			t.Fatalf("delete: %d %s", code, body)
		}
		if code, body := e.call("GET", path, "alice", nil); code != 404 || errCode(t, body) != session.CodeNotFound {
			t.Fatalf("after delete: %d %s", code, body)
		}
	})
	t.Run("unknown route", func(t *testing.T) {
		if code, body := e.call("GET", "/v1/nothing", "alice", nil); code != 404 || errCode(t, body) != session.CodeNotFound {
			t.Fatalf("got %d %s", code, body)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		code, body := e.call("GET", "/metrics", "", nil)
		if code != 200 || !strings.Contains(string(body), `atrium_gateway_http_requests_total{code="202",route="POST /v1/sessions/{id}/messages"}`) {
			t.Fatalf("metrics: %d %s", code, body)
		}
	})
}

func TestGateway_NoNode(t *testing.T) {
	ns := startNATS(t)
	var nc *nats.Conn
	_, srv, _ := startGateway(t, ns, func(c *gateway.Config) { nc = c.NATS })
	code, body := callURL(t, srv.URL, "POST", "/v1/sessions", "alice", `{}`, nil)
	if code != http.StatusServiceUnavailable || errCode(t, body) != session.CodeUnavailable {
		t.Fatalf("create with no node: %d %s", code, body)
	}
	code, body = callURL(t, srv.URL, "GET", "/v1/sessions", "alice", nil, nil)
	if code != 200 || string(body) != "{\"sessions\":[]}\n" {
		t.Fatalf("list with an empty catalog: %d %s", code, body)
	}
	nc.Close()
	code, body = callURL(t, srv.URL, "GET", "/readyz", "", nil, nil)
	if code != http.StatusServiceUnavailable || errCode(t, body) != session.CodeUnavailable {
		t.Fatalf("readyz without NATS: %d %s", code, body)
	}
	if code, _ := callURL(t, srv.URL, "GET", "/healthz", "", nil, nil); code != 200 {
		t.Fatalf("healthz without NATS: %d", code)
	}
}
