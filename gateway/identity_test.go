package gateway_test

// Tests of identities, API tokens, tenants, roles and the audit log through
// the gateway, with the fake node (which decides roles with session.RoleFor,
// as the real one does).

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// testCookie is the login cookie of identities: its value is "<user>@<tenant>".
const testCookie = "atrium_test_login"

// identities is a test Authenticator standing in for an OIDC provider:
// "Authorization: Bearer id:<user>@<tenant>[+admin]" is that user of that
// tenant (a tenant admin with "+admin"), via "oidc"; the testCookie is the
// same via "cookie". Anything else has no credentials of its kind.
type identities struct{}

func (identities) Authenticate(r *http.Request) (session.Principal, error) {
	var spec, via string
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer id:") {
		spec, via = strings.TrimPrefix(h, "Bearer id:"), session.ViaOIDC
	} else if c, err := r.Cookie(testCookie); err == nil {
		spec, via = c.Value, session.ViaCookie
	} else {
		return session.Principal{}, auth.ErrNoCredentials
	}
	spec, admin := strings.CutSuffix(spec, "+admin")
	user, tenant, ok := strings.Cut(spec, "@")
	if !ok || session.ValidUser(user) != nil {
		return session.Principal{}, session.Errorf(session.CodeUnauthenticated, "bad test identity %q", spec)
	}
	return session.Principal{User: user, Tenant: tenant, Admin: admin, Via: via}, nil
}

// cred is the value of an Authorization header.
type cred string

func as(user, tenant string) cred    { return cred("Bearer id:" + user + "@" + tenant) }
func admin(user, tenant string) cred { return cred("Bearer id:" + user + "@" + tenant + "+admin") }
func token(tok string) cred          { return cred("Bearer " + tok) }

// newIDEnv is an env whose gateway knows identities (and still the dev
// identity, for the shared helpers).
func newIDEnv(t testing.TB, tune ...func(*gateway.Config)) *env {
	t.Helper()
	return newEnv(t, append([]func(*gateway.Config){func(c *gateway.Config) {
		c.Auth = auth.Chain(identities{}, &auth.Dev{})
	}}, tune...)...)
}

// req makes a REST request with credentials c and extra headers.
func (e *env) req(method, path string, c cred, body any, hdr ...string) (int, []byte) {
	e.t.Helper()
	h := http.Header{}
	if c != "" {
		h.Set("Authorization", string(c))
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		h.Set(hdr[i], hdr[i+1])
	}
	return callURL(e.t, e.srv.URL, method, path, "", body, h)
}

// must makes a request that must answer want, and decodes the body into v.
func (e *env) must(want int, method, path string, c cred, body, v any) {
	e.t.Helper()
	code, b := e.req(method, path, c, body)
	if code != want {
		e.t.Fatalf("%s %s: got %d %s, want %d", method, path, code, b, want)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			e.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}

// sessionOf creates a session as owner c, with members given as user→role.
func (e *env) sessionOf(c cred, members map[string]session.Role) session.ID {
	e.t.Helper()
	var s session.Session
	e.must(201, "POST", "/v1/sessions", c, map[string]string{"title": "shared"}, &s)
	for user, role := range members {
		e.must(200, "PUT", "/v1/sessions/"+string(s.ID)+"/members/"+user, c, map[string]string{"role": string(role)}, nil)
	}
	return s.ID
}

// mintToken creates an API token as c, capped at role.
func (e *env) mintToken(c cred, name string, role session.Role) string {
	e.t.Helper()
	var got struct {
		Token string
		Info  auth.TokenInfo
	}
	e.must(201, "POST", "/v1/tokens", c, map[string]string{"name": name, "role": string(role)}, &got)
	return got.Token
}

// dialAs opens a WebSocket with credentials c; the status code when refused.
func (e *env) dialAs(id session.ID, c cred, after session.Seq) (*wsClient, int) {
	e.t.Helper()
	conn, resp, err := dialRaw(e.t, e.srv.URL, id, "", after, http.Header{"Authorization": {string(c)}})
	if err != nil {
		if resp == nil {
			e.t.Fatalf("dial: %v", err)
		}
		return nil, resp.StatusCode
	}
	return readWS(e.t, conn), http.StatusSwitchingProtocols
}

// sseStatus opens an SSE stream with credentials c and returns its status.
func (e *env) sseStatus(id session.ID, c cred) int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/sessions/"+string(id)+"/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", string(c))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("sse: %v", err)
	}
	code := resp.StatusCode
	cancel()
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return code
}

// auditOf reads tenant's audit log as admin c with query q, every page.
func (e *env) auditOf(c cred, q string) []audit.Entry {
	e.t.Helper()
	var out []audit.Entry
	cursor := ""
	for range 100 {
		var page struct {
			Entries []audit.Entry
			Next    string
		}
		e.must(200, "GET", "/v1/audit?"+q+"&cursor="+url.QueryEscape(cursor), c, nil, &page)
		out = append(out, page.Entries...)
		if page.Next == "" {
			return out
		}
		cursor = page.Next
	}
	e.t.Fatal("audit cursors never end")
	return nil
}

// findAudit waits for an entry of tenant's log that pred accepts.
func (e *env) findAudit(c cred, q string, pred func(audit.Entry) bool) audit.Entry {
	e.t.Helper()
	var found audit.Entry
	eventually(e.t, "audit entry for "+q, func() bool {
		for _, en := range e.auditOf(c, q) {
			if pred(en) {
				found = en
				return true
			}
		}
		return false
	})
	return found
}

func TestIdentity_Whoami(t *testing.T) {
	e := newIDEnv(t)
	var who map[string]any
	e.must(200, "GET", "/v1/whoami", admin("ada", "acme"), nil, &who)
	if who["user"] != "ada" || who["tenant"] != "acme" || who["admin"] != true || who["via"] != "oidc" || who["expires_at"] != nil {
		t.Fatalf("whoami %v", who)
	}
	e.must(200, "GET", "/v1/whoami", "Bearer dev:dave", nil, &who)
	if who["user"] != "dave" || who["tenant"] != "" || who["admin"] != false || who["via"] != "dev" {
		t.Fatalf("dev whoami %v", who)
	}

	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	var created struct {
		Token string
		Info  auth.TokenInfo
	}
	e.must(201, "POST", "/v1/tokens", as("alice", "acme"),
		map[string]string{"name": "bot", "expires_at": exp.Format(time.RFC3339), "role": "viewer"}, &created)
	e.must(200, "GET", "/v1/whoami", token(created.Token), nil, &who)
	if who["user"] != "alice" || who["tenant"] != "acme" || who["via"] != "token" || who["expires_at"] != exp.Format(time.RFC3339) {
		t.Fatalf("token whoami %v", who)
	}

	t.Run("challenges", func(t *testing.T) {
		for name, c := range map[string]struct {
			auth, want string
		}{
			"no credentials": {"", `Bearer realm="atrium"`},
			"unknown token": {"Bearer atr_" + strings.Repeat("a", 16) + "_" + strings.Repeat("b", 52),
				`Bearer realm="atrium", error="invalid_token", error_description="invalid token: unknown or revoked API token"`},
			"malformed token": {"Bearer atr_nope", `error="invalid_token", error_description="invalid token: a malformed API token`},
		} {
			t.Run(name, func(t *testing.T) {
				req, _ := http.NewRequest("GET", e.srv.URL+"/v1/whoami", nil)
				if c.auth != "" {
					req.Header.Set("Authorization", c.auth)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 401 || errCode(t, b) != session.CodeUnauthenticated {
					t.Fatalf("got %d %s", resp.StatusCode, b)
				}
				if h := resp.Header.Get("WWW-Authenticate"); !strings.Contains(h, c.want) || !strings.HasPrefix(h, `Bearer realm="atrium"`) {
					t.Fatalf("WWW-Authenticate %q, want %q", h, c.want)
				}
			})
		}
	})
}

func TestIdentity_Tokens(t *testing.T) {
	e := newIDEnv(t)
	alice, bob, ada := as("alice", "acme"), as("bob", "acme"), admin("ada", "acme")

	var created struct {
		Token string
		Info  auth.TokenInfo
	}
	e.must(201, "POST", "/v1/tokens", alice, map[string]string{"name": "ci", "role": "driver"}, &created)
	if !strings.HasPrefix(created.Token, "atr_"+created.Info.ID+"_") || created.Info.Name != "ci" ||
		created.Info.User != "alice" || created.Info.Tenant != "acme" || created.Info.Role != session.RoleDriver {
		t.Fatalf("created %+v", created)
	}
	tok := token(created.Token)
	bobTok := token(e.mintToken(bob, "bob's", ""))

	t.Run("used as a bearer", func(t *testing.T) {
		var who map[string]any
		e.must(200, "GET", "/v1/whoami", tok, nil, &who)
		if who["user"] != "alice" || who["via"] != "token" {
			t.Fatalf("whoami %v", who)
		}
	})
	t.Run("tokens cannot create tokens", func(t *testing.T) {
		code, body := e.req("POST", "/v1/tokens", tok, map[string]string{"name": "child"})
		if code != 403 || !strings.Contains(string(body), "API tokens cannot create tokens: log in") {
			t.Fatalf("got %d %s", code, body)
		}
		if code, body := e.req("DELETE", "/v1/tokens/"+created.Info.ID, tok, nil); code != 403 {
			t.Fatalf("token revoking: %d %s", code, body)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		for name, body := range map[string]any{
			"no name":      map[string]string{},
			"bad expiry":   map[string]string{"name": "x", "expires_at": "tomorrow"},
			"past expiry":  map[string]string{"name": "x", "expires_at": "2001-01-01T00:00:00Z"},
			"bad role":     map[string]string{"name": "x", "role": "god"},
			"extra field":  map[string]string{"name": "x", "scope": "all"},
			"not json":     "nope",
			"empty body":   "",
			"name too big": map[string]string{"name": strings.Repeat("n", 200)},
		} {
			if code, b := e.req("POST", "/v1/tokens", alice, body); code != 400 {
				t.Errorf("%s: %d %s", name, code, b)
			}
		}
	})
	t.Run("list", func(t *testing.T) {
		var got struct{ Tokens []auth.TokenInfo }
		e.must(200, "GET", "/v1/tokens", alice, nil, &got)
		if len(got.Tokens) != 1 || got.Tokens[0].ID != created.Info.ID {
			t.Fatalf("alice lists %+v", got.Tokens)
		}
		e.must(200, "GET", "/v1/tokens", tok, nil, &got) // tokens may list
		if len(got.Tokens) != 1 {
			t.Fatalf("alice's token lists %+v", got.Tokens)
		}
		if code, b := e.req("GET", "/v1/tokens?all=1", alice, nil); code != 403 {
			t.Fatalf("non-admin all: %d %s", code, b)
		}
		e.must(200, "GET", "/v1/tokens?all=1", ada, nil, &got)
		if len(got.Tokens) != 2 {
			t.Fatalf("admin lists %+v", got.Tokens)
		}
		e.must(200, "GET", "/v1/tokens?all=1", admin("gil", "globex"), nil, &got)
		if len(got.Tokens) != 0 {
			t.Fatalf("other tenant's admin lists %+v", got.Tokens)
		}
		if code, _ := e.req("GET", "/v1/tokens?all=maybe", ada, nil); code != 400 {
			t.Fatalf("bad all: %d", code)
		}
	})
	t.Run("revoke", func(t *testing.T) {
		if code, b := e.req("DELETE", "/v1/tokens/"+created.Info.ID, bob, nil); code != 404 {
			t.Fatalf("bob revoking alice's: %d %s", code, b)
		}
		if code, b := e.req("DELETE", "/v1/tokens/nope", alice, nil); code != 404 {
			t.Fatalf("unknown: %d %s", code, b)
		}
		e.must(204, "DELETE", "/v1/tokens/"+created.Info.ID, alice, nil, nil)
		code, b := e.req("GET", "/v1/whoami", tok, nil)
		if code != 401 || !strings.Contains(string(b), "unknown or revoked") {
			t.Fatalf("revoked token: %d %s", code, b)
		}
		var bobs struct{ Tokens []auth.TokenInfo }
		e.must(200, "GET", "/v1/tokens", bob, nil, &bobs)
		e.must(204, "DELETE", "/v1/tokens/"+bobs.Tokens[0].ID, ada, nil, nil) // admins revoke any in the tenant
		if code, _ := e.req("GET", "/v1/whoami", bobTok, nil); code != 401 {
			t.Fatalf("bob's token after the admin revoked it: %d", code)
		}
	})
	t.Run("audited", func(t *testing.T) {
		for _, c := range []struct{ action, actor, target string }{
			{audit.ActTokenCreated, "alice", created.Info.ID},
			{audit.ActTokenRevoked, "alice", created.Info.ID},
			{audit.ActTokenRevoked, "ada", ""},
			{audit.ActDenied, "alice", ""},
		} {
			en := e.findAudit(ada, "action="+c.action+"&actor="+c.actor, func(en audit.Entry) bool {
				return c.target == "" || en.Target == c.target
			})
			if en.Tenant != "acme" || en.Remote != "127.0.0.1" || en.Time.IsZero() || en.ID == "" {
				t.Errorf("entry %+v", en)
			}
			if strings.Contains(en.Detail, strings.TrimPrefix(created.Token, "atr_"+created.Info.ID)) {
				t.Errorf("entry holds the secret: %+v", en)
			}
		}
		en := e.findAudit(ada, "action=token_revoked&actor=ada", func(audit.Entry) bool { return true })
		if !strings.Contains(en.Detail, "of bob") || en.Via != "oidc" {
			t.Errorf("admin revocation entry %+v", en)
		}
	})
}

// TestIdentity_Roles checks every REST route, the SSE stream, the WebSocket
// and its command frames for every kind of caller.
func TestIdentity_Roles(t *testing.T) {
	e := newIDEnv(t)
	owner := as("olive", "acme")
	danTok := e.mintToken(as("dan", "acme"), "dan viewer", session.RoleViewer)
	oliveTok := e.mintToken(owner, "olive driver", session.RoleDriver)
	adaTok := e.mintToken(admin("ada", "acme"), "ada viewer", session.RoleViewer)

	for name, c := range map[string]struct {
		cred cred
		role session.Role
	}{
		"owner":                   {owner, session.RoleOwner},
		"driver":                  {as("dan", "acme"), session.RoleDriver},
		"viewer":                  {as("vic", "acme"), session.RoleViewer},
		"no role":                 {as("nina", "acme"), session.RoleNone},
		"other tenant, same name": {as("dan", "globex"), session.RoleNone},
		"no tenant, same name":    {"Bearer dev:dan", session.RoleNone},
		"tenant admin":            {admin("ada", "acme"), session.RoleOwner},
		"other tenant's admin":    {admin("gil", "globex"), session.RoleNone},
		"driver's viewer token":   {token(danTok), session.RoleViewer},
		"owner's driver token":    {token(oliveTok), session.RoleDriver},
		"admin's viewer token":    {token(adaTok), session.RoleViewer},
	} {
		t.Run(name, func(t *testing.T) {
			id := e.sessionOf(owner, map[string]session.Role{"dan": session.RoleDriver, "vic": session.RoleViewer})
			base := "/v1/sessions/" + string(id)
			want := func(need session.Role, ok int) int {
				switch {
				case !c.role.Valid():
					return 404
				case !c.role.AtLeast(need):
					return 403
				}
				return ok
			}
			for _, r := range []struct {
				method, path string
				body         any
				need         session.Role
				ok           int
			}{
				{"GET", base, nil, session.RoleViewer, 200},
				{"GET", base + "/events", nil, session.RoleViewer, 200},
				{"POST", base + "/messages", map[string]string{"text": "hi"}, session.RoleDriver, 202},
				{"POST", base + "/cancel", nil, session.RoleDriver, 202},
				{"POST", base + "/approvals/a1", map[string]bool{"allow": true}, session.RoleDriver, 202},
				{"PUT", base + "/members/zed", map[string]string{"role": "viewer"}, session.RoleOwner, 200},
				{"DELETE", base, nil, session.RoleOwner, 204},
			} {
				if r.method == "DELETE" {
					// Watch first: the rest needs the session.
					e.checkWatch(t, id, c.cred, c.role)
				}
				if code, b := e.req(r.method, r.path, c.cred, r.body); code != want(r.need, r.ok) {
					t.Errorf("%s %s: got %d %s, want %d", r.method, r.path, code, b, want(r.need, r.ok))
				}
			}
		})
	}
	t.Run("list", func(t *testing.T) {
		e := newIDEnv(t)
		id := e.sessionOf(owner, map[string]session.Role{"vic": session.RoleViewer})
		other := e.sessionOf(as("gina", "globex"), nil)
		for name, c := range map[string]struct {
			cred cred
			want session.Role
		}{
			"owner":                {owner, session.RoleOwner},
			"viewer":               {as("vic", "acme"), session.RoleViewer},
			"no role":              {as("nina", "acme"), session.RoleNone},
			"tenant admin":         {admin("ada", "acme"), session.RoleOwner},
			"other tenant's admin": {admin("gil", "globex"), session.RoleNone},
			"viewer, other tenant": {as("vic", "globex"), session.RoleNone},
		} {
			var got struct{ Sessions []session.Session }
			e.must(200, "GET", "/v1/sessions", c.cred, nil, &got)
			var role session.Role
			for _, s := range got.Sessions {
				if s.ID == other && !strings.Contains(name, "other tenant") {
					t.Errorf("%s sees globex's session", name)
				}
				if s.ID == id {
					role = s.Role
				}
			}
			if role != c.want {
				t.Errorf("%s: listed with role %q, want %q", name, role, c.want)
			}
		}
	})
}

// checkWatch checks SSE, the WebSocket and its command frames for a caller
// with role on id.
func (e *env) checkWatch(t *testing.T, id session.ID, c cred, role session.Role) {
	t.Helper()
	wantOpen := 200
	if !role.Valid() {
		wantOpen = 404
	}
	if code := e.sseStatus(id, c); code != wantOpen {
		t.Errorf("SSE: got %d, want %d", code, wantOpen)
	}
	ws, code := e.dialAs(id, c, 0)
	if !role.Valid() {
		if code != 404 {
			t.Errorf("WebSocket: got %d, want 404", code)
		}
		return
	}
	if ws == nil {
		t.Fatalf("WebSocket: got %d", code)
	}
	if h := ws.nextOf(session.FrameHello); h["you"].(map[string]any)["role"] != string(role) {
		t.Errorf("hello says role %v, want %s", h["you"], role)
	}
	ws.send(map[string]any{"type": "cancel"})
	ws.send(map[string]any{"type": "approve", "id": "a1", "allow": true})
	ws.send(map[string]string{"type": "prompt", "text": "hi", "client_id": "p1"})
	if role.AtLeast(session.RoleDriver) {
		if ack := ws.find(session.FrameAck); ack["client_id"] != "p1" {
			t.Errorf("ack %v", ack)
		}
		return
	}
	for _, cid := range []any{nil, nil, "p1"} {
		f := ws.find(session.FrameError)
		if f["code"] != string(session.CodeForbidden) || f["client_id"] != cid {
			t.Errorf("error frame %v, want forbidden for %v", f, cid)
		}
	}
}

func TestIdentity_CrossTenant(t *testing.T) {
	e := newIDEnv(t)
	owner := as("olive", "acme")
	id := e.sessionOf(owner, map[string]session.Role{"mal": session.RoleOwner})
	mal := as("mal", "globex") // the same user name, another tenant
	base := "/v1/sessions/" + string(id)
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"GET", base, nil},
		{"GET", base + "/events", nil},
		{"POST", base + "/messages", map[string]string{"text": "hi"}},
		{"POST", base + "/cancel", nil},
		{"POST", base + "/approvals/a1", map[string]bool{"allow": true}},
		{"PUT", base + "/members/mal", map[string]string{"role": "owner"}},
		{"DELETE", base, nil},
	} {
		code, b := e.req(r.method, r.path, mal, r.body)
		if code != 404 || errCode(t, b) != session.CodeNotFound {
			t.Errorf("%s %s: got %d %s", r.method, r.path, code, b)
		}
	}
	if code := e.sseStatus(id, mal); code != 404 {
		t.Errorf("SSE: %d", code)
	}
	if _, code := e.dialAs(id, mal, 0); code != 404 {
		t.Errorf("WebSocket: %d", code)
	}
	var list struct{ Sessions []session.Session }
	e.must(200, "GET", "/v1/sessions", mal, nil, &list)
	if len(list.Sessions) != 0 {
		t.Errorf("list: %+v", list.Sessions)
	}

	// Also while the session sleeps: the catalog alone must refuse.
	e.node.Hibernate(id)
	if code, b := e.req("POST", base+"/messages", mal, map[string]string{"text": "hi"}); code != 404 {
		t.Errorf("prompt while hibernated: %d %s", code, b)
	}
	if e.node.Active(id) {
		t.Error("a cross-tenant request woke the session")
	}

	// Refusals are audited as denied in the caller's tenant.
	for _, op := range []string{"info", "prompt", "member", "delete", "watch"} {
		en := e.findAudit(admin("root", "globex"), "action=denied&actor=mal&session="+string(id), func(en audit.Entry) bool {
			return strings.HasPrefix(en.Detail, op+":")
		})
		if en.Outcome != audit.Denied || !strings.Contains(en.Detail, "another tenant") {
			t.Errorf("%s: entry %+v", op, en)
		}
	}
	if got := e.auditOf(admin("ada", "acme"), "action=denied"); len(got) != 0 {
		t.Errorf("acme's log has globex's denials: %+v", got)
	}
}

func TestIdentity_MemberChangesOnOpenSockets(t *testing.T) {
	e := newIDEnv(t)
	owner := as("olive", "acme")
	id := e.sessionOf(owner, map[string]session.Role{"dan": session.RoleDriver, "ada": session.RoleViewer, "vic": session.RoleViewer})
	setRole := func(user string, role string) {
		t.Helper()
		e.must(200, "PUT", "/v1/sessions/"+string(id)+"/members/"+user, owner, map[string]string{"role": role}, nil)
	}
	dan, _ := e.dialAs(id, as("dan", "acme"), 0)
	dan.nextOf(session.FrameHello)
	adaC, _ := e.dialAs(id, admin("ada", "acme"), 0)
	if h := adaC.nextOf(session.FrameHello); h["you"].(map[string]any)["role"] != "owner" {
		t.Fatalf("admin's hello %v", h)
	}
	vicTok := e.mintToken(as("vic", "acme"), "vic", session.RoleViewer)
	vic, _ := e.dialAs(id, token(vicTok), 0)
	vic.nextOf(session.FrameHello)

	t.Run("demoted driver", func(t *testing.T) {
		dan.send(map[string]string{"type": "prompt", "text": "as driver", "client_id": "d1"})
		dan.find(session.FrameAck)
		setRole("dan", "viewer")
		dan.find(session.FrameEvent) // the member_changed event, maybe after others
		eventually(t, "demotion to reach the socket", func() bool {
			dan.send(map[string]string{"type": "prompt", "text": "as viewer", "client_id": "d2"})
			for {
				f := dan.next()
				switch f["type"] {
				case session.FrameError:
					return f["code"] == string(session.CodeForbidden) && f["client_id"] == "d2"
				case session.FrameAck:
					return false
				}
			}
		})
	})
	t.Run("capped token promoted", func(t *testing.T) {
		setRole("vic", "owner")
		vic.send(map[string]string{"type": "prompt", "text": "x", "client_id": "v1"})
		if f := vic.find(session.FrameError); f["code"] != string(session.CodeForbidden) {
			t.Fatalf("frame %v", f)
		}
	})
	t.Run("admin removed from members keeps owner rights", func(t *testing.T) {
		setRole("ada", "none")
		adaC.send(map[string]string{"type": "prompt", "text": "still here", "client_id": "a1"})
		if ack := adaC.find(session.FrameAck); ack["client_id"] != "a1" {
			t.Fatalf("ack %v", ack)
		}
	})
	t.Run("removed member disconnected", func(t *testing.T) {
		setRole("dan", "none")
		if ce := dan.closed(); ce.Code != websocket.StatusPolicyViolation || ce.Reason != "access revoked" {
			t.Fatalf("close %v", ce)
		}
	})
	t.Run("re-added member can watch from the start", func(t *testing.T) {
		setRole("dan", "viewer")
		again, code := e.dialAs(id, as("dan", "acme"), 0)
		if again == nil {
			t.Fatalf("dial: %d", code)
		}
		again.nextOf(session.FrameHello)
		last := len(e.node.Events(id))
		again.events(last) // history holds dan's removal: replaying it must not disconnect him.
		e.node.Append(id, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "live"})
		if evs := again.events(1); seqOf(t, evs[0]) != session.Seq(last+1) {
			t.Fatalf("live event %s", evs[0])
		}
	})
	t.Run("removed member's SSE ends", func(t *testing.T) {
		c := e.stream(id, "", http.Header{"Authorization": {string(as("dan", "acme"))}}, "")
		for range len(e.node.Events(id)) {
			c.next()
		}
		setRole("dan", "none")
		c.ended()
	})
}

func TestIdentity_CSRF(t *testing.T) {
	e := newIDEnv(t)
	id := e.sessionOf(as("olive", "acme"), nil)
	cookie := testCookie + "=olive@acme"
	bearer := string(as("olive", "acme"))
	for name, c := range map[string]struct {
		method string
		hdr    []string
		code   int
	}{
		"cookie, no Origin":      {"POST", []string{"Cookie", cookie}, 403},
		"cookie, foreign Origin": {"POST", []string{"Cookie", cookie, "Origin", "http://evil.example"}, 403},
		"cookie, own Origin":     {"POST", []string{"Cookie", cookie, "Origin", e.srv.URL}, 202},
		"cookie, GET, no Origin": {"GET", []string{"Cookie", cookie}, 200},
		"bearer, no Origin":      {"POST", []string{"Authorization", bearer}, 202},
		"bearer, foreign Origin": {"POST", []string{"Authorization", bearer, "Origin", "http://evil.example"}, 403},
	} {
		t.Run(name, func(t *testing.T) {
			path, body := "/v1/sessions/"+string(id)+"/messages", any(map[string]string{"text": "hi"})
			if c.method == "GET" {
				path, body = "/v1/sessions/"+string(id), nil
			}
			if code, b := e.req(c.method, path, "", body, c.hdr...); code != c.code {
				t.Fatalf("got %d %s, want %d", code, b, c.code)
			}
		})
	}
	en := e.findAudit(admin("ada", "acme"), "action=denied&actor=olive", func(en audit.Entry) bool {
		return strings.Contains(en.Detail, "Origin header")
	})
	if en.Via != "cookie" {
		t.Errorf("entry %+v", en)
	}
}

func TestIdentity_Audit(t *testing.T) {
	e := newIDEnv(t)
	owner, ada := as("olive", "acme"), admin("ada", "acme")
	id := e.sessionOf(owner, map[string]session.Role{"vic": session.RoleViewer})
	e.must(200, "PUT", "/v1/sessions/"+string(id)+"/members/vic", owner, map[string]string{"role": "driver"}, nil)
	e.req("POST", "/v1/sessions/"+string(id)+"/messages", as("nina", "acme"), map[string]string{"text": "secret prompt"})
	e.req("PUT", "/v1/sessions/"+string(id)+"/members/nina", as("vic", "acme"), map[string]string{"role": "owner"})
	e.must(202, "POST", "/v1/sessions/"+string(id)+"/messages", owner, map[string]string{"text": "secret prompt"}, nil)
	e.must(204, "DELETE", "/v1/sessions/"+string(id), ada, nil, nil)

	t.Run("admins only", func(t *testing.T) {
		for _, c := range []cred{owner, token(e.mintToken(owner, "t", ""))} {
			if code, b := e.req("GET", "/v1/audit", c, nil); code != 403 || errCode(t, b) != session.CodeForbidden {
				t.Fatalf("got %d %s", code, b)
			}
		}
		adminTok := token(e.mintToken(ada, "audit reader", session.RoleViewer))
		e.must(200, "GET", "/v1/audit", adminTok, nil, nil)
	})
	t.Run("entries", func(t *testing.T) {
		sid := string(id)
		for name, pred := range map[string]func(audit.Entry) bool{
			"created": func(en audit.Entry) bool {
				return en.Action == audit.ActSessionCreated && en.Actor == "olive" && en.Session == sid
			},
			"member added": func(en audit.Entry) bool {
				return en.Action == audit.ActMemberChanged && en.Actor == "olive" && en.Target == "vic" && en.Detail == "role viewer"
			},
			"member promoted": func(en audit.Entry) bool {
				return en.Action == audit.ActMemberChanged && en.Target == "vic" && en.Detail == "role driver"
			},
			"no role": func(en audit.Entry) bool {
				return en.Action == audit.ActDenied && en.Actor == "nina" && en.Detail == "prompt: no role on the session"
			},
			"role too low": func(en audit.Entry) bool {
				return en.Action == audit.ActDenied && en.Actor == "vic" && strings.HasPrefix(en.Detail, "member: this needs the owner role")
			},
			"deleted": func(en audit.Entry) bool {
				return en.Action == audit.ActSessionDeleted && en.Actor == "ada" && en.Session == sid
			},
			"refusal of the audit log": func(en audit.Entry) bool {
				return en.Action == audit.ActDenied && en.Actor == "olive" && strings.HasPrefix(en.Detail, "read audit log")
			},
		} {
			en := e.findAudit(ada, "", pred)
			if en.Tenant != "acme" || en.Remote != "127.0.0.1" || en.Outcome == "" {
				t.Errorf("%s: %+v", name, en)
			}
		}
		for _, en := range e.auditOf(ada, "") {
			if strings.Contains(en.Detail, "secret prompt") {
				t.Errorf("prompt text in the audit log: %+v", en)
			}
		}
	})
	t.Run("filters and paging", func(t *testing.T) {
		all := e.auditOf(ada, "")
		paged := e.auditOf(ada, "limit=1")
		if len(paged) != len(all) || len(all) < 7 {
			t.Fatalf("%d entries by pages of one, %d at once", len(paged), len(all))
		}
		for i := range all {
			if paged[i].ID != all[i].ID {
				t.Fatalf("entry %d differs when paged", i)
			}
			if i > 0 && all[i].Time.After(all[i-1].Time) {
				t.Fatalf("entries not newest first")
			}
		}
		for _, en := range e.auditOf(ada, "actor=olive&action=member_changed") {
			if en.Actor != "olive" || en.Action != audit.ActMemberChanged {
				t.Fatalf("filtered %+v", en)
			}
		}
		if got := e.auditOf(ada, "session="+string(id)); len(got) < 5 {
			t.Fatalf("session filter: %d entries", len(got))
		}
		if got := e.auditOf(ada, "since="+url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))); len(got) != 0 {
			t.Fatalf("since the future: %+v", got)
		}
		if got := e.auditOf(ada, "until=2001-01-01T00:00:00Z"); len(got) != 0 {
			t.Fatalf("until the past: %+v", got)
		}
		for _, q := range []string{"limit=0", "limit=x", "limit=1001", "since=yesterday", "until=1", "cursor=!!"} {
			if code, b := e.req("GET", "/v1/audit?"+q, ada, nil); code != 400 {
				t.Errorf("%s: %d %s", q, code, b)
			}
		}
		if got := e.auditOf(admin("gil", "globex"), ""); len(got) != 0 {
			t.Fatalf("globex's admin sees %d of acme's entries", len(got))
		}
	})
}

func TestIdentity_AuthFailures(t *testing.T) {
	var skew atomic.Int64
	throttle := &auth.Throttle{Failures: 3, Window: time.Minute, Now: func() time.Time {
		return time.Now().Add(time.Duration(skew.Load()))
	}}
	e := newIDEnv(t, func(c *gateway.Config) { c.Throttle = throttle })
	bad := "Bearer atr_" + strings.Repeat("a", 16) + "_" + strings.Repeat("b", 52)
	var retry string
	for i := range 5 {
		req, _ := http.NewRequest("GET", e.srv.URL+"/v1/sessions", nil)
		req.Header.Set("Authorization", bad)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch {
		case i < 3 && resp.StatusCode != 401:
			t.Fatalf("attempt %d: %d", i, resp.StatusCode)
		case i >= 3 && resp.StatusCode != 429:
			t.Fatalf("attempt %d: %d, want throttled", i, resp.StatusCode)
		}
		retry = resp.Header.Get("Retry-After")
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 1 || n > 60 {
		t.Fatalf("Retry-After %q", retry)
	}
	skew.Store(int64(2 * time.Minute)) // the throttle forgives 127.0.0.1, so the checks below get through.

	// Five failures from one address within 10 s: one entry, in the log of
	// no tenant.
	root := admin("root", "")
	en := e.findAudit(root, "action=auth_failed", func(audit.Entry) bool { return true })
	if en.Remote != "127.0.0.1" || en.Actor != "" || en.Outcome != audit.Failed || !strings.Contains(en.Detail, "unknown or revoked") {
		t.Fatalf("entry %+v", en)
	}
	if got := e.auditOf(root, "action=auth_failed"); len(got) != 1 {
		t.Fatalf("%d auth_failed entries for one address in 10 s: %+v", len(got), got)
	}
	if got := e.auditOf(admin("ada", "acme"), "action=auth_failed"); len(got) != 0 {
		t.Fatalf("a tenant sees auth failures: %+v", got)
	}
}

func TestIdentity_CappedTokenCannotCreate(t *testing.T) {
	e := newIDEnv(t)
	viewer := token(e.mintToken(as("olive", "acme"), "v", session.RoleViewer))
	code, b := e.req("POST", "/v1/sessions", viewer, map[string]string{"title": "x"})
	if code != 403 || !strings.Contains(string(b), "cannot create sessions") {
		t.Fatalf("got %d %s", code, b)
	}
	driver := token(e.mintToken(as("olive", "acme"), "d", session.RoleDriver))
	var s session.Session
	e.must(201, "POST", "/v1/sessions", driver, map[string]string{"title": "bot's"}, &s)
	if s.Role != session.RoleDriver || s.Owner != "olive" {
		t.Fatalf("session %+v", s)
	}
	if code, _ := e.req("DELETE", "/v1/sessions/"+string(s.ID), driver, nil); code != 403 {
		t.Fatalf("driver token deleting: %d", code)
	}
}

func TestIdentity_RevokedTokenClosesConnections(t *testing.T) {
	e := newIDEnv(t, func(c *gateway.Config) { c.TokenRecheck = 20 * time.Millisecond })
	owner := as("olive", "acme")
	id := e.sessionOf(owner, nil)
	tok := e.mintToken(owner, "watcher", "")
	kept := e.mintToken(owner, "kept", "")

	ws, code := e.dialAs(id, token(tok), 0)
	if ws == nil {
		t.Fatalf("dial: %d", code)
	}
	ws.nextOf(session.FrameHello)
	other, _ := e.dialAs(id, token(kept), 0)
	other.nextOf(session.FrameHello)
	sse := e.stream(id, "", http.Header{"Authorization": {string(token(tok))}}, "")
	sse.next()

	var list struct{ Tokens []auth.TokenInfo }
	e.must(200, "GET", "/v1/tokens", owner, nil, &list)
	for _, info := range list.Tokens {
		if info.Name == "watcher" {
			e.must(204, "DELETE", "/v1/tokens/"+info.ID, owner, nil, nil)
		}
	}
	if ce := ws.closed(); ce.Code != websocket.StatusPolicyViolation || ce.Reason != "API token revoked or expired" {
		t.Fatalf("close %v", ce)
	}
	sse.ended()
	// The connection of the other token lives on.
	other.send(map[string]string{"type": "prompt", "text": "still here", "client_id": "k1"})
	if ack := other.find(session.FrameAck); ack["client_id"] != "k1" {
		t.Fatalf("ack %v", ack)
	}
}
