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
		if !strings.Contains(err.Error(), "too many failed logins from this address: retry in") {
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
	calls := inner.calls.Load()
	if d := throttledFor(try("192.0.2.7:2", "ok")); d != 59*time.Second {
		t.Fatalf("retry after %v", d)
	}
	if inner.calls.Load() != calls {
		t.Fatal("a throttled request reached the authenticator")
	}
	// Others are not affected, and their successes do not help the address.
	if err := try("192.0.2.8:1", "ok"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second)
	if d := throttledFor(try("192.0.2.7:3", "bad")); d != 29*time.Second {
		t.Fatalf("retry after %v", d)
	}
	// When the time is up, the address may try again.
	clk.Advance(30 * time.Second)
	if err := try("192.0.2.7:4", "ok"); err != nil {
		t.Fatal(err)
	}

	// An IPv6 host is its /64.
	for _, addr := range []string{"[2001:db8:1:2::1]:1", "[2001:db8:1:2::2]:1", "[2001:db8:1:2:ffff::3]:1"} {
		_ = try(addr, "bad")
	}
	throttledFor(try("[2001:db8:1:2:abcd::9]:1", "ok"))
	if err := try("[2001:db8:1:3::1]:1", "ok"); err != nil {
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
	// Now even the right credentials wait.
	h := b.do("GET", e.srv.URL+"/v1/whoami", http.Header{"Authorization": {"Bearer " + e.p.signer().sign(t, e.p.claims(nil))}})
	if h.StatusCode != http.StatusTooManyRequests || h.Header.Get("Retry-After") != "120" ||
		!contains(h.body, `"too_many_requests"`, "retry in 120s") {
		t.Fatalf("%d Retry-After %q: %s", h.StatusCode, h.Header.Get("Retry-After"), h.body)
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
