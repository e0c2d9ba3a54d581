package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/auth"
)

// Dex is the real OpenID Connect provider issue 20's attacks used; these
// tests run it beside the in-process mockoidc ones. .ci/deps builds it.

// dexPasswordHash is the bcrypt hash of "password" (from Dex's examples).
const dexPasswordHash = "$2a$10$2b2cU8CPhOTaGrs1HRQuAueS7JTT5ZHsHSzYiFPm1leZck7Mc8T4W"

// findDex returns the path of the dex binary.
func findDex(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("dex"); err == nil {
		return p
	}
	gobin := os.Getenv("GOBIN")
	if gobin == "" {
		home, _ := os.UserHomeDir()
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			gopath = filepath.Join(home, "go")
		}
		gobin = filepath.Join(filepath.SplitList(gopath)[0], "bin")
	}
	p := filepath.Join(gobin, "dex")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("dex (the OpenID Connect provider these tests run) is not installed: run .ci/deps, which builds it from .ci/dex")
	}
	return p
}

// loopbackPort returns a port free on 127.0.0.1 at the time of the call.
func loopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// dexServer is a running Dex with one static client and one user,
// alice@example.com (password "password").
type dexServer struct {
	issuer       string
	clientID     string
	clientSecret string
}

// startDex runs Dex on loopback, its client redirecting to redirect, and
// waits until it serves its discovery document.
func startDex(t *testing.T, redirect string) *dexServer { return startDexExpiring(t, redirect, "24h") }

// startDexExpiring is startDex with ID tokens valid for idTokens (a Go
// duration).
func startDexExpiring(t *testing.T, redirect, idTokens string) *dexServer {
	t.Helper()
	bin := findDex(t)
	port := loopbackPort(t)
	d := &dexServer{issuer: fmt.Sprintf("http://127.0.0.1:%d/dex", port), clientID: "atrium", clientSecret: "atrium-" + rand.Text()}
	cfg := fmt.Sprintf(`issuer: %s
storage:
  type: memory
web:
  http: 127.0.0.1:%d
logger:
  level: warn
expiry:
  idTokens: %q
oauth2:
  skipApprovalScreen: true
  passwordConnector: local
enablePasswordDB: true
staticPasswords:
- email: alice@example.com
  hash: %q
  username: alice
  userID: 08a8684b-db88-4b73-90a9-3cd1661f5466
staticClients:
- id: %s
  secret: %s
  name: Atrium
  redirectURIs: [%q]
`, d.issuer, port, idTokens, dexPasswordHash, d.clientID, d.clientSecret, redirect)
	path := filepath.Join(t.TempDir(), "dex.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", path)
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("dex:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(e2eWait)
	for {
		resp, err := http.Get(d.issuer + "/.well-known/openid-configuration")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("dex exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dex did not serve within %v:\n%s", e2eWait, logs.String())
		}
		time.Sleep(50 * time.Millisecond) // Polling interval.
	}
}

// passwordToken gets an ID token for a user with Dex's password grant.
func (d *dexServer) passwordToken(t *testing.T, user, password string) (string, error) {
	t.Helper()
	form := url.Values{"grant_type": {"password"}, "username": {user}, "password": {password}, "scope": {"openid email profile"}}
	req, _ := http.NewRequest("POST", d.issuer+"/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(d.clientID, d.clientSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var tok struct {
		IDToken string `json:"id_token"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &tok) != nil || tok.IDToken == "" {
		return "", fmt.Errorf("dex token endpoint: %s: %s", resp.Status, body)
	}
	return tok.IDToken, nil
}

var dexForm = regexp.MustCompile(`(?s)<form[^>]*action="([^"]*)"`)

// startDexServer starts Atrium with OIDC against d on base's port.
func startDexServer(t *testing.T, d *dexServer, port int) {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv, err := server.Start(context.Background(), server.Config{
		Listen:    fmt.Sprintf("127.0.0.1:%d", port),
		PublicURL: base,
		DataDir:   t.TempDir(),
		AuthMode:  server.AuthOIDC,
		OIDC: auth.OIDCConfig{
			Issuer: d.issuer, ClientID: d.clientID, ClientSecret: d.clientSecret,
			Scopes:    []string{"openid", "email", "profile"},
			CookieKey: key,
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
}

// TestIdentity_Dex runs the server against a real Dex: a browser logs in
// through the code flow and Dex's login form, an ID token from Dex is
// accepted as a bearer token and names the same user, a session made one
// way is seen the other, and a wrong password or a token for another
// audience gets nothing.
func TestIdentity_Dex(t *testing.T) {
	port := loopbackPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	d := startDex(t, base+"/auth/callback")
	startDexServer(t, d, port)

	// An ID token from Dex's password grant is a bearer token.
	tok, err := d.passwordToken(t, "alice@example.com", "password")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", base+"/v1/sessions", strings.NewReader(`{"title":"from dex"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var created struct {
		ID    string `json:"id"`
		Owner string `json:"owner"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(body, &created) != nil || created.Owner != "alice@example.com" {
		t.Fatalf("create with Dex's ID token: %s %s, want 201 owned by alice@example.com", resp.Status, body)
	}
	if _, err := d.passwordToken(t, "alice@example.com", "wrong"); err == nil {
		t.Errorf("dex gave a token for a wrong password")
	}
	if resp, body := bearerGet(t, base+"/v1/sessions", tok[:len(tok)-4]+"AAAA"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a token with a broken signature: %s %s, want 401", resp.Status, body)
	}

	// A browser logs in through Dex's own login form.
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Jar: jar, Transport: tr}
	resp, err = hc.Get(base + "/auth/login?next=/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := dexForm.FindSubmatch(page)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Request.URL.String(), d.issuer) || m == nil {
		t.Fatalf("login did not reach Dex's form: %s at %s", resp.Status, resp.Request.URL)
	}
	action, err := resp.Request.URL.Parse(strings.ReplaceAll(string(m[1]), "&amp;", "&"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err = hc.PostForm(action.String(), url.Values{"login": {"alice@example.com"}, "password": {"password"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.String() != base+"/" {
		t.Fatalf("login ended at %s with %s, want %s/", resp.Request.URL, resp.Status, base)
	}
	w := &webUser{t: t, base: base, hc: hc}
	status, list := w.do("GET", "/v1/sessions", "", "")
	if status != http.StatusOK {
		t.Fatalf("list with the login cookie: %d %v", status, list)
	}
	sessions, _ := list["sessions"].([]any)
	if len(sessions) != 1 || sessions[0].(map[string]any)["id"] != created.ID {
		t.Errorf("the browser's list %v, want the session made with the bearer token", list)
	}
	if status, _ := w.do("POST", "/v1/sessions", base, `{"title":"from the browser"}`); status != http.StatusCreated {
		t.Errorf("create from the browser: %d", status)
	}
}

// TestIdentity_DexTokenExpiry: a WebSocket opened with a Dex ID token is
// closed when the token expires (1008 "credentials expired"; issue 20
// finding 1), and the expired token is then refused.
func TestIdentity_DexTokenExpiry(t *testing.T) {
	port := loopbackPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	d := startDexExpiring(t, base+"/auth/callback", "4s")
	startDexServer(t, d, port)
	tok, err := d.passwordToken(t, "alice@example.com", "password")
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	parts := strings.Split(tok, ".")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(payload, &claims) != nil || claims.Exp == 0 {
		t.Fatalf("dex's ID token has no exp: %v %s", err, payload)
	}
	req, _ := http.NewRequest("POST", base+"/v1/sessions", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sess struct {
		ID string `json:"id"`
	}
	json.NewDecoder(resp.Body).Decode(&sess)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %s", resp.Status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://127.0.0.1:"+fmt.Sprint(port)+"/v1/sessions/"+sess.ID+"/ws", &websocket.DialOptions{
		Subprotocols: []string{"atrium.v1"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	for {
		if _, _, err = ws.Read(ctx); err != nil {
			break
		}
	}
	ce, ok := errors.AsType[websocket.CloseError](err)
	if !ok || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "credentials expired") {
		t.Fatalf("the WebSocket ended with %v, want 1008 credentials expired", err)
	}
	if now := time.Now().Unix(); now < claims.Exp {
		t.Errorf("closed at %d, before the token's expiry %d", now, claims.Exp)
	}
	if resp, body := bearerGet(t, base+"/v1/sessions", tok); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the expired Dex token: %s %s, want 401", resp.Status, body)
	}
}
