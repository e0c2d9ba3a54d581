package auth_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// byHeader answers with the error the request's X-Answer header names.
type byHeader struct{ calls atomic.Int64 }

func (b *byHeader) Authenticate(r *http.Request) (session.Principal, error) {
	b.calls.Add(1)
	switch r.Header.Get("X-Answer") {
	case "ok":
		return session.Principal{User: "ann"}, nil
	case "bad":
		return session.Principal{}, session.Errorf(session.CodeUnauthenticated, "unknown or revoked token")
	case "forbidden":
		return session.Principal{}, session.Errorf(session.CodeForbidden, "no tenant")
	case "down":
		return session.Principal{}, session.Errorf(session.CodeUnavailable, "down")
	}
	return session.Principal{}, auth.ErrNoCredentials
}

func from(addr, answer string) *http.Request {
	r := httptest.NewRequest("GET", "/v1/sessions", nil)
	r.RemoteAddr = addr
	r.Header.Set("X-Answer", answer)
	return r
}

func TestThrottled(t *testing.T) {
	inner := &byHeader{}
	a := auth.Throttled(inner, &auth.Throttle{Failures: 3, Window: time.Minute, Now: clk.Now})
	try := func(addr, answer string) error {
		t.Helper()
		_, err := a.Authenticate(from(addr, answer))
		return err
	}
	throttledFor := func(err error) time.Duration {
		t.Helper()
		var te *auth.ThrottledError
		if !errors.As(err, &te) || !errors.Is(err, session.ErrTooManyRequests) ||
			session.AsError(err).Code != session.CodeTooManyRequests {
			t.Fatalf("not throttled: %v", err)
		}
		if !strings.Contains(err.Error(), "too many failed logins from this address as this identity: retry in") {
			t.Fatalf("message %q", err)
		}
		return te.RetryAfter()
	}

	// Answers that are not failures never throttle.
	for range 10 {
		for _, answer := range []string{"none", "forbidden", "down", "ok"} {
			if err := try("192.0.2.1:1", answer); errors.Is(err, session.ErrTooManyRequests) {
				t.Fatalf("%s throttled", answer)
			}
		}
	}
	// Failures spread wider than the window do not throttle either.
	for range 5 {
		if err := try("192.0.2.1:1", "bad"); !errors.Is(err, session.ErrUnauthenticated) {
			t.Fatal(err)
		}
		clk.Advance(31 * time.Second)
	}

	// Three failures within a minute: refused for a minute after the last.
	for i := range 3 {
		if err := try("192.0.2.7:1", "bad"); !errors.Is(err, session.ErrUnauthenticated) {
			t.Fatalf("failure %d: %v", i, err)
		}
		clk.Advance(time.Second)
	}
	if d := throttledFor(try("192.0.2.7:2", "bad")); d != 59*time.Second {
		t.Fatalf("retry after %v", d)
	}
	// Others are not affected, and their successes do not help the address.
	if err := try("192.0.2.8:1", "ok"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second)
	if d := throttledFor(try("192.0.2.7:3", "bad")); d != 29*time.Second {
		t.Fatalf("retry after %v", d)
	}
	// A valid credential is never locked out, and clears the address.
	if err := try("192.0.2.7:3", "ok"); err != nil {
		t.Fatalf("a valid credential was refused: %v", err)
	}
	for i := range 3 {
		if err := try("192.0.2.7:3", "bad"); !errors.Is(err, session.ErrUnauthenticated) {
			t.Fatalf("failure %d after a success: %v", i, err)
		}
	}
	throttledFor(try("192.0.2.7:3", "bad"))
	// When the time is up, the address's failures are 401s again.
	clk.Advance(time.Minute)
	if err := try("192.0.2.7:4", "bad"); !errors.Is(err, session.ErrUnauthenticated) {
		t.Fatal(err)
	}

	// An IPv6 host is its /64.
	for _, addr := range []string{"[2001:db8:1:2::1]:1", "[2001:db8:1:2::2]:1", "[2001:db8:1:2:ffff::3]:1"} {
		_ = try(addr, "bad")
	}
	throttledFor(try("[2001:db8:1:2:abcd::9]:1", "bad"))
	if err := try("[2001:db8:1:3::1]:1", "bad"); !errors.Is(err, session.ErrUnauthenticated) {
		t.Fatal(err)
	}
}

func TestThrottled_ExpiredIsNotAGuess(t *testing.T) {
	e := newEnv(t, envOpt{throttle: &auth.Throttle{Failures: 2, Now: clk.Now}})
	expired := e.p.signer().sign(t, e.p.claims(map[string]any{"exp": clk.Now().Add(-time.Minute).Unix()}))
	for range 5 {
		if _, err := e.bearer(expired); !errors.Is(err, session.ErrUnauthenticated) {
			t.Fatalf("got %v", err)
		}
	}
	if _, err := e.bearer(e.p.signer().sign(t, e.p.claims(nil))); err != nil {
		t.Fatalf("an expired token counted as a failure: %v", err)
	}
}

func TestThrottled_HTTP(t *testing.T) {
	e := newEnv(t, envOpt{throttle: &auth.Throttle{Failures: 3, Window: 2 * time.Minute, Now: clk.Now}})
	b := newBrowser(t)
	forged := newSigner(t, "guess").sign(t, e.p.claims(nil))
	for i := range 3 {
		h := b.do("GET", e.srv.URL+"/v1/whoami", http.Header{"Authorization": {"Bearer " + forged}})
		if h.StatusCode != 401 {
			t.Fatalf("attempt %d: %d %s", i, h.StatusCode, h.body)
		}
	}
	// Another forgery as the same subject waits.
	h := b.do("GET", e.srv.URL+"/v1/whoami", http.Header{"Authorization": {"Bearer " + forged}})
	if h.StatusCode != http.StatusTooManyRequests || h.Header.Get("Retry-After") != "120" ||
		!contains(h.body, `"too_many_requests"`, "retry in 120s") {
		t.Fatalf("%d Retry-After %q: %s", h.StatusCode, h.Header.Get("Retry-After"), h.body)
	}
	// The right credentials never wait.
	if h := b.do("GET", e.srv.URL+"/v1/whoami", http.Header{"Authorization": {"Bearer " + e.p.signer().sign(t, e.p.claims(nil))}}); h.StatusCode != 200 {
		t.Fatalf("a valid token was refused: %d %s", h.StatusCode, h.body)
	}
	// The throttled chain still serves its routes and refreshes.
	if e.a.(auth.Describer).Describe().Mode != auth.ModeOIDC {
		t.Fatal("throttled chain does not describe OIDC")
	}
	clk.Advance(2 * time.Minute)
	e.login(b, ann(), "/")
	if _, p, err := e.whoami(b); err != nil || p.User != "ann@example.com" {
		t.Fatalf("%+v %v", p, err)
	}
}

// TestThrottled_BehindProxy is issue 20's second finding: behind the shipped
// ingress every request came from the ingress's address, so ten bad
// requests of one outsider gave every user 429.
func TestThrottled_BehindProxy(t *testing.T) {
	proxies, err := auth.ParseTrustedProxies([]string{"10.0.0.0/8", "fd00::1"})
	if err != nil {
		t.Fatal(err)
	}
	inner := &byHeader{}
	a := auth.Throttled(inner, &auth.Throttle{Failures: 3, Window: time.Minute, Now: clk.Now})
	var lastRemote string
	h := proxies.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastRemote = r.RemoteAddr
		if _, err := a.Authenticate(r); err != nil {
			w.WriteHeader(session.AsError(err).Code.HTTPStatus())
		}
	}))
	// via sends a request from peer with an X-Forwarded-For header (if
	// xff is set) and an Authorization header, answered answer.
	via := func(peer, xff, authz, answer string) int {
		t.Helper()
		r := from(peer, answer)
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		r.Header.Set("Authorization", authz)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	tokA := "Bearer atr_" + strings.Repeat("a", 16) + "_" + strings.Repeat("x", 52)
	tokB := "Bearer atr_" + strings.Repeat("b", 16) + "_" + strings.Repeat("x", 52)
	// An outsider fails ten times through the ingress, as token a.
	for range 10 {
		via("10.1.1.1:4000", "203.0.113.9", tokA, "bad")
	}
	if got := via("10.1.1.1:4000", "203.0.113.9", tokA, "bad"); got != 429 {
		t.Fatalf("the outsider: %d, want 429", got)
	}
	if lastRemote != "203.0.113.9:0" {
		t.Fatalf("RemoteAddr behind the proxy is %q, want the client's", lastRemote)
	}
	// Everybody else behind the same ingress is unaffected.
	if got := via("10.1.1.1:4000", "198.51.100.2", tokA, "bad"); got != 401 {
		t.Fatalf("another client through the ingress: %d, want 401", got)
	}
	if got := via("10.1.1.1:4000", "198.51.100.2", tokA, "ok"); got != 200 {
		t.Fatalf("another client through the ingress, valid: %d, want 200", got)
	}
	// The outsider's other claimed identities are their own pairs.
	if got := via("10.1.1.1:4000", "203.0.113.9", tokB, "bad"); got != 401 {
		t.Fatalf("the outsider as token b: %d, want 401", got)
	}
	// A client cannot choose its address by sending X-Forwarded-For: the
	// ingress appends the address it saw, and that is the one used.
	if got := via("10.1.1.1:4000", "198.51.100.2, 203.0.113.9", tokA, "bad"); got != 429 {
		t.Fatalf("the outsider with a forged X-Forwarded-For: %d, want 429", got)
	}
	// Several trusted hops: the nearest untrusted address is the client.
	if got := via("10.1.1.1:4000", "203.0.113.9, 10.2.2.2", tokA, "bad"); got != 429 {
		t.Fatalf("the outsider through two proxies: %d, want 429", got)
	}
	// A peer that is not a trusted proxy is its own client, whatever it says.
	if got := via("192.0.2.50:1", "198.51.100.2", tokA, "bad"); got != 401 || lastRemote != "192.0.2.50:1" {
		t.Fatalf("an untrusted peer claiming to forward: %d as %q", got, lastRemote)
	}
	// A valid credential of the throttled outsider's pair still passes.
	if got := via("10.1.1.1:4000", "203.0.113.9", tokA, "ok"); got != 200 {
		t.Fatalf("a valid credential from the throttled pair: %d, want 200", got)
	}
}

func TestParseTrustedProxies(t *testing.T) {
	if _, err := auth.ParseTrustedProxies([]string{"10.0.0.0/8", " 127.0.0.1 ", "::1", "fd00::/8", ""}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"10.0.0.0/33", "proxy.example", "10.0.0"} {
		if _, err := auth.ParseTrustedProxies([]string{bad}); err == nil || !strings.Contains(err.Error(), "CIDR") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
