package auth_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// clock is a settable time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// tokenNATS runs an in-process nats-server with JetStream and connects to it.
func tokenNATS(t testing.TB) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		DontListen: true, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	t.Cleanup(func() {
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return nc
}

func newTokens(t testing.TB, nc *nats.Conn, clk *clock, tune ...func(*auth.TokensConfig)) *auth.Tokens {
	t.Helper()
	cfg := auth.TokensConfig{NATS: nc, Now: clk.Now}
	for _, f := range tune {
		f(&cfg)
	}
	ts, err := auth.NewTokens(cfg)
	if err != nil {
		t.Fatalf("new tokens: %v", err)
	}
	return ts
}

func newClock() *clock { return &clock{now: time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)} }

var (
	alice = session.Principal{User: "alice", Tenant: "acme", Via: session.ViaOIDC}
	bob   = session.Principal{User: "bob", Tenant: "acme", Via: session.ViaCookie}
	ada   = session.Principal{User: "ada", Tenant: "acme", Admin: true, Via: session.ViaOIDC}
	gil   = session.Principal{User: "gil", Tenant: "globex", Admin: true, Via: session.ViaOIDC}
)

func create(t testing.TB, ts *auth.Tokens, by session.Principal, req auth.TokenRequest) (string, auth.TokenInfo) {
	t.Helper()
	tok, info, err := ts.Create(context.Background(), by, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return tok, info
}

// authenticate runs a request with header Authorization: value.
func authenticate(ts *auth.Tokens, value string) (session.Principal, error) {
	r := httptest.NewRequest("GET", "/v1/whoami", nil)
	if value != "" {
		r.Header.Set("Authorization", value)
	}
	return ts.Authenticate(r)
}

// refused checks that err is unauthenticated and says want.
func refused(t testing.TB, err error, want string) {
	t.Helper()
	if !errors.Is(err, session.ErrUnauthenticated) || errors.Is(err, auth.ErrNoCredentials) {
		t.Fatalf("got %v, want an unauthenticated error", err)
	}
	if !strings.Contains(session.AsError(err).Message, want) {
		t.Fatalf("message %q does not say %q", session.AsError(err).Message, want)
	}
}

func TestTokens_CreateAndUse(t *testing.T) {
	nc := tokenNATS(t)
	clk := newClock()
	ts := newTokens(t, nc, clk)
	exp := clk.Now().Add(time.Hour)
	tok, info := create(t, ts, ada, auth.TokenRequest{Name: "ci bot", Role: session.RoleDriver, ExpiresAt: exp})

	parts := strings.Split(tok, "_")
	if len(parts) != 3 || parts[0] != "atr" || parts[1] != info.ID || len(parts[2]) < 26 {
		t.Fatalf("token %q does not look like atr_<id>_<secret>", tok)
	}
	if info.Name != "ci bot" || info.User != "ada" || info.Tenant != "acme" || info.Role != session.RoleDriver ||
		!info.CreatedAt.Equal(clk.Now()) || !info.ExpiresAt.Equal(exp) || !info.LastUsedAt.IsZero() {
		t.Fatalf("info %+v", info)
	}
	p, err := authenticate(ts, "Bearer "+tok)
	if err != nil {
		t.Fatalf("authenticate: %v", err)
	}
	want := session.Principal{User: "ada", Tenant: "acme", Admin: true, Cap: session.RoleDriver, Via: session.ViaToken, Expires: exp}
	if p != want {
		t.Fatalf("principal %+v, want %+v", p, want)
	}
	if p, err := authenticate(ts, "bearer "+tok); err != nil || p.User != "ada" {
		t.Errorf("lower-case scheme: %v", err)
	}

	t.Run("only the hash is stored", func(t *testing.T) {
		js, _ := jetstream.New(nc)
		kv, err := js.KeyValue(context.Background(), auth.DefaultTokensBucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(context.Background(), info.ID)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(e.Value()), parts[2]) || !strings.Contains(string(e.Value()), `"hash":`) {
			t.Fatalf("record %s", e.Value())
		}
	})
	t.Run("not mine", func(t *testing.T) {
		for _, h := range []string{"", "Bearer dev:alice", "Bearer eyJhbGciOi.x.y", "Basic YTpi"} {
			if _, err := authenticate(ts, h); !errors.Is(err, auth.ErrNoCredentials) {
				t.Errorf("%q: %v, want no credentials", h, err)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		other := tokenOf(t, parts[1], strings.Repeat("a", len(parts[2])))
		unknown := tokenOf(t, strings.Repeat("b", len(parts[1])), parts[2])
		for name, c := range map[string]struct{ tok, want string }{
			"wrong secret":   {other, "unknown or revoked"},
			"unknown id":     {unknown, "unknown or revoked"},
			"no secret":      {"atr_" + parts[1], "malformed"},
			"short secret":   {tok[:len(tok)-1], "malformed"},
			"bad characters": {"atr_" + parts[1] + "_" + strings.Repeat("A", len(parts[2])), "malformed"},
			"extra part":     {tok + "_x", "malformed"},
		} {
			t.Run(name, func(t *testing.T) {
				_, err := authenticate(ts, "Bearer "+c.tok)
				refused(t, err, c.want)
			})
		}
	})
	t.Run("expired", func(t *testing.T) {
		clk.Add(time.Hour)
		_, err := authenticate(ts, "Bearer "+tok)
		refused(t, err, "expired at "+exp.Format(time.RFC3339))
	})
}

// tokenOf builds a token string from its parts.
func tokenOf(t testing.TB, id, secret string) string {
	t.Helper()
	return auth.TokenPrefix + id + "_" + secret
}

func TestTokens_CreateRules(t *testing.T) {
	nc := tokenNATS(t)
	clk := newClock()
	ts := newTokens(t, nc, clk, func(c *auth.TokensConfig) { c.MaxPerUser = 3 })

	t.Run("a token cannot create tokens", func(t *testing.T) {
		byToken := alice
		byToken.Via = session.ViaToken
		_, _, err := ts.Create(context.Background(), byToken, auth.TokenRequest{Name: "x"})
		if !errors.Is(err, session.ErrForbidden) || session.AsError(err).Message != "API tokens cannot create tokens: log in" {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("cap no higher than the creator's", func(t *testing.T) {
		capped := alice
		capped.Cap = session.RoleViewer
		if _, _, err := ts.Create(context.Background(), capped, auth.TokenRequest{Name: "x", Role: session.RoleDriver}); !errors.Is(err, session.ErrForbidden) {
			t.Fatalf("driver token from a viewer-capped creator: %v", err)
		}
		_, info := create(t, ts, capped, auth.TokenRequest{Name: "inherits"})
		if info.Role != session.RoleViewer {
			t.Fatalf("uncapped request from a capped creator got role %q", info.Role)
		}
	})
	t.Run("admin only from an admin", func(t *testing.T) {
		tok, _ := create(t, ts, bob, auth.TokenRequest{Name: "plain"})
		if p, err := authenticate(ts, "Bearer "+tok); err != nil || p.Admin || p.Cap != session.RoleNone {
			t.Fatalf("bob's token: %+v %v", p, err)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		for name, req := range map[string]auth.TokenRequest{
			"no name":      {},
			"blank name":   {Name: "  "},
			"long name":    {Name: strings.Repeat("n", auth.MaxTokenNameBytes+1)},
			"control char": {Name: "a\nb"},
			"padded name":  {Name: " x "},
			"unknown role": {Name: "x", Role: "admin"},
			"past expiry":  {Name: "x", ExpiresAt: clk.Now().Add(-time.Second)},
			"now expiry":   {Name: "x", ExpiresAt: clk.Now()},
		} {
			if _, _, err := ts.Create(context.Background(), alice, req); !errors.Is(err, session.ErrBadRequest) {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
	t.Run("at most MaxPerUser", func(t *testing.T) {
		for i := range 2 { // alice has one already (inherits)
			create(t, ts, alice, auth.TokenRequest{Name: "n" + string(rune('a'+i))})
		}
		if _, _, err := ts.Create(context.Background(), alice, auth.TokenRequest{Name: "one too many"}); !errors.Is(err, session.ErrConflict) {
			t.Fatalf("got %v", err)
		}
		create(t, ts, bob, auth.TokenRequest{Name: "others still may"})
	})
}

func TestTokens_ListAndRevoke(t *testing.T) {
	nc := tokenNATS(t)
	clk := newClock()
	ts := newTokens(t, nc, clk)
	aliceTok, a1 := create(t, ts, alice, auth.TokenRequest{Name: "a1"})
	clk.Add(time.Second)
	_, a2 := create(t, ts, alice, auth.TokenRequest{Name: "a2"})
	clk.Add(-time.Millisecond) // older than a2, newer than a1
	bobTok, b1 := create(t, ts, bob, auth.TokenRequest{Name: "b1"})
	_, g1 := create(t, ts, gil, auth.TokenRequest{Name: "g1"})

	ids := func(infos []auth.TokenInfo) string {
		var s []string
		for _, i := range infos {
			s = append(s, i.Name)
		}
		return strings.Join(s, ",")
	}
	for name, c := range map[string]struct {
		by   session.Principal
		all  bool
		want string
	}{
		"own":              {alice, false, "a2,a1"},
		"own of another":   {bob, false, "b1"},
		"admin's own":      {ada, false, ""},
		"admin, tenant":    {ada, true, "a2,b1,a1"},
		"other tenant":     {gil, true, "g1"},
		"same name, other": {session.Principal{User: "alice", Tenant: "globex"}, false, ""},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ts.List(context.Background(), c.by, c.all)
			if err != nil {
				t.Fatal(err)
			}
			if ids(got) != c.want {
				t.Fatalf("got %q, want %q", ids(got), c.want)
			}
		})
	}
	if _, err := ts.List(context.Background(), alice, true); !errors.Is(err, session.ErrForbidden) {
		t.Errorf("non-admin listing all: %v", err)
	}

	t.Run("revoke rules", func(t *testing.T) {
		byToken := alice
		byToken.Via = session.ViaToken
		if _, err := ts.Revoke(context.Background(), byToken, a2.ID); !errors.Is(err, session.ErrForbidden) {
			t.Errorf("by token: %v", err)
		}
		for name, c := range map[string]struct {
			by session.Principal
			id string
		}{
			"another user's":         {bob, a2.ID},
			"another tenant's admin": {gil, a2.ID},
			"admin of the other":     {ada, g1.ID},
			"unknown":                {alice, strings.Repeat("c", len(a1.ID))},
			"malformed":              {alice, "../x"},
		} {
			if _, err := ts.Revoke(context.Background(), c.by, c.id); !errors.Is(err, session.ErrNotFound) {
				t.Errorf("%s: %v, want not found", name, err)
			}
		}
	})
	t.Run("revoked through this store: refused at once", func(t *testing.T) {
		if _, err := authenticate(ts, "Bearer "+aliceTok); err != nil {
			t.Fatal(err)
		}
		info, err := ts.Revoke(context.Background(), alice, a1.ID)
		if err != nil || info.ID != a1.ID || info.User != "alice" {
			t.Fatalf("revoke: %+v %v", info, err)
		}
		_, err = authenticate(ts, "Bearer "+aliceTok)
		refused(t, err, "unknown or revoked")
		if _, err := ts.Revoke(context.Background(), alice, a1.ID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("second revoke: %v", err)
		}
	})
	t.Run("revoked through another gateway: refused within the cache TTL", func(t *testing.T) {
		other := newTokens(t, nc, clk)
		if _, err := authenticate(ts, "Bearer "+bobTok); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Revoke(context.Background(), ada, b1.ID); err != nil {
			t.Fatalf("admin revoke: %v", err)
		}
		clk.Add(auth.DefaultTokenCacheTTL)
		_, err := authenticate(ts, "Bearer "+bobTok)
		refused(t, err, "unknown or revoked")
	})
}

func TestTokens_LastUsed(t *testing.T) {
	nc := tokenNATS(t)
	clk := newClock()
	ts := newTokens(t, nc, clk)
	tok, info := create(t, ts, alice, auth.TokenRequest{Name: "used"})
	lastUsed := func() time.Time {
		t.Helper()
		all, err := ts.List(context.Background(), alice, false)
		if err != nil || len(all) != 1 || all[0].ID != info.ID {
			t.Fatalf("list: %+v %v", all, err)
		}
		return all[0].LastUsedAt
	}
	use := func() {
		t.Helper()
		if _, err := authenticate(ts, "Bearer "+tok); err != nil {
			t.Fatalf("use: %v", err)
		}
	}
	first := clk.Now()
	use()
	if got := lastUsed(); !got.Equal(first) {
		t.Fatalf("last_used_at %v after the first use at %v", got, first)
	}
	clk.Add(auth.DefaultTokenTouchEvery / 2)
	use()
	if got := lastUsed(); !got.Equal(first) {
		t.Fatalf("last_used_at moved to %v within a minute", got)
	}
	clk.Add(auth.DefaultTokenTouchEvery)
	use()
	if got := lastUsed(); !got.Equal(clk.Now()) {
		t.Fatalf("last_used_at %v, want %v", got, clk.Now())
	}
	// Another gateway that touched the record a moment ago is enough.
	other := newTokens(t, nc, clk)
	if _, err := authenticate(other, "Bearer "+tok); err != nil {
		t.Fatal(err)
	}
	if got := lastUsed(); !got.Equal(clk.Now()) {
		t.Fatalf("last_used_at %v", got)
	}
	if _, err := auth.NewTokens(auth.TokensConfig{}); err == nil {
		t.Error("tokens without NATS")
	}
}
