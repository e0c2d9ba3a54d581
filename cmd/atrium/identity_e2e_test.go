package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/auth"
)

// orgUser is a mockoidc user whose ID token also has an "org" claim, the
// tenant claim of these tests.
type orgUser struct {
	*mockoidc.MockUser
	org string
}

func (u orgUser) Claims(scope []string, base *mockoidc.IDTokenClaims) (jwt.Claims, error) {
	c, err := u.MockUser.Claims(scope, base)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var m jwt.MapClaims
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["org"] = u.org
	return m, nil
}

func person(name, org string, groups ...string) orgUser {
	return orgUser{MockUser: &mockoidc.MockUser{Subject: "u-" + name, Email: name + "@example.com", EmailVerified: true,
		PreferredUsername: name, Groups: groups}, org: org}
}

// startOIDCServer starts the whole server (embedded NATS, node, gateway) with
// OIDC authentication against ti.
func startOIDCServer(t *testing.T, ti *testIssuer) *server.Server {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	srv, err := server.Start(context.Background(), server.Config{
		Listen:   "127.0.0.1:0",
		DataDir:  t.TempDir(),
		AuthMode: server.AuthOIDC,
		OIDC: auth.OIDCConfig{
			Issuer: ti.m.Issuer(), ClientID: ti.m.ClientID, ClientSecret: ti.m.ClientSecret,
			Scopes:      []string{"openid", "email", "profile", "groups"},
			TenantClaim: "org", GroupsClaim: "groups", AdminGroup: "atrium-admins",
			CookieKey: key, CLIClientSecret: ti.m.ClientSecret,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Close(ctx)
	})
	return srv
}

// webUser is a browser with a cookie jar, logged in through the server's
// OIDC code flow.
type webUser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func browserLogin(t *testing.T, ti *testIssuer, base string, u mockoidc.User) *webUser {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	w := &webUser{t: t, base: base, hc: &http.Client{Jar: jar, Transport: tr}}
	ti.m.QueueUser(u)
	resp, err := w.hc.Get(base + "/auth/login?next=/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.String() != base+"/" {
		t.Fatalf("login ended at %s with %s", resp.Request.URL, resp.Status)
	}
	return w
}

// do sends a request with the browser's cookies; origin "" sends none.
func (w *webUser) do(method, path, origin, body string) (int, map[string]any) {
	w.t.Helper()
	req, _ := http.NewRequest(method, w.base+path, strings.NewReader(body))
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v map[string]any
	json.Unmarshal(b, &v)
	return resp.StatusCode, v
}

func bearerGet(t *testing.T, url, token string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestIdentity_EndToEnd drives the real server with a real OIDC provider:
// a browser logs in through the code flow, the CLI through the device flow,
// a session is shared, an outsider sees nothing, an API token is used and
// revoked, the audit log has it all, and failed logins are throttled.
func TestIdentity_EndToEnd(t *testing.T) {
	ti := newTestIssuer(t, true)
	srv := startOIDCServer(t, ti)
	base := srv.URL()

	// /auth/config tells clients how to log in.
	resp, body := bearerGet(t, base+"/auth/config", "")
	if resp.StatusCode != 200 || !strings.Contains(body, `"mode":"oidc"`) || !strings.Contains(body, ti.m.Issuer()) {
		t.Fatalf("/auth/config: %s %s", resp.Status, body)
	}

	// Alice, a tenant admin of acme, logs in with her browser.
	alice := browserLogin(t, ti, base, person("alice", "acme", "atrium-admins"))
	code, who := alice.do("GET", "/v1/whoami", "", "")
	if code != 200 || who["user"] != "alice@example.com" || who["tenant"] != "acme" || who["admin"] != true || who["via"] != "cookie" {
		t.Fatalf("whoami: %d %v", code, who)
	}
	// A cookie-authenticated POST without an Origin is refused (CSRF); with
	// a foreign one too; with the server's own it works.
	if code, v := alice.do("POST", "/v1/sessions", "", `{"title":"t"}`); code != http.StatusForbidden {
		t.Fatalf("POST without Origin: %d %v", code, v)
	}
	if code, v := alice.do("POST", "/v1/sessions", "https://evil.example", `{"title":"t"}`); code != http.StatusForbidden {
		t.Fatalf("POST from a foreign Origin: %d %v", code, v)
	}
	code, sess := alice.do("POST", "/v1/sessions", base, `{"title":"shared"}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, sess)
	}
	id := sess["id"].(string)

	// Bob logs in from the CLI with the device flow.
	c, _ := newLoginCLI(t, base)
	ti.device.user = person("bob", "acme")
	bg := c.start(cliContext(t), "login", "--device", "--no-browser")
	ti.device.approve(t, bg.find(t, regexp.MustCompile(`enter the code (\S+)`)))
	if err := bg.wait(t); err != nil {
		t.Fatalf("login: %v\n%s", err, bg.errs.String())
	}
	if out := c.ok("whoami"); !strings.Contains(out, "bob@example.com") || !strings.Contains(out, "acme") {
		t.Fatalf("whoami: %s", out)
	}
	// Not a member yet: the session does not exist for bob.
	if _, errs, err := c.run(cliContext(t), nil, "logs", id); err == nil || !strings.Contains(errs+err.Error(), "not found") {
		t.Fatalf("logs before sharing: %v %s", err, errs)
	}
	// Alice shares it with bob as a viewer: he reads but cannot prompt.
	if code, v := alice.do("PUT", "/v1/sessions/"+id+"/members/bob@example.com", base, `{"role":"viewer"}`); code != 200 {
		t.Fatalf("share: %d %v", code, v)
	}
	if out := c.ok("logs", id); !strings.Contains(out, "shared") {
		t.Fatalf("logs as viewer: %s", out)
	}
	if _, errs, err := c.run(cliContext(t), nil, "send", id, "echo hi"); err == nil || !strings.Contains(errs+err.Error(), "forbidden") && !strings.Contains(errs+err.Error(), "driver") {
		t.Fatalf("viewer prompt: %v %s", err, errs)
	}

	// Carol of another tenant sees nothing: 404, not 403.
	carol := browserLogin(t, ti, base, person("carol", "globex", "atrium-admins"))
	if code, v := carol.do("GET", "/v1/sessions/"+id, "", ""); code != http.StatusNotFound {
		t.Fatalf("cross-tenant read: %d %v", code, v)
	}
	if code, v := carol.do("POST", "/v1/sessions/"+id+"/messages", base, `{"text":"hi"}`); code != http.StatusNotFound {
		t.Fatalf("cross-tenant prompt: %d %v", code, v)
	}
	if code, v := carol.do("GET", "/v1/sessions", "", ""); code != 200 || len(v["sessions"].([]any)) != 0 {
		t.Fatalf("cross-tenant list: %d %v", code, v)
	}

	// Bob makes an API token for a bot; it works as a bearer until revoked.
	tok := strings.TrimSpace(c.ok("token", "create", "--name", "ci-bot", "--expires", "1d"))
	if !strings.HasPrefix(tok, "atr_") {
		t.Fatalf("token create printed %q", tok)
	}
	resp, body = bearerGet(t, base+"/v1/sessions/"+id, tok)
	if resp.StatusCode != 200 || !strings.Contains(body, `"role":"viewer"`) {
		t.Fatalf("token read: %s %s", resp.Status, body)
	}
	c.ok("token", "revoke", tok)
	resp, body = bearerGet(t, base+"/v1/sessions/"+id, tok)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "invalid_token") {
		t.Fatalf("revoked token: %s %s %q", resp.Status, body, resp.Header.Get("WWW-Authenticate"))
	}

	// The audit log, read by the admin, has every decision.
	code, page := alice.do("GET", "/v1/audit?limit=100", "", "")
	if code != 200 {
		t.Fatalf("audit: %d %v", code, page)
	}
	seen := map[string]bool{}
	for _, e := range page["entries"].([]any) {
		e := e.(map[string]any)
		seen[fmt.Sprint(e["action"], ":", e["actor"])] = true
		if strings.Contains(fmt.Sprint(e["detail"], e["target"]), "atr_") {
			t.Fatalf("audit entry holds a token: %v", e)
		}
	}
	for _, want := range []string{"login:alice@example.com", "session_created:alice@example.com", "member_changed:alice@example.com",
		"token_created:bob@example.com", "token_revoked:bob@example.com", "denied:bob@example.com"} {
		if !seen[want] {
			t.Errorf("audit lacks %s; has %v", want, seen)
		}
	}
	// Bob is no admin: the audit log is not his to read.
	if _, errs, err := c.run(cliContext(t), nil, "audit"); err == nil {
		t.Fatalf("bob read the audit log: %s", errs)
	}
	// Carol's tenant's log has none of acme's entries.
	_, page = carol.do("GET", "/v1/audit?limit=100", "", "")
	for _, e := range page["entries"].([]any) {
		if e.(map[string]any)["tenant"] != "globex" {
			t.Fatalf("globex admin sees %v", e)
		}
	}

	// Failed authentications from one address are slowed down.
	var last *http.Response
	for range 30 {
		last, _ = bearerGet(t, base+"/v1/sessions", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.")
		if last.StatusCode == http.StatusTooManyRequests {
			break
		}
	}
	if last.StatusCode != http.StatusTooManyRequests || last.Header.Get("Retry-After") == "" {
		t.Fatalf("after repeated failures: %s, Retry-After %q", last.Status, last.Header.Get("Retry-After"))
	}
}

// TestServe_RefusesWithoutAuthentication: `atrium serve` needs an explicit
// auth mode, and a bad identity configuration names the setting.
func TestServe_RefusesWithoutAuthentication(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		env  map[string]string
		want []string
	}{
		"serve, nothing":     {args: []string{"serve"}, want: []string{"auth.mode: required", "never runs without authentication"}},
		"serve, dev":         {args: []string{"serve"}, env: map[string]string{"ATRIUM_AUTH_MODE": "dev"}, want: []string{"only for `atrium dev`"}},
		"serve, oidc, empty": {args: []string{"serve"}, env: map[string]string{"ATRIUM_AUTH_MODE": "oidc"}, want: []string{"auth.oidc.issuer", "auth.cookie_key", "openssl rand"}},
		"dev, oidc, empty":   {args: []string{"dev", "--listen", "127.0.0.1:0"}, env: map[string]string{"ATRIUM_AUTH_MODE": "oidc", "ATRIUM_AUTH_OIDC_ISSUER": "http://id.example.com"}, want: []string{"must be an https URL"}},
		"bad env duration":   {args: []string{"serve"}, env: map[string]string{"ATRIUM_NODE_TURN_TIMEOUT": "forever"}, want: []string{"ATRIUM_NODE_TURN_TIMEOUT"}},
	} {
		t.Run(name, func(t *testing.T) {
			getenv := func(k string) string { return c.env[k] }
			var out, errs lockedBuffer
			err := run(cliContext(t), c.args, strings.NewReader(""), &out, &errs, getenv)
			if err == nil {
				t.Fatal("started")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
