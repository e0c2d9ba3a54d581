package auth_test

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oauth2-proxy/mockoidc"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

func TestOIDC_BrowserLogin(t *testing.T) {
	e := newEnv(t, envOpt{})
	b := newBrowser(t)
	hops := e.login(b, ann(), "/s/abc?tab=log")
	if len(hops) != 4 {
		t.Fatalf("want login → authorize → callback → page, got %d hops", len(hops))
	}
	login, authorize, callback, page := hops[0], hops[1], hops[2], hops[3]

	// /auth/login: to the provider, with PKCE S256, state and nonce.
	if login.StatusCode != http.StatusFound || !strings.HasPrefix(login.location(), e.p.AuthorizationEndpoint()) {
		t.Fatalf("login: %d to %q", login.StatusCode, login.location())
	}
	q := authorize.Request.URL.Query()
	if q.Get("code_challenge_method") != "S256" || len(q.Get("code_challenge")) != 43 ||
		len(q.Get("state")) < 43 || len(q.Get("nonce")) < 43 || q.Get("client_id") != e.p.ClientID ||
		q.Get("redirect_uri") != e.srv.URL+"/auth/callback" {
		t.Fatalf("authorize request %v", q)
	}
	if c := login.cookie("atrium_login_state"); c == nil || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode ||
		c.Path != "/auth/" || c.MaxAge != int(auth.LoginTimeout/time.Second) || c.Secure ||
		strings.Contains(c.Value, q.Get("state")) {
		t.Fatalf("state cookie %+v", c)
	}

	// /auth/callback: the login cookie, then the page asked for.
	if callback.StatusCode != http.StatusSeeOther || callback.location() != "/s/abc?tab=log" {
		t.Fatalf("callback: %d to %q: %s", callback.StatusCode, callback.location(), callback.body)
	}
	c := callback.cookie(auth.LoginCookie)
	if c == nil || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.Secure ||
		c.MaxAge < int(auth.DefaultCookieTTL/time.Second)-5 || c.MaxAge > int(auth.DefaultCookieTTL/time.Second) {
		t.Fatalf("login cookie %+v", c)
	}
	for _, secret := range []string{"ann@example.com", "acme", "u-ann"} {
		if strings.Contains(c.Value, secret) {
			t.Fatalf("login cookie shows %q in the clear", secret)
		}
	}
	if s := callback.cookie("atrium_login_state"); s == nil || s.MaxAge >= 0 {
		t.Fatalf("state cookie not cleared: %+v", s)
	}
	if page.StatusCode != 200 || page.body != "page /s/abc?tab=log" {
		t.Fatalf("page: %d %q", page.StatusCode, page.body)
	}

	// The cookie authenticates.
	_, p, err := e.whoami(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.User != "ann@example.com" || p.Tenant != "acme" || !p.Admin || p.Via != session.ViaCookie ||
		p.Expires.Sub(clk.Now()) < auth.DefaultCookieTTL-time.Minute {
		t.Fatalf("principal %+v", p)
	}
	if a := e.audit.last(t, audit.ActLogin); a.Actor != "ann@example.com" || a.Tenant != "acme" || a.Outcome != audit.OK ||
		a.Remote != "127.0.0.1" || a.Via != session.ViaCookie {
		t.Fatalf("audit %+v", a)
	}

	// Not an admin without the group; the user claim falls back to sub.
	b2 := newBrowser(t)
	e.login(b2, &user{sub: "u-bob", org: []any{"acme"}}, "/")
	if _, p, err := e.whoami(b2); err != nil || p.User != "u-bob" || p.Tenant != "acme" || p.Admin {
		t.Fatalf("bob: %+v %v", p, err)
	}
}

func TestOIDC_SecureCookies(t *testing.T) {
	// An https redirect URL makes the cookies Secure. (The provider need not
	// redirect there: only /auth/login runs.)
	e := newEnv(t, envOpt{config: func(c *auth.OIDCConfig) { c.RedirectURL = "https://atrium.example.com/auth/callback" }})
	h := newBrowser(t).get(e.srv.URL + "/auth/login")
	if c := h.cookie("atrium_login_state"); c == nil || !c.Secure {
		t.Fatalf("state cookie %+v", c)
	}
}

func TestOIDC_NextIsSameOrigin(t *testing.T) {
	e := newEnv(t, envOpt{})
	for _, next := range []string{"https://evil.example/x", "//evil.example/x", "/\\evil.example", "javascript:alert(1)", "s/abc", ""} {
		b := newBrowser(t)
		hops := e.login(b, ann(), next)
		if cb := hops[len(hops)-2]; cb.location() != "/" {
			t.Errorf("next %q: callback redirects to %q", next, cb.location())
		}
	}
}

func TestOIDC_LoginRefused(t *testing.T) {
	e := newEnv(t, envOpt{})
	f := false
	for name, c := range map[string]struct {
		user   *user
		edit   func(t *testing.T, b *browser, u *url.URL) // changes a redirect target
		code   int
		msg    string
		actor  string
		result string
	}{
		"state mismatch": {
			edit: onAuthorize(func(q url.Values) { q.Set("state", "forged") }),
			code: 400, msg: "login state does not match", result: audit.Failed,
		},
		"nonce mismatch": {
			edit: onAuthorize(func(q url.Values) { q.Set("nonce", "forged") }),
			code: 401, msg: "nonce does not match", result: audit.Failed,
		},
		"code minted for another PKCE verifier": {
			edit: onAuthorize(func(q url.Values) { q.Set("code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM") }),
			code: 401, msg: "did not accept the login code (invalid_grant)", result: audit.Failed,
		},
		"callback without the state cookie": {
			edit: func(t *testing.T, b *browser, u *url.URL) {
				if strings.HasSuffix(u.Path, "/auth/callback") {
					b.c.Jar.SetCookies(u, []*http.Cookie{{Name: "atrium_login_state", Path: "/auth/", MaxAge: -1}})
				}
			},
			code: 400, msg: "no login in progress", result: audit.Failed,
		},
		"login took too long": {
			edit: func(t *testing.T, b *browser, u *url.URL) {
				if strings.HasSuffix(u.Path, "/auth/callback") {
					clk.Advance(auth.LoginTimeout + time.Second)
				}
			},
			code: 400, msg: "the login took over 10m0s", result: audit.Failed,
		},
		"provider refused": {
			edit: func(t *testing.T, b *browser, u *url.URL) {
				if strings.HasSuffix(u.Path, "/auth/callback") {
					q := u.Query()
					q.Del("code")
					q.Set("error", "access_denied")
					q.Set("error_description", `user said "no"`)
					u.RawQuery = q.Encode()
				}
			},
			code: 401, msg: `refused the login: access_denied: user said 'no'`, result: audit.Failed,
		},
		"no tenant claim": {
			user: &user{sub: "u-eve", email: "eve@example.com"},
			code: 403, msg: `your account has no "org" claim`, actor: "eve@example.com", result: audit.Denied,
		},
		"two tenants": {
			user: &user{sub: "u-eve", email: "eve@example.com", org: []string{"acme", "globex"}},
			code: 403, msg: `"org" claim has 2 values`, actor: "eve@example.com", result: audit.Denied,
		},
		"unverified email": {
			user: &user{sub: "u-eve", email: "eve@example.com", org: "acme", verified: &f},
			code: 403, msg: `email "eve@example.com" is not verified`, actor: "eve@example.com", result: audit.Denied,
		},
	} {
		t.Run(name, func(t *testing.T) {
			clk.Advance(11 * time.Second) // failed logins of one address are audited once per 10s
			b := newBrowser(t)
			u := c.user
			if u == nil {
				u = ann()
			}
			e.p.QueueUser(u)
			var edit func(*url.URL)
			if c.edit != nil {
				edit = func(u *url.URL) { c.edit(t, b, u) }
			}
			hops := b.follow(e.srv.URL+"/auth/login?next=/s/x", edit)
			last := hops[len(hops)-1]
			var body struct{ Error session.Error }
			if last.StatusCode != c.code || !strings.HasSuffix(last.Request.URL.Path, "/auth/callback") {
				t.Fatalf("ended with %d at %s: %s", last.StatusCode, last.Request.URL, last.body)
			}
			m := jsonBody(t, last.body)["error"].(map[string]any)
			body.Error.Message, _ = m["message"].(string)
			if !strings.Contains(body.Error.Message, c.msg) {
				t.Fatalf("message %q lacks %q", body.Error.Message, c.msg)
			}
			if last.cookie(auth.LoginCookie) != nil || b.jarCookie(e.srv.URL, auth.LoginCookie) != "" {
				t.Fatal("a refused login set the login cookie")
			}
			if _, _, err := e.whoami(b); err == nil {
				t.Fatal("authenticated after a refused login")
			}
			a := e.audit.last(t, audit.ActLoginFailed)
			if a.Actor != c.actor || a.Outcome != c.result || a.Detail != body.Error.Message || a.Remote != "127.0.0.1" {
				t.Fatalf("audit %+v", a)
			}
		})
	}
}

func TestOIDC_FailedLoginAuditLimited(t *testing.T) {
	e := newEnv(t, envOpt{})
	for range 20 {
		if h := newBrowser(t).get(e.srv.URL + "/auth/callback?code=x&state=y"); h.StatusCode != 400 {
			t.Fatalf("%d %s", h.StatusCode, h.body)
		}
	}
	if n := e.audit.count(audit.ActLoginFailed); n != 1 {
		t.Fatalf("%d entries for 20 failures in a row", n)
	}
	clk.Advance(11 * time.Second)
	newBrowser(t).get(e.srv.URL + "/auth/callback?code=x&state=y")
	if n := e.audit.count(audit.ActLoginFailed); n != 2 {
		t.Fatalf("%d entries", n)
	}
}

// onAuthorize returns an edit that changes the query of the request to the
// provider's authorization endpoint.
func onAuthorize(f func(url.Values)) func(*testing.T, *browser, *url.URL) {
	return func(_ *testing.T, _ *browser, u *url.URL) {
		if u.Path == mockoidc.AuthorizationEndpoint {
			q := u.Query()
			f(q)
			u.RawQuery = q.Encode()
		}
	}
}

func TestOIDC_Cookie(t *testing.T) {
	e := newEnv(t, envOpt{config: func(c *auth.OIDCConfig) { c.CookieTTL = 2 * time.Minute }})
	other := newEnv(t, envOpt{config: func(c *auth.OIDCConfig) { c.CookieKey = []byte(strings.Repeat("k", 32)) }})
	b := newBrowser(t)
	e.login(b, ann(), "/")
	good := b.jarCookie(e.srv.URL, auth.LoginCookie)
	if _, _, err := e.whoami(b); err != nil {
		t.Fatal(err)
	}
	ob := newBrowser(t)
	other.login(ob, ann(), "/")
	foreign := ob.jarCookie(other.srv.URL, auth.LoginCookie)

	tampered := []byte(good)
	if tampered[20] == 'A' {
		tampered[20] = 'B'
	} else {
		tampered[20] = 'A'
	}
	for name, value := range map[string]string{
		"tampered":          string(tampered),
		"truncated":         good[:len(good)-4],
		"sealed by another": foreign,
		"made up":           "eyJ1IjoiYWRtaW4ifQ",
	} {
		t.Run(name, func(t *testing.T) {
			r := reqWithCookie(auth.LoginCookie, value)
			_, err := e.a.Authenticate(r)
			if e := session.AsError(err); e == nil || e.Code != session.CodeUnauthenticated || !strings.Contains(e.Message, "log in again") {
				t.Fatalf("got %v", err)
			}
		})
	}

	t.Run("expired", func(t *testing.T) {
		clk.Advance(2*time.Minute + time.Second)
		h, _, err := e.whoami(b)
		if err == nil || err.Code != session.CodeUnauthenticated || !contains(err.Message, "your login expired at", "log in again") {
			t.Fatalf("got %v", err)
		}
		if h.cookie(auth.LoginCookie) != nil {
			t.Fatal("an expired login was refreshed")
		}
	})
}

func reqWithCookie(name, value string) *http.Request {
	r, _ := http.NewRequest("GET", "http://atrium.test/v1/whoami", nil)
	r.RemoteAddr = "127.0.0.1:999"
	r.AddCookie(&http.Cookie{Name: name, Value: value})
	return r
}

func TestOIDC_SilentRefresh(t *testing.T) {
	e := newEnv(t, envOpt{})
	b := newBrowser(t)
	e.login(b, ann(), "/")
	first := b.jarCookie(e.srv.URL, auth.LoginCookie)
	tokens := e.p.tokenHits.Load()

	// Still fresh: nothing happens.
	if h, _, err := e.whoami(b); err != nil || h.cookie(auth.LoginCookie) != nil {
		t.Fatalf("fresh login: %v, cookie %+v", err, h.cookie(auth.LoginCookie))
	}

	// The ID token (mockoidc: 10 minutes) has expired: the next requests
	// refresh it, once, however many there are at the same time.
	clk.Advance(e.p.AccessTTL + time.Second)
	var wg sync.WaitGroup
	results, errs := make([]hop, 4), make([]error, 4)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = b.try("GET", e.srv.URL+"/v1/whoami", nil) })
	}
	wg.Wait()
	for i, h := range results {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		c := h.cookie(auth.LoginCookie)
		if h.StatusCode != 200 || c == nil || c.Value == first || c.Value != results[0].cookie(auth.LoginCookie).Value ||
			c.MaxAge <= 0 || !c.HttpOnly {
			t.Fatalf("request %d: %d %s, cookie %+v", i, h.StatusCode, h.body, c)
		}
	}
	if n := e.p.tokenHits.Load() - tokens; n != 1 {
		t.Fatalf("%d refreshes for one login", n)
	}
	if got := b.jarCookie(e.srv.URL, auth.LoginCookie); got == first {
		t.Fatal("the browser kept the old cookie")
	}
	if h, p, err := e.whoami(b); err != nil || h.cookie(auth.LoginCookie) != nil || p.User != "ann@example.com" || !p.Admin {
		t.Fatalf("after refresh: %+v %v", p, err)
	}
	// A request that still carries the old cookie gets the same result
	// rather than redeeming the refresh token again.
	old := reqWithCookie(auth.LoginCookie, first)
	rec := &recorderWriter{header: http.Header{}}
	e.srv.Config.Handler.ServeHTTP(rec, old)
	if rec.code != 200 || e.p.tokenHits.Load()-tokens != 1 {
		t.Fatalf("old cookie: %d, %d refreshes", rec.code, e.p.tokenHits.Load()-tokens)
	}

	// The refresh token has expired too (mockoidc: an hour): the provider
	// refuses it, the login is over and its cookie cleared.
	clk.Advance(e.p.RefreshTTL + time.Second)
	h, _, err := e.whoami(b)
	if err == nil || err.Code != session.CodeUnauthenticated || !strings.Contains(err.Message, "session expired: log in again") {
		t.Fatalf("got %v", err)
	}
	if c := h.cookie(auth.LoginCookie); c == nil || c.MaxAge >= 0 {
		t.Fatalf("cookie not cleared: %+v", c)
	}
	if h.Header.Get("WWW-Authenticate") == "" {
		t.Fatal("no WWW-Authenticate")
	}
	if a := e.audit.last(t, audit.ActLoginFailed); a.Actor != "ann@example.com" || !strings.Contains(a.Detail, "refresh") {
		t.Fatalf("audit %+v", a)
	}
}

// recorderWriter is a minimal http.ResponseWriter.
type recorderWriter struct {
	header http.Header
	code   int
}

func (r *recorderWriter) Header() http.Header { return r.header }
func (r *recorderWriter) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return len(b), nil
}
func (r *recorderWriter) WriteHeader(code int) { r.code = code }

func TestOIDC_Logout(t *testing.T) {
	for name, c := range map[string]struct {
		opts   []providerOpt
		method string
		target string // prefix of the redirect
	}{
		"no end_session_endpoint": {method: "GET", target: "/"},
		"post":                    {method: "POST", target: "/"},
		"end_session_endpoint":    {opts: []providerOpt{withEndSession()}, method: "GET", target: "/oidc/logout?client_id="},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOpt{provider: c.opts})
			b := newBrowser(t)
			e.login(b, ann(), "/")
			h := b.do(c.method, e.srv.URL+"/auth/logout", nil)
			want := c.target
			if want != "/" {
				want = e.p.Addr() + want + e.p.ClientID
			}
			if h.StatusCode != http.StatusSeeOther || !strings.HasPrefix(h.location(), want) {
				t.Fatalf("logout: %d to %q, want %q", h.StatusCode, h.location(), want)
			}
			if ck := h.cookie(auth.LoginCookie); ck == nil || ck.MaxAge >= 0 || ck.Path != "/" {
				t.Fatalf("logout cookie %+v", ck)
			}
			_, _, err := e.whoami(b)
			if err == nil || !strings.Contains(err.Message, "no credentials") {
				t.Fatalf("after logout: %v", err)
			}
			if a := e.audit.last(t, audit.ActLogout); a.Actor != "ann@example.com" || a.Tenant != "acme" {
				t.Fatalf("audit %+v", a)
			}
		})
	}
}
