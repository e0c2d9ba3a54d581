package auth_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// clk is the clock of every OIDC and throttle test in this package: the providers' (mockoidc
// reads mockoidc.NowFunc), the authenticators' and the throttles'. Tests
// move it forward to expire tokens and cookies; none runs in parallel.
var clk = &skewClock{}

type skewClock struct {
	mu  sync.Mutex
	off time.Duration // guarded by mu
}

func (c *skewClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *skewClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

func TestMain(m *testing.M) {
	mockoidc.NowFunc = clk.Now // before any provider's goroutine reads it
	goleak.VerifyTestMain(m)
}

// cookieKey is a test cookie key (32 bytes).
var cookieKey = []byte("0123456789abcdef0123456789abcdef")

// provider is an OIDC provider running in-process: mockoidc, with optional
// changes to its discovery document and key set.
type provider struct {
	*mockoidc.MockOIDC
	keys      *keyServer   // nil: mockoidc's own key set
	endSess   bool         // advertise an end_session_endpoint
	pkce      []string     // code_challenge_methods_supported, if set
	jwksHits  atomic.Int64 // requests for the key set
	tokenHits atomic.Int64 // requests to the token endpoint
}

type providerOpt func(*provider)

func withKeys(k *keyServer) providerOpt { return func(p *provider) { p.keys = k } }
func withEndSession() providerOpt       { return func(p *provider) { p.endSess = true } }
func withPKCE(m ...string) providerOpt  { return func(p *provider) { p.pkce = m } }

// startProvider starts a provider on loopback for the test.
func startProvider(t testing.TB, opts ...providerOpt) *provider {
	t.Helper()
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Keypair.KeyID(); err != nil { // mockoidc sets Kid lazily: set it before its goroutines read it
		t.Fatal(err)
	}
	p := &provider{MockOIDC: m}
	for _, o := range opts {
		o(p)
	}
	if err := m.AddMiddleware(p.middleware); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ln, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return p
}

func (p *provider) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case mockoidc.JWKSEndpoint:
			p.jwksHits.Add(1)
			if p.keys != nil {
				p.keys.ServeHTTP(w, r)
				return
			}
		case mockoidc.TokenEndpoint:
			p.tokenHits.Add(1)
		case mockoidc.DiscoveryEndpoint:
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			var doc map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			if p.endSess {
				doc["end_session_endpoint"] = p.Addr() + "/oidc/logout"
			}
			if p.pkce != nil {
				doc["code_challenge_methods_supported"] = p.pkce
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(doc)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// keyServer serves a JSON Web Key Set the test changes, for key rotation.
type keyServer struct {
	mu   sync.Mutex
	keys []jose.JSONWebKey // guarded by mu
	down bool              // guarded by mu; answer 503
}

func (k *keyServer) set(keys ...*signer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = k.keys[:0]
	for _, s := range keys {
		k.keys = append(k.keys, jose.JSONWebKey{Key: &s.key.PublicKey, KeyID: s.kid, Algorithm: "RS256", Use: "sig"})
	}
}

func (k *keyServer) setDown(down bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.down = down
}

func (k *keyServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: k.keys})
}

// signer forges tokens with an RSA key.
type signer struct {
	key *rsa.PrivateKey
	kid string
}

func newSigner(t testing.TB, kid string) *signer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{key: key, kid: kid}
}

// providerSigner signs with the provider's own key: tokens it makes are the
// issuer's as far as signatures go.
func (p *provider) signer() *signer {
	return &signer{key: p.Keypair.PrivateKey, kid: p.Keypair.Kid}
}

// sign returns claims as a compact RS256 JWT.
func (s *signer) sign(t testing.TB, claims map[string]any) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: s.key, KeyID: s.kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := sig.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// claims returns the claims of a valid ID token of p for user ann in tenant
// acme, with changes applied (a nil value deletes a claim).
func (p *provider) claims(changes map[string]any) map[string]any {
	now := clk.Now()
	c := map[string]any{
		"iss":   p.Issuer(),
		"aud":   p.ClientID,
		"sub":   "u-ann",
		"email": "ann@example.com",
		"org":   "acme",
		"iat":   now.Unix(),
		"exp":   now.Add(5 * time.Minute).Unix(),
	}
	for k, v := range changes {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// user is a mockoidc user with the claims Atrium maps: org and groups.
type user struct {
	sub, email string
	org        any
	groups     []string
	verified   *bool
}

func (u *user) ID() string { return u.sub }

func (u *user) Userinfo([]string) ([]byte, error) {
	return json.Marshal(map[string]any{"email": u.email})
}

func (u *user) Claims(_ []string, base *mockoidc.IDTokenClaims) (jwt.Claims, error) {
	return &userClaims{IDTokenClaims: base, Email: u.email, Org: u.org, Groups: u.groups, EmailVerified: u.verified}, nil
}

type userClaims struct {
	*mockoidc.IDTokenClaims
	Email         string   `json:"email,omitempty"`
	EmailVerified *bool    `json:"email_verified,omitempty"`
	Org           any      `json:"org,omitempty"`
	Groups        []string `json:"groups,omitempty"`
}

// recorder is an audit.Recorder that keeps entries in memory.
type recorder struct {
	mu      sync.Mutex
	entries []audit.Entry // guarded by mu
}

func (r *recorder) Record(_ context.Context, e audit.Entry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = append(r.entries, e)
	return nil
}

// count returns how many entries have action.
func (r *recorder) count(action string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.entries {
		if e.Action == action {
			n++
		}
	}
	return n
}

// last returns the last entry with action, failing the test if there is none.
func (r *recorder) last(t testing.TB, action string) audit.Entry {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.entries) - 1; i >= 0; i-- {
		if r.entries[i].Action == action {
			return r.entries[i]
		}
	}
	t.Fatalf("no %s audit entry in %+v", action, r.entries)
	return audit.Entry{}
}

// env is an OIDC authenticator of a provider behind a small gateway-like
// HTTP server: the auth routes, GET /v1/whoami (authenticated), and a page
// for everything else, all wrapped by the chain's Refresh.
type env struct {
	p     *provider
	o     *auth.OIDC
	a     auth.Authenticator // what the server authenticates with
	srv   *httptest.Server
	audit *recorder
}

type envOpt struct {
	provider []providerOpt
	config   func(*auth.OIDCConfig)
	throttle *auth.Throttle
}

func newEnv(t testing.TB, opt envOpt) *env {
	t.Helper()
	e := &env{p: startProvider(t, opt.provider...), audit: &recorder{}}
	e.srv = httptest.NewUnstartedServer(nil)
	base := "http://" + e.srv.Listener.Addr().String()
	cfg := auth.OIDCConfig{
		Issuer:        e.p.Issuer(),
		ClientID:      e.p.ClientID,
		ClientSecret:  e.p.ClientSecret,
		RedirectURL:   base + "/auth/callback",
		Scopes:        []string{"openid", "email", "profile", "groups"}, // mockoidc knows no offline_access; it always gives a refresh token
		TenantClaim:   "org",
		AdminGroup:    "atrium-admins",
		OperatorGroup: "atrium-operators",
		CookieKey:     cookieKey,
		CLIClientID:   "atrium-cli",
		Audience:      "atrium-api",
		Audit:         e.audit,
		Logger:        slog.New(slog.DiscardHandler),
		Now:           clk.Now,
	}
	if opt.config != nil {
		opt.config(&cfg)
	}
	o, err := auth.NewOIDC(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	e.o = o
	e.a = auth.Throttled(auth.Chain(o), opt.throttle)

	mux := http.NewServeMux()
	e.a.(auth.Router).Routes(mux)
	mux.HandleFunc("/v1/whoami", func(w http.ResponseWriter, r *http.Request) {
		p, err := e.a.Authenticate(r)
		if err != nil {
			writeAuthError(w, err)
			return
		}
		_ = json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "page "+r.URL.RequestURI())
	})
	e.srv.Config.Handler = e.a.(auth.Refresher).Refresh(mux)
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

// writeAuthError answers as the gateway does for a refused request.
func writeAuthError(w http.ResponseWriter, err error) {
	e := session.AsError(err)
	if e.Code == session.CodeUnauthenticated {
		w.Header().Set("WWW-Authenticate", auth.Challenge(err))
	}
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		w.Header().Set("Retry-After", strconv.Itoa(int(ra.RetryAfter()/time.Second)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Code.HTTPStatus())
	_ = json.NewEncoder(w).Encode(session.ErrorBody{Error: e})
}

// browser is an HTTP client with a cookie jar that follows redirects one
// hop at a time, so tests can look at and change each hop.
type browser struct {
	t testing.TB
	c *http.Client
}

func newBrowser(t testing.TB) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &browser{t: t, c: &http.Client{
		Jar:           jar,
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// hop is one response, its body read.
type hop struct {
	*http.Response
	body string
}

func (h hop) location() string { return h.Header.Get("Location") }

// cookie returns the Set-Cookie of name on h, or nil.
func (h hop) cookie(name string) *http.Cookie {
	for _, c := range h.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func (b *browser) do(method, u string, header http.Header) hop {
	b.t.Helper()
	h, err := b.try(method, u, header)
	if err != nil {
		b.t.Fatal(err)
	}
	return h
}

// try is do for goroutines other than the test's.
func (b *browser) try(method, u string, header http.Header) (hop, error) {
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		return hop{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := b.c.Do(req)
	if err != nil {
		return hop{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return hop{}, err
	}
	return hop{Response: resp, body: string(body)}, nil
}

func (b *browser) get(u string) hop { b.t.Helper(); return b.do("GET", u, nil) }

// follow GETs u and follows redirects until a response that is not one,
// calling edit (if not nil) on each redirect target first. It returns every
// response.
func (b *browser) follow(u string, edit func(*url.URL)) []hop {
	b.t.Helper()
	var hops []hop
	for range 10 {
		h := b.get(u)
		hops = append(hops, h)
		if h.StatusCode < 300 || h.StatusCode > 399 {
			return hops
		}
		next, err := h.Request.URL.Parse(h.location())
		if err != nil {
			b.t.Fatal(err)
		}
		if edit != nil {
			edit(next)
		}
		u = next.String()
	}
	b.t.Fatalf("too many redirects: %v", hops)
	return nil
}

// jarCookie returns the value of the cookie name the browser would send to u.
func (b *browser) jarCookie(u, name string) string {
	b.t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		b.t.Fatal(err)
	}
	for _, c := range b.c.Jar.Cookies(pu) {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// whoami asks the env who b is: the principal, or the error body.
func (e *env) whoami(b *browser) (hop, session.Principal, *session.Error) {
	h := b.get(e.srv.URL + "/v1/whoami")
	if h.StatusCode == http.StatusOK {
		var p session.Principal
		if err := json.Unmarshal([]byte(h.body), &p); err != nil {
			b.t.Fatalf("whoami %q: %v", h.body, err)
		}
		return h, p, nil
	}
	var body session.ErrorBody
	if err := json.Unmarshal([]byte(h.body), &body); err != nil || body.Error == nil {
		b.t.Fatalf("whoami answered %d %q", h.StatusCode, h.body)
	}
	return h, session.Principal{}, body.Error
}

// login logs b in through the whole browser flow as u (queued at the
// provider), starting at /auth/login?next=next, and returns every hop.
func (e *env) login(b *browser, u *user, next string) []hop {
	b.t.Helper()
	if u != nil {
		e.p.QueueUser(u)
	}
	return b.follow(e.srv.URL+"/auth/login?next="+url.QueryEscape(next), nil)
}

// bearer asks the authenticator about a request with a bearer token.
func (e *env) bearer(tok string) (session.Principal, error) {
	r := httptest.NewRequest("GET", "/v1/whoami", nil)
	r.RemoteAddr = "127.0.0.1:1234"
	r.Header.Set("Authorization", "Bearer "+tok)
	return e.a.Authenticate(r)
}

func ann() *user {
	return &user{sub: "u-ann", email: "ann@example.com", org: "acme", groups: []string{"dev", "atrium-admins"}}
}

func jsonBody(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(bytes.NewReader([]byte(s))).Decode(&m); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return m
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
