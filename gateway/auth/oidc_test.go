package auth_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

func TestOIDC_Bearer(t *testing.T) {
	e := newEnv(t, envOpt{})
	iss := e.p.signer()
	rogue := newSigner(t, iss.kid) // same key id, another key
	stranger := newSigner(t, "stranger")
	now := clk.Now()
	valid := iss.sign(t, e.p.claims(nil))

	for name, c := range map[string]struct {
		token   string
		user    string // empty: refused
		tenant  string
		admin   bool
		op      bool         // an operator
		noCreds bool         // not OIDC's: ErrNoCredentials
		code    session.Code // when refused
		msg     string       // in the error message
	}{
		"id token":            {token: valid, user: "ann@example.com", tenant: "acme"},
		"id token of the CLI": {token: iss.sign(t, e.p.claims(map[string]any{"aud": "atrium-cli"})), user: "ann@example.com", tenant: "acme"},
		"access token":        {token: iss.sign(t, e.p.claims(map[string]any{"aud": []string{"atrium-api", "other"}})), user: "ann@example.com", tenant: "acme"},
		"admin":               {token: iss.sign(t, e.p.claims(map[string]any{"groups": []string{"x", "atrium-admins"}})), user: "ann@example.com", tenant: "acme", admin: true},
		"operator":            {token: iss.sign(t, e.p.claims(map[string]any{"groups": []string{"atrium-operators"}})), user: "ann@example.com", tenant: "acme", op: true},
		"admin not operator":  {token: iss.sign(t, e.p.claims(map[string]any{"groups": []string{"atrium-admins", "atrium-operators-not"}})), user: "ann@example.com", tenant: "acme", admin: true},
		"groups not admin":    {token: iss.sign(t, e.p.claims(map[string]any{"groups": "atrium-admins-not"})), user: "ann@example.com", tenant: "acme"},
		"tenant in a list":    {token: iss.sign(t, e.p.claims(map[string]any{"org": []string{"globex"}})), user: "ann@example.com", tenant: "globex"},
		"sub without email":   {token: iss.sign(t, e.p.claims(map[string]any{"email": nil})), user: "u-ann", tenant: "acme"},

		"expired": {token: iss.sign(t, e.p.claims(map[string]any{"exp": now.Add(-time.Minute).Unix()})),
			code: session.CodeUnauthenticated, msg: "token expired at " + now.Add(-time.Minute).UTC().Format(time.RFC3339)},
		"wrong audience": {token: iss.sign(t, e.p.claims(map[string]any{"aud": "someone-else"})),
			code: session.CodeUnauthenticated, msg: `audience "someone-else" not accepted`},
		"wrong issuer": {token: iss.sign(t, e.p.claims(map[string]any{"iss": "https://evil.example"})),
			code: session.CodeUnauthenticated, msg: `issuer "https://evil.example" is not "` + e.p.Issuer() + `"`},
		"alg none": {token: unsigned(t, e.p.claims(nil)),
			code: session.CodeUnauthenticated, msg: `signing algorithm "none" is not accepted`},
		"HS256 keyed with the public key": {token: hs256(t, publicPEM(t, e), e.p.claims(nil)),
			code: session.CodeUnauthenticated, msg: `signing algorithm "HS256" is not accepted`},
		"tampered": {token: tamper(t, valid, map[string]any{"email": "boss@example.com"}),
			code: session.CodeUnauthenticated, msg: "signature does not verify"},
		"signed by another key with the issuer's key id": {token: rogue.sign(t, e.p.claims(nil)),
			code: session.CodeUnauthenticated, msg: "signature does not verify"},
		"unknown key": {token: stranger.sign(t, e.p.claims(nil)),
			code: session.CodeUnauthenticated, msg: `unknown signing key "stranger"`},
		"malformed": {token: "eyJhbGciOiJSUzI1NiJ9.!!!.sig",
			code: session.CodeUnauthenticated, msg: "malformed token"},
		"no tenant": {token: iss.sign(t, e.p.claims(map[string]any{"org": nil})),
			code: session.CodeForbidden, msg: `your account has no "org" claim`},
		"unverified email": {token: iss.sign(t, e.p.claims(map[string]any{"email_verified": false})),
			code: session.CodeForbidden, msg: "is not verified"},
		"bad tenant": {token: iss.sign(t, e.p.claims(map[string]any{"org": "a b"})),
			code: session.CodeForbidden, msg: "space or control character"},
		"no user at all": {token: iss.sign(t, e.p.claims(map[string]any{"email": nil, "sub": nil})),
			code: session.CodeForbidden, msg: `neither a "email" nor a "sub" claim`},

		"api token": {token: "atr_abc_def", noCreds: true, code: session.CodeUnauthenticated},
		"dev token": {token: "dev:alice", noCreds: true, code: session.CodeUnauthenticated},
		"JWE":       {token: "eyJhbGciOiJSU0EtT0FFUCJ9.a.b.c.d", noCreds: true, code: session.CodeUnauthenticated},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := e.bearer(c.token)
			if c.user != "" {
				if err != nil {
					t.Fatal(err)
				}
				if p.User != c.user || p.Tenant != c.tenant || p.Admin != c.admin || p.Operator != c.op || p.Via != session.ViaOIDC || p.Expires.IsZero() {
					t.Fatalf("principal %+v", p)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %+v", p)
			}
			if errors.Is(err, auth.ErrNoCredentials) != c.noCreds {
				t.Fatalf("%v: matches ErrNoCredentials = %v", err, !c.noCreds)
			}
			if we := session.AsError(err); we.Code != c.code || !strings.Contains(we.Message, c.msg) {
				t.Fatalf("got %+v, want %s with %q", we, c.code, c.msg)
			}
		})
	}

	// On its own, OIDC says what it expected of a bearer it does not know.
	r := httptest.NewRequest("GET", "/v1/whoami", nil)
	r.Header.Set("Authorization", "Bearer atr_abc_def")
	if _, err := e.o.Authenticate(r); !errors.Is(err, auth.ErrNoCredentials) || !strings.Contains(err.Error(), "unrecognised bearer token") {
		t.Fatalf("got %v", err)
	}

	// A real ID token of the provider, as `atrium login` gets one.
	e.p.QueueUser(ann())
	p, err := e.bearer(providerIDToken(t, e))
	if err != nil || p.User != "ann@example.com" || !p.Admin || p.Via != session.ViaOIDC {
		t.Fatalf("provider's ID token: %+v %v", p, err)
	}
}

// providerIDToken runs the code flow against the provider as a CLI would and
// returns the ID token.
func providerIDToken(t *testing.T, e *env) string {
	t.Helper()
	cfg := oauth2.Config{
		ClientID:     e.p.ClientID,
		ClientSecret: e.p.ClientSecret,
		Endpoint:     oauth2.Endpoint{AuthURL: e.p.AuthorizationEndpoint(), TokenURL: e.p.TokenEndpoint()},
		RedirectURL:  "http://127.0.0.1:1/callback",
		Scopes:       []string{"openid", "email", "groups"},
	}
	b := newBrowser(t)
	h := b.get(cfg.AuthCodeURL("st"))
	loc, err := h.Request.URL.Parse(h.location())
	if err != nil || loc.Query().Get("code") == "" {
		t.Fatalf("authorize: %d %q", h.StatusCode, h.location())
	}
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, b.c)
	tok, err := cfg.Exchange(ctx, loc.Query().Get("code"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		t.Fatal("no id_token")
	}
	return raw
}

func b64json(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// unsigned returns claims as a JWT with "alg":"none".
func unsigned(t testing.TB, claims map[string]any) string {
	return b64json(t, map[string]any{"alg": "none", "typ": "JWT"}) + "." + b64json(t, claims) + "."
}

// hs256 returns claims as a JWT signed with HMAC-SHA256 keyed by key: the
// classic attack of signing with the issuer's public key.
func hs256(t testing.TB, key []byte, claims map[string]any) string {
	in := b64json(t, map[string]any{"alg": "HS256", "typ": "JWT"}) + "." + b64json(t, claims)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(in))
	return in + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func publicPEM(t testing.TB, e *env) []byte {
	der, err := x509.MarshalPKIXPublicKey(e.p.Keypair.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// tamper changes claims of a signed token, keeping its signature.
func tamper(t testing.TB, tok string, changes map[string]any) string {
	parts := strings.Split(tok, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	for k, v := range changes {
		claims[k] = v
	}
	return parts[0] + "." + b64json(t, claims) + "." + parts[2]
}

func TestOIDC_KeyRotation(t *testing.T) {
	old, next := newSigner(t, "2024-01"), newSigner(t, "2024-02")
	keys := &keyServer{}
	keys.set(old)
	e := newEnv(t, envOpt{provider: []providerOpt{withKeys(keys)}})
	oldTok := old.sign(t, e.p.claims(nil))
	if _, err := e.bearer(oldTok); err != nil {
		t.Fatal(err)
	}
	hits := e.p.jwksHits.Load()

	// The provider rotates: new tokens are signed with a key published since.
	keys.set(next)
	newTok := next.sign(t, e.p.claims(nil))
	// Keys were just fetched: unknown key ids do not make the gateway fetch
	// again right away, so made-up key ids cannot flood the provider.
	for range 5 {
		if _, err := e.bearer(newTok); err == nil || !strings.Contains(err.Error(), `unknown signing key "2024-02"`) {
			t.Fatalf("got %v", err)
		}
	}
	if n := e.p.jwksHits.Load() - hits; n != 0 {
		t.Fatalf("%d key fetches", n)
	}
	clk.Advance(11 * time.Second)
	if p, err := e.bearer(next.sign(t, e.p.claims(nil))); err != nil || p.User != "ann@example.com" {
		t.Fatalf("after rotation: %+v %v", p, err)
	}
	if n := e.p.jwksHits.Load() - hits; n != 1 {
		t.Fatalf("%d key fetches for one rotation", n)
	}
	// The old key is no longer published: its tokens fail, though they have
	// not expired.
	if _, err := e.bearer(old.sign(t, e.p.claims(nil))); err == nil || !strings.Contains(err.Error(), `unknown signing key "2024-01"`) {
		t.Fatalf("old key: %v", err)
	}

	// Keys are fetched again after an hour even without new key ids.
	keys.set(next, old)
	clk.Advance(time.Hour + time.Second)
	if _, err := e.bearer(old.sign(t, e.p.claims(nil))); err != nil {
		t.Fatalf("old key published again: %v", err)
	}
	// And while the provider is down, the keys already known still serve.
	keys.setDown(true)
	clk.Advance(time.Hour + time.Second)
	if _, err := e.bearer(next.sign(t, e.p.claims(nil))); err != nil {
		t.Fatalf("provider down: %v", err)
	}
}

func TestOIDC_KeysUnavailable(t *testing.T) {
	keys := &keyServer{}
	keys.setDown(true)
	e := newEnv(t, envOpt{provider: []providerOpt{withKeys(keys)}})
	tok := e.p.signer().sign(t, e.p.claims(nil))
	_, err := e.bearer(tok)
	if we := session.AsError(err); we.Code != session.CodeUnavailable || !strings.Contains(we.Message, "signing keys") {
		t.Fatalf("got %v", err)
	}
	// Not retried at once...
	hits := e.p.jwksHits.Load()
	if _, err := e.bearer(tok); !errors.Is(err, session.ErrUnavailable) || e.p.jwksHits.Load() != hits {
		t.Fatalf("got %v after %d fetches", err, e.p.jwksHits.Load()-hits)
	}
	// ...but once the provider is back and a little time has passed.
	keys.set(e.p.signer())
	keys.setDown(false)
	clk.Advance(11 * time.Second)
	if _, err := e.bearer(tok); err != nil {
		t.Fatal(err)
	}
}

func TestChallenge(t *testing.T) {
	for name, c := range map[string]struct {
		err  error
		want string
	}{
		"no credentials": {auth.ErrNoCredentials, `Bearer realm="atrium"`},
		"expired": {session.Errorf(session.CodeUnauthenticated, "token expired at 2030-01-01T00:00:00Z"),
			`Bearer realm="atrium", error="invalid_token", error_description="token expired at 2030-01-01T00:00:00Z"`},
		"quotes and controls": {session.Errorf(session.CodeUnauthenticated, "issuer \"x\\y\"\r\nSet-Cookie: a=b é"),
			`Bearer realm="atrium", error="invalid_token", error_description="issuer 'x/y'??Set-Cookie: a=b ?"`},
		"not an auth error": {session.Errorf(session.CodeUnavailable, "down"), `Bearer realm="atrium"`},
		"long":              {session.Errorf(session.CodeUnauthenticated, "%s", strings.Repeat("a", 500)), `Bearer realm="atrium", error="invalid_token", error_description="` + strings.Repeat("a", 200) + `"`},
	} {
		t.Run(name, func(t *testing.T) {
			if got := auth.Challenge(c.err); got != c.want {
				t.Fatalf("got  %s\nwant %s", got, c.want)
			}
		})
	}

	// Through the handler: a refused bearer gets 401 with the reason in
	// both the header and the body.
	e := newEnv(t, envOpt{})
	b := newBrowser(t)
	expired := e.p.signer().sign(t, e.p.claims(map[string]any{"exp": clk.Now().Add(-time.Hour).Unix()}))
	h := b.do("GET", e.srv.URL+"/v1/whoami", http.Header{"Authorization": {"Bearer " + expired}})
	if h.StatusCode != 401 || !contains(h.Header.Get("WWW-Authenticate"), `error="invalid_token"`, "token expired at") ||
		!contains(h.body, `"unauthenticated"`, "token expired at") || strings.Contains(h.body, "goroutine") {
		t.Fatalf("%d %q %s", h.StatusCode, h.Header.Get("WWW-Authenticate"), h.body)
	}
}

func TestAuthConfig(t *testing.T) {
	e := newEnv(t, envOpt{config: func(c *auth.OIDCConfig) { c.CLIClientSecret = "not-secret" }})
	var tokensOnly fixed
	for name, c := range map[string]struct {
		a    auth.Authenticator
		want auth.ConfigInfo
	}{
		"oidc": {auth.Chain(tokensOnly, e.o), auth.ConfigInfo{Mode: "oidc", Issuer: e.p.Issuer(), ClientID: "atrium-cli",
			ClientSecret: "not-secret", Scopes: []string{"openid", "email", "profile", "groups"}, LoginURL: "/auth/login"}},
		"throttled oidc": {auth.Throttled(auth.Chain(e.o, tokensOnly), &auth.Throttle{}), auth.ConfigInfo{Mode: "oidc", Issuer: e.p.Issuer(),
			ClientID: "atrium-cli", ClientSecret: "not-secret", Scopes: []string{"openid", "email", "profile", "groups"}, LoginURL: "/auth/login"}},
		"dev":         {auth.Chain(tokensOnly, &auth.Dev{}), auth.ConfigInfo{Mode: "dev", LoginURL: "/auth/dev"}},
		"tokens only": {auth.Throttled(auth.Chain(tokensOnly), &auth.Throttle{}), auth.ConfigInfo{Mode: "tokens"}},
	} {
		t.Run(name, func(t *testing.T) {
			mux := http.NewServeMux()
			c.a.(auth.Router).Routes(mux)
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest("GET", "/auth/config", nil))
			want, _ := json.Marshal(c.want)
			if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != string(want) ||
				rec.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s\nwant %s", rec.Code, rec.Body, want)
			}
			if strings.Contains(rec.Body.String(), e.p.ClientSecret) {
				t.Fatal("the browser client's secret is published")
			}
		})
	}
}

func TestOIDCConfig_Validate(t *testing.T) {
	good := func() auth.OIDCConfig {
		return auth.OIDCConfig{Issuer: "https://id.example.com", ClientID: "atrium",
			RedirectURL: "https://atrium.example.com/auth/callback", CookieKey: cookieKey, TenantClaim: "org"}
	}
	for name, c := range map[string]struct {
		change func(*auth.OIDCConfig)
		want   []string // empty: valid
	}{
		"good": {change: func(*auth.OIDCConfig) {}},
		"loopback http": {change: func(c *auth.OIDCConfig) {
			c.Issuer = "http://127.0.0.1:5556/dex"
			c.RedirectURL = "http://localhost:7080/auth/callback"
		}},
		"empty":             {change: func(c *auth.OIDCConfig) { *c = auth.OIDCConfig{} }, want: []string{"auth.oidc.issuer: required", "auth.oidc.client_id: required", "public_url: required", "auth.cookie_key: required", "openssl rand -base64 32"}},
		"http issuer":       {change: func(c *auth.OIDCConfig) { c.Issuer = "http://id.example.com" }, want: []string{"auth.oidc.issuer: \"http://id.example.com\" must be an https URL (http is allowed only for loopback)"}},
		"relative issuer":   {change: func(c *auth.OIDCConfig) { c.Issuer = "id.example.com" }, want: []string{"auth.oidc.issuer", "not an absolute"}},
		"http redirect":     {change: func(c *auth.OIDCConfig) { c.RedirectURL = "http://atrium.example.com/auth/callback" }, want: []string{"public_url", "https"}},
		"short key":         {change: func(c *auth.OIDCConfig) { c.CookieKey = []byte("short") }, want: []string{"auth.cookie_key: 5 bytes is too short (at least 32); generate one with `openssl rand -base64 32`"}},
		"short ttl":         {change: func(c *auth.OIDCConfig) { c.CookieTTL = time.Second }, want: []string{"auth.cookie_ttl: 1s is too short"}},
		"two tenant rules":  {change: func(c *auth.OIDCConfig) { c.DefaultTenant = "acme" }, want: []string{"auth.oidc.default_tenant: set either"}},
		"no openid scope":   {change: func(c *auth.OIDCConfig) { c.Scopes = []string{"email"} }, want: []string{"auth.oidc.scopes: must include openid"}},
		"bad logout target": {change: func(c *auth.OIDCConfig) { c.PostLogoutRedirectURL = "/bye" }, want: []string{"auth.oidc.post_logout_redirect_url"}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := good()
			c.change(&cfg)
			err := cfg.Validate()
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}

func TestNewOIDC_Errors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	p := startProvider(t)
	plainOnly := startProvider(t, withPKCE("plain"))
	cfg := func(issuer string) auth.OIDCConfig {
		return auth.OIDCConfig{Issuer: issuer, ClientID: "atrium", RedirectURL: "http://127.0.0.1:1/auth/callback",
			CookieKey: cookieKey, HTTPClient: &http.Client{Timeout: 5 * time.Second, Transport: closingTransport(t)}}
	}
	for name, c := range map[string]struct {
		cfg  auth.OIDCConfig
		want string
	}{
		"invalid":         {cfg: auth.OIDCConfig{}, want: "auth.oidc.issuer: required"},
		"unreachable":     {cfg: cfg(closed), want: "auth.oidc.issuer: read the discovery document of " + closed},
		"issuer mismatch": {cfg: cfg(p.Addr() + "/oidc/"), want: "auth.oidc.issuer"},
		"no PKCE S256":    {cfg: cfg(plainOnly.Issuer()), want: "does not support PKCE with S256"},
	} {
		t.Run(name, func(t *testing.T) {
			o, err := auth.NewOIDC(context.Background(), c.cfg)
			if err == nil {
				o.Close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%q lacks %q", err, c.want)
			}
		})
	}
	// Close is safe twice.
	o, err := auth.NewOIDC(context.Background(), cfg(p.Issuer()))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}

func closingTransport(t testing.TB) *http.Transport {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}
