package gateway_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// startOIDC starts an in-process OIDC provider (mockoidc) on loopback and
// returns it with an authenticator of its ID tokens.
func startOIDC(t *testing.T) (*mockoidc.MockOIDC, *auth.OIDC) {
	t.Helper()
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Keypair.KeyID(); err != nil { // mockoidc sets Kid lazily: set it before its goroutines read it
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
	o, err := auth.NewOIDC(context.Background(), auth.OIDCConfig{
		Issuer:       m.Issuer(),
		ClientID:     m.ClientID,
		ClientSecret: m.ClientSecret,
		RedirectURL:  "http://127.0.0.1:1/auth/callback",
		Scopes:       []string{"openid", "email"},
		CookieKey:    []byte("0123456789abcdef0123456789abcdef"),
		CLIClientID:  "atrium-cli",
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return m, o
}

// authOnly hides an authenticator's login routes (which clash with the dev
// identity's that the shared helpers use).
type authOnly struct{ a auth.Authenticator }

func (a authOnly) Authenticate(r *http.Request) (session.Principal, error) {
	return a.a.Authenticate(r)
}

// idToken returns an ID token of m for user that expires at exp.
func idToken(t *testing.T, m *mockoidc.MockOIDC, user string, exp time.Time) string {
	t.Helper()
	tok, err := m.Keypair.SignJWT(jwt.MapClaims{
		"iss": m.Issuer(), "aud": m.ClientID, "sub": user,
		"iat": time.Now().Unix(), "exp": exp.Unix(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Issue 20 finding 1: a WebSocket or SSE stream opened with an OIDC ID token
// is closed when the token expires, not kept open past it.
func TestIdentity_IDTokenConnectionsCloseAtExpiry(t *testing.T) {
	m, o := startOIDC(t)
	e := newEnv(t, func(c *gateway.Config) { c.Auth = auth.Chain(authOnly{o}, &auth.Dev{}) })

	exp := time.Now().Add(3 * time.Second).Truncate(time.Second)
	short := token(idToken(t, m, "ivy", exp))
	long := token(idToken(t, m, "ivy", time.Now().Add(time.Hour)))
	id := e.sessionOf(short, nil)

	ws, code := e.dialAs(id, short, 0)
	if ws == nil {
		t.Fatalf("dial: %d", code)
	}
	ws.nextOf(session.FrameHello)
	kept, code := e.dialAs(id, long, 0)
	if kept == nil {
		t.Fatalf("dial: %d", code)
	}
	kept.nextOf(session.FrameHello)
	sse := e.stream(id, "", http.Header{"Authorization": {string(short)}}, "")
	sse.next()

	ce := ws.closed()
	if ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "credentials expired") {
		t.Fatalf("close %v", ce)
	}
	if now := time.Now(); now.Before(exp) {
		t.Fatalf("closed at %s, before the token's expiry %s", now, exp)
	}
	var lines []string
	for {
		l, ok := sse.line()
		if !ok {
			break
		}
		lines = append(lines, l)
	}
	if !strings.Contains(strings.Join(lines, "\n"), ": closing: credentials expired") {
		t.Fatalf("SSE stream ended without saying why: %q", lines)
	}
	// The expired token is refused outright, and the connection of the
	// token that has not expired lives on.
	if ws, code := e.dialAs(id, short, 0); ws != nil || code != 401 {
		t.Fatalf("dial with the expired token: %d", code)
	}
	kept.send(map[string]string{"type": "prompt", "text": "still here", "client_id": "k1"})
	if ack := kept.find(session.FrameAck); ack["client_id"] != "k1" {
		t.Fatalf("ack %v", ack)
	}
}
