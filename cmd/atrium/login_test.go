package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
)

// testIssuer is a real OIDC provider (mockoidc) on loopback, optionally
// fronted by an RFC 8628 device authorization endpoint, which mockoidc
// lacks.
type testIssuer struct {
	m      *mockoidc.MockOIDC
	device *deviceFront // nil without the device flow

	mu     sync.Mutex
	grants map[string]int // guarded by mu: token requests by grant_type
}

// newTestIssuer starts mockoidc; with device, its discovery document also
// advertises a device authorization endpoint served by a deviceFront.
func newTestIssuer(tb testing.TB, device bool) *testIssuer {
	tb.Helper()
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		tb.Fatal(err)
	}
	ti := &testIssuer{m: m, grants: map[string]int{}}
	if device {
		ti.device = newDeviceFront(tb, ti)
	}
	if err := m.AddMiddleware(ti.middleware); err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	if err := m.Start(ln, nil); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = m.Shutdown() })
	return ti
}

// middleware counts token grants, adds the device endpoint to the
// discovery document and serves the device_code grant at the token
// endpoint; everything else is mockoidc's.
func (ti *testIssuer) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case mockoidc.TokenEndpoint:
			_ = r.ParseForm() // mockoidc's own ParseForm reuses the result
			grant := r.PostForm.Get("grant_type")
			ti.mu.Lock()
			ti.grants[grant]++
			ti.mu.Unlock()
			if grant == deviceGrant && ti.device != nil {
				ti.device.token(w, r)
				return
			}
		case mockoidc.DiscoveryEndpoint:
			if ti.device != nil {
				rec := httptest.NewRecorder()
				next.ServeHTTP(rec, r)
				var doc map[string]any
				if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				doc["device_authorization_endpoint"] = ti.device.srv.URL + "/device"
				doc["grant_types_supported"] = append(doc["grant_types_supported"].([]any), deviceGrant)
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(doc)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (ti *testIssuer) grantCount(grant string) int {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	return ti.grants[grant]
}

// authConfig is what an Atrium server in OIDC mode publishes for the CLI.
// mockoidc requires a client secret at its token endpoint, so the CLI's
// client has one, public like an "installed application" secret.
func (ti *testIssuer) authConfig() clienttest.AuthConfig {
	return clienttest.AuthConfig{Mode: "oidc", Issuer: ti.m.Issuer(), ClientID: ti.m.ClientID,
		ClientSecret: ti.m.ClientSecret, LoginURL: "/auth/login", Scopes: []string{"openid", "email", "profile", "groups"}}
}

// authenticate verifies ID tokens of the issuer the way a gateway does
// (signature, issuer, audience, expiry); the tenant is the first group.
func (ti *testIssuer) authenticate(tb testing.TB) func(ctx context.Context, tok string) (clienttest.Identity, error) {
	tb.Helper()
	provider, err := oidc.NewProvider(cliContext(tb), ti.m.Issuer())
	if err != nil {
		tb.Fatal(err)
	}
	verifier := provider.Verifier(&oidc.Config{ClientID: ti.m.ClientID})
	return func(ctx context.Context, tok string) (clienttest.Identity, error) {
		idt, err := verifier.Verify(ctx, tok)
		if err != nil {
			return clienttest.Identity{}, err
		}
		var claims struct {
			Email  string   `json:"email"`
			Groups []string `json:"groups"`
		}
		if err := idt.Claims(&claims); err != nil {
			return clienttest.Identity{}, err
		}
		who := clienttest.Identity{User: claims.Email, Via: "oidc", ExpiresAt: idt.Expiry}
		if len(claims.Groups) > 0 {
			who.Tenant = claims.Groups[0]
		}
		return who, nil
	}
}

func alice() *mockoidc.MockUser {
	return &mockoidc.MockUser{Subject: "u-alice", Email: "alice@example.com", EmailVerified: true,
		PreferredUsername: "alice", Groups: []string{"acme"}}
}

const deviceGrant = "urn:ietf:params:oauth:grant-type:device_code"

// deviceFront is a small RFC 8628 device authorization server in front of
// mockoidc: it hands out device and user codes; once the test approves a
// user code it obtains real mockoidc tokens through mockoidc's authorize and
// token endpoints, and hands them out at the token endpoint for the device
// code. Until then it answers authorization_pending, and slow_down to the
// poll numbered slowDownAt.
type deviceFront struct {
	ti  *testIssuer
	srv *httptest.Server

	// user logs in when the test approves a user code; default alice().
	user mockoidc.User

	mu         sync.Mutex
	refuse     bool                  // guarded by mu: answer unauthorized_client to device requests
	slowDownAt int                   // guarded by mu
	reqs       map[string]*deviceReq // guarded by mu: by device code
	polls      []time.Time           // guarded by mu
}

type deviceReq struct {
	userCode, scope string
	token           []byte // the token response, once approved
	denied          bool
	used            bool
}

func newDeviceFront(tb testing.TB, ti *testIssuer) *deviceFront {
	d := &deviceFront{ti: ti, reqs: map[string]*deviceReq{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /device", d.authorize)
	d.srv = httptest.NewServer(mux)
	tb.Cleanup(d.srv.Close)
	return d
}

func oauthErr(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":%q}`, code)
}

func (d *deviceFront) authorize(w http.ResponseWriter, r *http.Request) {
	if r.PostFormValue("client_id") != d.ti.m.ClientID {
		oauthErr(w, http.StatusUnauthorized, "invalid_client")
		return
	}
	d.mu.Lock()
	if d.refuse {
		d.mu.Unlock()
		oauthErr(w, http.StatusBadRequest, "unauthorized_client")
		return
	}
	n := len(d.reqs) + 1
	dc, uc := fmt.Sprintf("dc-%d-%s", n, randomString()), fmt.Sprintf("WDJB-MJH%d", n)
	d.reqs[dc] = &deviceReq{userCode: uc, scope: r.PostFormValue("scope")}
	d.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"device_code": dc, "user_code": uc,
		"verification_uri":          d.srv.URL + "/activate",
		"verification_uri_complete": d.srv.URL + "/activate?user_code=" + uc,
		"expires_in":                60, "interval": 1,
	})
}

func (d *deviceFront) token(w http.ResponseWriter, r *http.Request) {
	if r.PostForm.Get("client_id") != d.ti.m.ClientID {
		oauthErr(w, http.StatusUnauthorized, "invalid_client")
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.polls = append(d.polls, time.Now())
	req := d.reqs[r.PostForm.Get("device_code")]
	switch {
	case req == nil || req.used:
		oauthErr(w, http.StatusBadRequest, "invalid_grant")
	case len(d.polls) == d.slowDownAt:
		oauthErr(w, http.StatusBadRequest, "slow_down")
	case req.denied:
		oauthErr(w, http.StatusBadRequest, "access_denied")
	case req.token == nil:
		oauthErr(w, http.StatusBadRequest, "authorization_pending")
	default:
		req.used = true
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(req.token)
	}
}

// deny is the user refusing the login of userCode.
func (d *deviceFront) deny(userCode string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.reqs {
		if r.userCode == userCode {
			r.denied = true
		}
	}
}

func (d *deviceFront) pollTimes() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.polls...)
}

// approve is the user entering userCode and logging in as alice: the front
// gets alice's tokens from mockoidc's authorize and token endpoints.
func (d *deviceFront) approve(tb testing.TB, userCode string) {
	tb.Helper()
	d.mu.Lock()
	var req *deviceReq
	for _, r := range d.reqs {
		if r.userCode == userCode {
			req = r
		}
	}
	d.mu.Unlock()
	if req == nil {
		tb.Fatalf("no device request with user code %q", userCode)
	}
	m := d.ti.m
	if d.user != nil {
		m.QueueUser(d.user)
	} else {
		m.QueueUser(alice())
	}
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	const redirect = "http://127.0.0.1:1/device-approved"
	resp, err := hc.Get(m.AuthorizationEndpoint() + "?" + url.Values{
		"client_id": {m.ClientID}, "redirect_uri": {redirect}, "response_type": {"code"},
		"scope": {req.scope}, "state": {"device"},
	}.Encode())
	if err != nil {
		tb.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		tb.Fatalf("authorize answered %s, Location %q", resp.Status, resp.Header.Get("Location"))
	}
	resp, err = hc.PostForm(m.TokenEndpoint(), url.Values{
		"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {redirect},
		"client_id": {m.ClientID}, "client_secret": {m.ClientSecret},
	})
	if err != nil {
		tb.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("token endpoint answered %s: %s", resp.Status, body)
	}
	d.mu.Lock()
	req.token = body
	d.mu.Unlock()
}

// background is a command running in a goroutine.
type background struct {
	out, errs lockedBuffer
	done      chan error
}

// start runs args in the background; the test waits for it with wait.
func (c *cli) start(ctx context.Context, args ...string) *background {
	b := &background{done: make(chan error, 1)}
	go func() { b.done <- run(ctx, args, strings.NewReader(""), &b.out, &b.errs, c.getenv) }()
	return b
}

func (b *background) wait(tb testing.TB) error {
	tb.Helper()
	select {
	case err := <-b.done:
		return err
	case <-time.After(30 * time.Second):
		tb.Fatalf("command did not finish\nstdout: %s\nstderr: %s", b.out.String(), b.errs.String())
		return nil
	}
}

// find polls the command's stderr until re matches and returns the first
// group.
func (b *background) find(tb testing.TB, re *regexp.Regexp) string {
	tb.Helper()
	var m []string
	eventually(tb, "output matching "+re.String(), func() bool {
		m = re.FindStringSubmatch(b.errs.String())
		return m != nil
	})
	return m[1]
}

// newLoginCLI is a CLI whose config directory is a fresh temporary one.
func newLoginCLI(t *testing.T, server string) (*cli, string) {
	c := newCLI(t, server)
	dir := filepath.Join(t.TempDir(), "config", "atrium")
	c.env["ATRIUM_CONFIG_DIR"] = dir
	return c, filepath.Join(dir, credentialsName)
}

func readCreds(tb testing.TB, path string) credentials {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var c credentials
	if err := json.Unmarshal(b, &c); err != nil {
		tb.Fatal(err)
	}
	return c
}

// browser is the test playing a web browser: it follows redirects.
func browser(tb testing.TB) *http.Client {
	tr := &http.Transport{}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

var loginURLRe = regexp.MustCompile(`(?m)^  (http://\S+/oidc/authorize\S+)$`)

func TestLogin_LoopbackPKCE(t *testing.T) {
	ti := newTestIssuer(t, false)
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig(), Authenticate: ti.authenticate(t)})
	c, credsPath := newLoginCLI(t, srv.URL)
	ti.m.QueueUser(alice())

	// No device endpoint: login falls back to the loopback redirect.
	bg := c.start(cliContext(t), "login", "--no-browser")
	authURL, err := url.Parse(bg.find(t, loginURLRe))
	if err != nil {
		t.Fatal(err)
	}
	q := authURL.Query()
	redirect, _ := url.Parse(q.Get("redirect_uri"))
	if q.Get("code_challenge_method") != "S256" || len(q.Get("code_challenge")) < 43 || len(q.Get("state")) < 16 ||
		q.Get("nonce") == "" || q.Get("client_id") != ti.m.ClientID || !strings.Contains(q.Get("scope"), "openid") ||
		redirect == nil || redirect.Hostname() != "127.0.0.1" || redirect.Path != "/callback" {
		t.Fatalf("authorization URL %s lacks PKCE S256, state, nonce or a loopback redirect", authURL)
	}
	if !strings.Contains(bg.errs.String(), "Waiting for you to log in") {
		t.Fatalf("no progress message:\n%s", bg.errs.String())
	}

	// A response with another state is refused and the login keeps waiting.
	br := browser(t)
	resp, err := br.Get(redirect.String() + "?code=forged&state=wrong")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("forged callback answered %s", resp.Status)
	}

	// The browser follows the URL through mockoidc back to the CLI.
	resp, err = br.Get(authURL.String())
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(page, []byte("You are logged in")) {
		t.Fatalf("callback page: %s\n%s", resp.Status, page)
	}
	if err := bg.wait(t); err != nil {
		t.Fatalf("login: %v\nstderr: %s", err, bg.errs.String())
	}
	if want := "Logged in to " + srv.URL + " as alice@example.com (tenant acme).\n"; bg.out.String() != want {
		t.Fatalf("login printed %q, want %q", bg.out.String(), want)
	}
	if n := ti.grantCount("authorization_code"); n != 1 {
		t.Fatalf("%d code exchanges, want 1", n)
	}

	// Stored with 0600 in a 0700 directory, with both tokens.
	st, err := os.Stat(credsPath)
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := os.Stat(filepath.Dir(credsPath))
	if st.Mode().Perm() != 0o600 || dst.Mode().Perm() != 0o700 {
		t.Fatalf("modes: file %v, dir %v; want 0600 and 0700", st.Mode(), dst.Mode())
	}
	l := readCreds(t, credsPath).Servers[srv.URL]
	if l == nil || l.IDToken == "" || l.RefreshToken == "" || l.Issuer != ti.m.Issuer() || l.ClientID != ti.m.ClientID ||
		l.User != "alice@example.com" || l.Tenant != "acme" || time.Until(l.Expiry) < 5*time.Minute {
		t.Fatalf("stored login = %+v", l)
	}

	// The client commands send the ID token.
	n := len(srv.Authorizations())
	c.ok("ls")
	if got := srv.Authorizations()[n:]; len(got) != 1 || got[0] != "Bearer "+l.IDToken {
		t.Fatalf("ls sent %q, want the stored ID token", got)
	}
	out := c.ok("whoami")
	for _, want := range []string{"alice@example.com", "acme", "oidc, stored login", srv.URL, "refreshed automatically"} {
		if !strings.Contains(out, want) {
			t.Errorf("whoami does not say %q:\n%s", want, out)
		}
	}
	var who map[string]any
	if err := json.Unmarshal([]byte(c.ok("whoami", "--json")), &who); err != nil || who["user"] != "alice@example.com" ||
		who["tenant"] != "acme" || who["via"] != "oidc" || who["credentials"] != "login" || who["expires_at"] == nil {
		t.Fatalf("whoami --json = %v, %v", who, err)
	}

	// --token and ATRIUM_TOKEN win over the stored login.
	c.env["ATRIUM_TOKEN"] = "dev:bob"
	if out := c.ok("whoami"); !strings.Contains(out, "bob") || !strings.Contains(out, envToken) {
		t.Fatalf("whoami with ATRIUM_TOKEN:\n%s", out)
	}
	if out := c.ok("whoami", "--token", "dev:carol"); !strings.Contains(out, "carol") {
		t.Fatalf("whoami --token:\n%s", out)
	}
	delete(c.env, "ATRIUM_TOKEN")
	if n := ti.grantCount("refresh_token"); n != 0 {
		t.Fatalf("a fresh login was refreshed %d times", n)
	}

	// --device fails clearly: this issuer has no device endpoint.
	_, _, err = c.run(cliContext(t), nil, "login", "--device")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "does not support the device flow") {
		t.Fatalf("login --device = %v", err)
	}
}

func TestLogin_DeviceFlow(t *testing.T) {
	t.Parallel() // slow_down costs the 5 seconds RFC 8628 requires
	ti := newTestIssuer(t, true)
	ti.device.slowDownAt = 2 // first poll: pending; second: slow_down
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig(), Authenticate: ti.authenticate(t)})
	c, credsPath := newLoginCLI(t, srv.URL)

	bg := c.start(cliContext(t), "login", "--no-browser")
	code := bg.find(t, regexp.MustCompile(`open http://\S+/activate and enter the code (\S+)`))
	if !strings.Contains(bg.errs.String(), "Waiting for you to log in") || !strings.Contains(bg.errs.String(), "user_code="+code) {
		t.Fatalf("device login printed:\n%s", bg.errs.String())
	}
	eventually(t, "a pending poll and a slow_down", func() bool { return len(ti.device.pollTimes()) >= 2 })
	ti.device.approve(t, code)
	if err := bg.wait(t); err != nil {
		t.Fatalf("login: %v\nstderr: %s", err, bg.errs.String())
	}
	if want := "Logged in to " + srv.URL + " as alice@example.com (tenant acme).\n"; bg.out.String() != want {
		t.Fatalf("login printed %q, want %q", bg.out.String(), want)
	}
	polls := ti.device.pollTimes()
	if len(polls) != 3 {
		t.Fatalf("%d polls, want 3 (pending, slow_down, tokens)", len(polls))
	}
	if gap := polls[2].Sub(polls[1]); gap < 5*time.Second {
		t.Fatalf("the poll after slow_down came %v later; RFC 8628 wants the interval raised by 5s", gap)
	}
	l := readCreds(t, credsPath).Servers[srv.URL]
	if l == nil || l.IDToken == "" || l.RefreshToken == "" || l.User != "alice@example.com" {
		t.Fatalf("stored login = %+v", l)
	}
	n := len(srv.Authorizations())
	c.ok("ls")
	if got := srv.Authorizations()[n:]; len(got) != 1 || got[0] != "Bearer "+l.IDToken {
		t.Fatalf("ls sent %q, want the stored ID token", got)
	}

	// --loopback skips the device flow even though it is available.
	ti.m.QueueUser(alice())
	bg = c.start(cliContext(t), "login", "--loopback", "--no-browser")
	authURL := bg.find(t, loginURLRe)
	resp, err := browser(t).Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := bg.wait(t); err != nil {
		t.Fatalf("login --loopback: %v\nstderr: %s", err, bg.errs.String())
	}
	if len(ti.device.pollTimes()) != 3 {
		t.Fatal("login --loopback used the device flow")
	}
}

func TestLogin_DeviceDenied(t *testing.T) {
	t.Parallel()
	ti := newTestIssuer(t, true)
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig(), Authenticate: ti.authenticate(t)})
	c, credsPath := newLoginCLI(t, srv.URL)
	bg := c.start(cliContext(t), "login", "--device", "--no-browser")
	ti.device.deny(bg.find(t, regexp.MustCompile(`enter the code (\S+)`)))
	err := bg.wait(t)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "the login was denied") {
		t.Fatalf("denied device login = %v", err)
	}
	if _, err := os.Stat(credsPath); !os.IsNotExist(err) {
		t.Fatal("a denied login stored something")
	}
}

func TestLogin_DeviceUnavailable(t *testing.T) {
	// The issuer advertises the device flow but refuses it to this client.
	ti := newTestIssuer(t, true)
	ti.device.refuse = true
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig(), Authenticate: ti.authenticate(t)})
	c, _ := newLoginCLI(t, srv.URL)

	_, _, err := c.run(cliContext(t), nil, "login", "--device")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "unauthorized_client") || !strings.Contains(err.Error(), "--loopback") {
		t.Fatalf("login --device refused = %v", err)
	}

	// Without --device, login falls back to the browser.
	ti.m.QueueUser(alice())
	bg := c.start(cliContext(t), "login", "--no-browser")
	resp, err := browser(t).Get(bg.find(t, loginURLRe))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := bg.wait(t); err != nil || !strings.Contains(bg.errs.String(), "using the browser instead") {
		t.Fatalf("login with the device flow refused = %v\n%s", err, bg.errs.String())
	}
}

func TestLogin_Abort(t *testing.T) {
	ti := newTestIssuer(t, false)
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig()})
	c, _ := newLoginCLI(t, srv.URL)
	ctx, cancel := context.WithCancel(cliContext(t))
	bg := c.start(ctx, "login", "--no-browser")
	u, _ := url.Parse(bg.find(t, loginURLRe))
	cancel() // Ctrl-C
	err := bg.wait(t)
	if exitCode(err) != 130 || !strings.Contains(err.Error(), "login aborted") {
		t.Fatalf("interrupted login = %v", err)
	}
	// The loopback listener is gone.
	redirect, _ := url.Parse(u.Query().Get("redirect_uri"))
	if conn, err := net.Dial("tcp", redirect.Host); err == nil {
		conn.Close()
		t.Fatal("the callback listener outlived the login")
	}

	// Without a browser arriving, --timeout ends the wait.
	bg = c.start(cliContext(t), "login", "--no-browser", "--timeout", "50ms")
	err = bg.wait(t)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "no login within 50ms") {
		t.Fatalf("login --timeout 50ms = %v", err)
	}
}

// loginAlice logs alice in through the loopback flow. The "browser" that
// login opens ($BROWSER) is a script that writes the URL to a file; the
// test follows that URL.
func loginAlice(t *testing.T, ti *testIssuer, c *cli) {
	t.Helper()
	ti.m.QueueUser(alice())
	dir := t.TempDir()
	opened := filepath.Join(dir, "opened")
	script := filepath.Join(dir, "browser.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nprintf '%s\\n' \"$1\" > "+opened+".tmp && mv "+opened+".tmp "+opened+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	c.env["BROWSER"] = "/bin/sh " + script // not exec'd itself: no ETXTBSY (golang/go#22315)
	defer delete(c.env, "BROWSER")
	bg := c.start(cliContext(t), "login")
	var authURL []byte
	eventually(t, "the browser to be opened", func() bool {
		authURL, _ = os.ReadFile(opened)
		return len(authURL) > 0
	})
	if !strings.Contains(bg.errs.String(), "Opening your browser") {
		t.Fatalf("login did not say it opens the browser:\n%s", bg.errs.String())
	}
	resp, err := browser(t).Get(strings.TrimSpace(string(authURL)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := bg.wait(t); err != nil {
		t.Fatalf("login: %v\nstderr: %s", err, bg.errs.String())
	}
}

// expireLogin replaces the stored ID token by a real, signed one of the
// same mockoidc session that expired an hour ago.
func expireLogin(t *testing.T, ti *testIssuer, store *credStore, server string) *storedLogin {
	t.Helper()
	l, err := store.get(server)
	if err != nil || l == nil {
		t.Fatalf("stored login: %v, %v", l, err)
	}
	var claims struct {
		JTI string `json:"jti"`
	}
	parts := strings.Split(l.IDToken, ".")
	if err := json.Unmarshal(mustB64(t, parts[1]), &claims); err != nil {
		t.Fatal(err)
	}
	sess, err := ti.m.SessionStore.GetSessionByID(claims.JTI)
	if err != nil {
		t.Fatal(err)
	}
	old, err := sess.IDToken(ti.m.Config(), ti.m.Keypair, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	l.IDToken = old
	if l.Expiry, err = idTokenExpiry(old); err != nil || time.Until(l.Expiry) > 0 {
		t.Fatalf("made an ID token expiring at %v (%v)", l.Expiry, err)
	}
	if err := store.put(server, l); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLogin_RefreshBeforeCommand(t *testing.T) {
	ti := newTestIssuer(t, false)
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig(), Authenticate: ti.authenticate(t)})
	c, credsPath := newLoginCLI(t, srv.URL)
	loginAlice(t, ti, c)
	store := &credStore{path: credsPath}

	expired := expireLogin(t, ti, store, srv.URL)
	// The server refuses the expired token (the test's own check that it
	// really is expired).
	_, _, err := c.run(cliContext(t), nil, "ls", "--token", expired.IDToken)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("ls with the expired ID token = %v", err)
	}

	n := len(srv.Authorizations())
	out := c.ok("whoami")
	if !strings.Contains(out, "alice@example.com") {
		t.Fatalf("whoami after refresh:\n%s", out)
	}
	if ti.grantCount("refresh_token") != 1 {
		t.Fatalf("%d refresh grants, want 1", ti.grantCount("refresh_token"))
	}
	fresh, err := store.get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.IDToken == expired.IDToken || time.Until(fresh.Expiry) < 5*time.Minute || fresh.RefreshToken == "" {
		t.Fatalf("refreshed login was not saved: %+v", fresh)
	}
	if got := srv.Authorizations()[n:]; len(got) != 1 || got[0] != "Bearer "+fresh.IDToken {
		t.Fatalf("whoami sent %q, want the refreshed ID token", got)
	}
	if st, _ := os.Stat(credsPath); st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials mode after refresh = %v", st.Mode())
	}

	// A refresh the provider refuses: the login expired.
	expired = expireLogin(t, ti, store, srv.URL)
	expired.RefreshToken = "not-a-refresh-token"
	if err := store.put(srv.URL, expired); err != nil {
		t.Fatal(err)
	}
	n = len(srv.Authorizations())
	_, _, err = c.run(cliContext(t), nil, "ls")
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "your login expired: run atrium login --server "+srv.URL) {
		t.Fatalf("ls with an unrefreshable login = %v", err)
	}
	if len(srv.Authorizations()) != n {
		t.Fatal("a request was sent with an expired login")
	}
}

func TestLoginTokens_RefreshDuringStream(t *testing.T) {
	// The SDK asks the token source before each WebSocket (re)connection:
	// a login that expires while attached is refreshed at the reconnect.
	ti := newTestIssuer(t, false)
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig(), Authenticate: ti.authenticate(t)})
	c, credsPath := newLoginCLI(t, srv.URL)
	loginAlice(t, ti, c)
	store := &credStore{path: credsPath}
	src, err := storedTokens(&cliEnv{getenv: c.getenv}, srv.URL)
	if err != nil || src == nil {
		t.Fatalf("storedTokens = %v, %v", src, err)
	}
	sdk := sdk(t, srv.URL, "unused")
	sdk.Tokens = src
	s, err := sdk.CreateSession(cliContext(t), client.CreateRequest{Title: "long"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sdk.Watch(cliContext(t), s.ID, 0, client.WatchOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	hellos := 0
	next := func(what string, done func(client.Frame) bool) {
		t.Helper()
		for {
			f, err := st.Next(cliContext(t))
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			if f.Hello != nil {
				hellos++
			}
			if done(f) {
				return
			}
		}
	}
	next("the first hello", func(client.Frame) bool { return hellos == 1 })

	// The login expires while the stream is connected; the network drops.
	expired := expireLogin(t, ti, store, srv.URL)
	src.mu.Lock()
	src.login = expired
	src.mu.Unlock()
	n := len(srv.Authorizations())
	srv.DropConnections()
	next("the hello after the reconnect", func(client.Frame) bool { return hellos == 2 })

	fresh, err := store.get(srv.URL)
	if err != nil || fresh.IDToken == expired.IDToken || time.Until(fresh.Expiry) < 5*time.Minute {
		t.Fatalf("the login was not refreshed: %+v, %v", fresh, err)
	}
	if ti.grantCount("refresh_token") != 1 {
		t.Fatalf("%d refresh grants, want 1", ti.grantCount("refresh_token"))
	}
	if got := srv.Authorizations()[n:]; len(got) == 0 || got[len(got)-1] != "Bearer "+fresh.IDToken {
		t.Fatalf("the reconnect sent %q, want the refreshed ID token", got)
	}
	if tok, _ := src.Token(cliContext(t)); tok != fresh.IDToken || ti.grantCount("refresh_token") != 1 {
		t.Fatal("a fresh token was refreshed again")
	}
}

func TestLogin_ServerModes(t *testing.T) {
	t.Run("dev", func(t *testing.T) {
		srv := clienttest.New(t, clienttest.Options{})
		c, credsPath := newLoginCLI(t, srv.URL)
		_, errs, err := c.run(cliContext(t), nil, "login")
		if err != nil || !strings.Contains(errs, "uses the dev identity") || !strings.Contains(errs, "--token dev:<user>") {
			t.Fatalf("login on a dev server = %v\n%s", err, errs)
		}
		if _, err := os.Stat(credsPath); !os.IsNotExist(err) {
			t.Fatalf("login on a dev server stored something: %v", err)
		}
	})
	t.Run("tokens", func(t *testing.T) {
		srv := clienttest.New(t, clienttest.Options{Auth: clienttest.AuthConfig{Mode: "tokens"}})
		c, _ := newLoginCLI(t, srv.URL)
		_, _, err := c.run(cliContext(t), nil, "login")
		if exitCode(err) != 1 || !strings.Contains(err.Error(), "accepts only Atrium API tokens") || !strings.Contains(err.Error(), "--token atr_") {
			t.Fatalf("login on a tokens-only server = %v", err)
		}
	})
	t.Run("unreachable issuer", func(t *testing.T) {
		dead := httptest.NewServer(http.NotFoundHandler())
		dead.Close()
		srv := clienttest.New(t, clienttest.Options{Auth: clienttest.AuthConfig{Mode: "oidc", Issuer: dead.URL, ClientID: "x"}})
		c, _ := newLoginCLI(t, srv.URL)
		_, _, err := c.run(cliContext(t), nil, "login")
		if exitCode(err) != 1 || !strings.Contains(err.Error(), "cannot reach the identity provider "+dead.URL) {
			t.Fatalf("login with a dead issuer = %v", err)
		}
	})
	t.Run("flags", func(t *testing.T) {
		c, _ := newLoginCLI(t, "http://127.0.0.1:1")
		_, _, err := c.run(cliContext(t), nil, "login", "--device", "--loopback")
		if exitCode(err) != 2 || !strings.Contains(err.Error(), "not both") {
			t.Fatalf("login --device --loopback = %v", err)
		}
	})
}

func TestLogin_ServerRefusesToken(t *testing.T) {
	// The issuer is fine but the server does not accept the ID token (a
	// misconfigured audience, say): nothing is stored.
	ti := newTestIssuer(t, false)
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig()}) // no Authenticate: OIDC tokens refused
	c, credsPath := newLoginCLI(t, srv.URL)
	ti.m.QueueUser(alice())
	bg := c.start(cliContext(t), "login", "--no-browser")
	resp, err := browser(t).Get(bg.find(t, loginURLRe))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	err = bg.wait(t)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "refused the login") || !strings.Contains(err.Error(), ti.m.ClientID) {
		t.Fatalf("login = %v", err)
	}
	if _, err := os.Stat(credsPath); !os.IsNotExist(err) {
		t.Fatal("a refused login was stored")
	}
}

func TestLogout(t *testing.T) {
	ti := newTestIssuer(t, false)
	srv := clienttest.New(t, clienttest.Options{Auth: ti.authConfig(), Authenticate: ti.authenticate(t)})
	c, credsPath := newLoginCLI(t, srv.URL)
	loginAlice(t, ti, c)
	store := &credStore{path: credsPath}
	if err := store.put("https://other.example.com", &storedLogin{IDToken: "x"}); err != nil {
		t.Fatal(err)
	}

	if out := c.ok("logout"); !strings.Contains(out, "Logged out of "+srv.URL) || !strings.Contains(out, credsPath) {
		t.Fatalf("logout printed %q", out)
	}
	creds := readCreds(t, credsPath)
	if creds.Servers[srv.URL] != nil || creds.Servers["https://other.example.com"] == nil {
		t.Fatalf("after logout: %+v", creds.Servers)
	}
	if out := c.ok("logout"); !strings.Contains(out, "not logged in") {
		t.Fatalf("second logout printed %q", out)
	}
	// Without a login the commands fall back to dev:$USER again.
	n := len(srv.Authorizations())
	_, _, _ = c.run(cliContext(t), nil, "ls")
	if got := srv.Authorizations()[n:]; len(got) != 1 || got[0] != "Bearer dev:alice" {
		t.Fatalf("ls after logout sent %q", got)
	}
}

func TestLogin_Help(t *testing.T) {
	c := newCLI(t, "http://127.0.0.1:1")
	for _, args := range [][]string{{"login"}, {"logout"}, {"whoami"}, {"token"}, {"token", "create"}, {"token", "ls"},
		{"token", "revoke"}, {"audit"}} {
		out := c.ok(append(args, "--help")...)
		if !strings.Contains(out, "Examples:") || (len(args) > 1 || args[0] != "token") && !strings.Contains(out, "--server") {
			t.Errorf("atrium %s --help lacks examples or --server:\n%s", strings.Join(args, " "), out)
		}
	}
	if out := c.ok("--help"); !strings.Contains(out, "login") || !strings.Contains(out, "audit") {
		t.Errorf("atrium --help does not list the identity commands:\n%s", out)
	}
}
