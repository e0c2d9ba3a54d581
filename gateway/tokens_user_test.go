package gateway_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// Issue 20 finding 6: API tokens expire by default, grant no more than their
// owner's latest login claims, stop working when the owner has not logged in
// for the configured time, and all of a user's tokens can be revoked at once.
func TestIdentity_TokensFollowOwner(t *testing.T) {
	var skew atomic.Int64 // added to the token store's clock
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	e := newIDEnv(t, func(c *gateway.Config) {
		tokens, err := auth.NewTokens(auth.TokensConfig{NATS: c.NATS, Bucket: "atrium_tokens", Now: now, LoginMaxAge: time.Hour, CacheTTL: -1})
		if err != nil {
			t.Fatal(err)
		}
		c.Tokens = tokens
	})

	t.Run("default expiry", func(t *testing.T) {
		var got struct {
			Token string
			Info  auth.TokenInfo
		}
		e.must(201, "POST", "/v1/tokens", as("olive", "acme"), map[string]string{"name": "ci"}, &got)
		want := time.Now().Add(auth.DefaultTokenTTL)
		if d := got.Info.ExpiresAt.Sub(want); d < -time.Minute || d > time.Minute {
			t.Fatalf("expires_at %s, want about %s", got.Info.ExpiresAt, want)
		}
	})

	t.Run("capped by the latest login", func(t *testing.T) {
		tok := token(e.mintToken(admin("ada", "acme"), "admin-bot", ""))
		e.must(200, "GET", "/v1/audit", tok, nil, nil)
		// ada logs in without the admin group: her token is no admin either.
		e.must(200, "GET", "/v1/whoami", as("ada", "acme"), nil, nil)
		if code, b := e.req("GET", "/v1/audit", tok, nil); code != 403 {
			t.Fatalf("token of a former admin reads the audit log: %d %s", code, b)
		}
		var who session.Principal
		e.must(200, "GET", "/v1/whoami", tok, nil, &who)
		if who.Admin {
			t.Fatalf("whoami %+v", who)
		}
		// Back in the group: the token is an admin's again (never more than
		// when it was made).
		e.must(200, "GET", "/v1/whoami", admin("ada", "acme"), nil, nil)
		e.must(200, "GET", "/v1/audit", tok, nil, nil)
		// A token made by a non-admin never becomes an admin's.
		plain := token(e.mintToken(as("ada", "acme"), "plain", ""))
		e.must(200, "GET", "/v1/whoami", admin("ada", "acme"), nil, nil)
		if code, _ := e.req("GET", "/v1/audit", plain, nil); code != 403 {
			t.Fatalf("plain token reads the audit log: %d", code)
		}
	})

	t.Run("owner gone from the IdP", func(t *testing.T) {
		tok := token(e.mintToken(as("gus", "acme"), "bot", ""))
		e.must(200, "GET", "/v1/whoami", tok, nil, nil)
		skew.Add(int64(2 * time.Hour)) // gus has not logged in for two hours
		code, b := e.req("GET", "/v1/whoami", tok, nil)
		if code != 401 || !strings.Contains(string(b), "has not logged in since") {
			t.Fatalf("token of an owner who stopped logging in: %d %s", code, b)
		}
		e.must(200, "GET", "/v1/whoami", as("gus", "acme"), nil, nil) // gus logs in again
		e.must(200, "GET", "/v1/whoami", tok, nil, nil)
	})

	t.Run("revoke every token of a user", func(t *testing.T) {
		b1 := token(e.mintToken(as("bob", "acme"), "one", ""))
		b2 := token(e.mintToken(as("bob", "acme"), "two", ""))
		c1 := token(e.mintToken(as("cy", "acme"), "one", ""))
		other := token(e.mintToken(as("bob", "globex"), "other tenant", ""))
		if code, _ := e.req("DELETE", "/v1/tokens?user=cy", as("bob", "acme"), nil); code != 403 {
			t.Fatalf("bob revoking cy's tokens: %d", code)
		}
		if code, _ := e.req("DELETE", "/v1/tokens?user=bob", b1, nil); code != 403 {
			t.Fatalf("a token revoking tokens: %d", code)
		}
		var got struct{ Tokens []auth.TokenInfo }
		e.must(200, "DELETE", "/v1/tokens?user=bob", admin("ada", "acme"), nil, &got)
		if len(got.Tokens) != 2 {
			t.Fatalf("revoked %+v", got.Tokens)
		}
		for _, c := range []cred{b1, b2} {
			if code, _ := e.req("GET", "/v1/whoami", c, nil); code != 401 {
				t.Fatalf("revoked token: %d", code)
			}
		}
		e.must(200, "GET", "/v1/whoami", c1, nil, nil)
		e.must(200, "GET", "/v1/whoami", other, nil, nil)
	})
}
