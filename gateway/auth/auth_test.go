package auth_test

import (
	"cmp"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

func request(remote, authz string, cookie *http.Cookie) *http.Request {
	r := httptest.NewRequest("GET", "/v1/sessions", nil)
	r.Host = "127.0.0.1:7080"
	r.RemoteAddr = remote
	if authz != "" {
		r.Header.Set("Authorization", authz)
	}
	if cookie != nil {
		r.AddCookie(cookie)
	}
	return r
}

func TestDev_Authenticate(t *testing.T) {
	d := &auth.Dev{Tenant: "t1"}
	login := loginCookie(t, d, "ann o'neil")
	for name, c := range map[string]struct {
		remote, authz string
		host          string // the Host header, if not 127.0.0.1:7080
		cookie        *http.Cookie
		user          string // empty: want an error
		noCreds       bool   // the error is ErrNoCredentials
		msg           string // in the error message
	}{
		"bearer ipv4":        {remote: "127.0.0.1:5000", authz: "Bearer dev:alice", user: "alice"},
		"bearer ipv6":        {remote: "[::1]:5000", authz: "bearer dev:bob", user: "bob"},
		"bearer other lo":    {remote: "127.3.4.5:5000", authz: "Bearer dev:carol", user: "carol"},
		"cookie":             {remote: "127.0.0.1:5000", cookie: login, user: "ann o'neil"},
		"not loopback":       {remote: "192.0.2.1:5000", authz: "Bearer dev:alice", msg: "loopback-only"},
		"cookie not lo":      {remote: "10.1.2.3:5000", cookie: login, msg: "loopback-only"},
		"bad user":           {remote: "127.0.0.1:5000", authz: "Bearer dev: alice", msg: "invalid dev user"},
		"empty user":         {remote: "127.0.0.1:5000", authz: "Bearer dev:", msg: "invalid dev user"},
		"not a dev token":    {remote: "127.0.0.1:5000", authz: "Bearer eyJhbGciOi", noCreds: true, msg: "dev:<user>"},
		"basic auth":         {remote: "127.0.0.1:5000", authz: "Basic YTpi", noCreds: true},
		"nothing":            {remote: "127.0.0.1:5000", noCreds: true, msg: "/auth/dev"},
		"garbage cookie":     {remote: "127.0.0.1:5000", cookie: &http.Cookie{Name: auth.DevCookie, Value: "!!"}, msg: "log in again"},
		"bearer wins (bad)":  {remote: "127.0.0.1:5000", authz: "Bearer dev:", cookie: login, msg: "invalid dev user"},
		"host localhost":     {remote: "127.0.0.1:5000", host: "localhost:7080", authz: "Bearer dev:alice", user: "alice"},
		"host sub.localhost": {remote: "127.0.0.1:5000", host: "app.localhost", authz: "Bearer dev:alice", user: "alice"},
		"host ipv6":          {remote: "[::1]:5000", host: "[::1]:7080", authz: "Bearer dev:alice", user: "alice"},
		// DNS rebinding: a page of evil.example whose name now resolves
		// to 127.0.0.1 sends its own name as the Host.
		"rebinding bearer":    {remote: "127.0.0.1:5000", host: "evil.example:7080", authz: "Bearer dev:alice", msg: "loopback name"},
		"rebinding cookie":    {remote: "127.0.0.1:5000", host: "evil.example", cookie: login, msg: "loopback name"},
		"rebinding lookalike": {remote: "127.0.0.1:5000", host: "localhost.evil.example", cookie: login, msg: "loopback name"},
	} {
		t.Run(name, func(t *testing.T) {
			r := request(c.remote, c.authz, c.cookie)
			if c.host != "" {
				r.Host = c.host
			}
			p, err := d.Authenticate(r)
			if c.user != "" {
				via := session.ViaDev
				if c.authz == "" {
					via = session.ViaCookie // a browser: the gateway's CSRF rules apply
				}
				if err != nil || p.User != c.user || p.Tenant != "t1" || p.Via != via {
					t.Fatalf("got %+v, %v", p, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("authenticated as %+v", p)
			}
			if !errors.Is(err, session.ErrUnauthenticated) {
				t.Fatalf("error %v does not match ErrUnauthenticated", err)
			}
			if errors.Is(err, auth.ErrNoCredentials) != c.noCreds {
				t.Fatalf("error %v: matches ErrNoCredentials = %v", err, !c.noCreds)
			}
			if e := session.AsError(err); e.Code != session.CodeUnauthenticated || !strings.Contains(e.Message, c.msg) {
				t.Fatalf("wire error %+v, want a message with %q", e, c.msg)
			}
		})
	}
}

// loginCookie logs in through the dev login route and returns the cookie.
func loginCookie(t *testing.T, d *auth.Dev, user string) *http.Cookie {
	t.Helper()
	mux := http.NewServeMux()
	d.Routes(mux)
	r := httptest.NewRequest("GET", "/auth/dev?user="+strings.ReplaceAll(user, " ", "+"), nil)
	r.Host = "localhost:7080"
	r.RemoteAddr = "127.0.0.1:4000"
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, r)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/" {
		t.Fatalf("login: %d %s", rec.Code, rec.Body)
	}
	cs := rec.Result().Cookies()
	if len(cs) != 1 || cs[0].Name != auth.DevCookie || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteLaxMode || cs[0].Path != "/" {
		t.Fatalf("cookies %+v", cs)
	}
	return cs[0]
}

func TestDev_Routes(t *testing.T) {
	d := &auth.Dev{}
	mux := http.NewServeMux()
	d.Routes(mux)
	for name, c := range map[string]struct {
		remote, path string
		code         int
		want         string
		host         string
	}{
		"not loopback": {"198.51.100.1:1", "/auth/dev?user=alice", 403, `"forbidden"`, ""},
		"no user":      {"127.0.0.1:1", "/auth/dev", 400, `"bad_request"`, ""},
		"bad user":     {"127.0.0.1:1", "/auth/dev?user=%09tab", 400, `"bad_request"`, ""},
		"logout":       {"127.0.0.1:1", "/auth/logout", 303, "", ""},
		"rebinding":    {"127.0.0.1:1", "/auth/dev?user=alice", 403, `loopback name`, "evil.example:7080"},
	} {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("GET", c.path, nil)
			r.Host = cmp.Or(c.host, "127.0.0.1:7080")
			r.RemoteAddr = c.remote
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, r)
			if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.want) {
				t.Fatalf("got %d %s", rec.Code, rec.Body)
			}
			if c.code == 303 {
				cs := rec.Result().Cookies()
				if len(cs) != 1 || cs[0].MaxAge >= 0 {
					t.Fatalf("logout cookies %+v", cs)
				}
			}
		})
	}
}

type fixed struct {
	p   session.Principal
	err error
}

func (f fixed) Authenticate(*http.Request) (session.Principal, error) { return f.p, f.err }

func TestChain(t *testing.T) {
	dev := &auth.Dev{}
	bad := session.Errorf(session.CodeUnauthenticated, "expired token")
	for name, c := range map[string]struct {
		chain auth.Authenticator
		authz string
		user  string
		err   error
	}{
		"first recognises": {auth.Chain(dev, fixed{p: session.Principal{User: "tok"}}), "Bearer dev:alice", "alice", nil},
		"falls through":    {auth.Chain(dev, fixed{p: session.Principal{User: "tok"}}), "Bearer abc", "tok", nil},
		"bad credentials":  {auth.Chain(fixed{err: bad}, dev), "Bearer dev:alice", "", bad},
		"nobody":           {auth.Chain(dev), "", "", auth.ErrNoCredentials},
		"empty chain":      {auth.Chain(), "Bearer dev:alice", "", auth.ErrNoCredentials},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := c.chain.Authenticate(request("127.0.0.1:1", c.authz, nil))
			if p.User != c.user || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
				t.Fatalf("got %+v, %v", p, err)
			}
			// A bearer nobody recognises is an invalid token, not "no
			// credentials": the caller sent some.
			if err != nil && c.authz != "" && errors.Is(err, auth.ErrNoCredentials) &&
				!strings.HasPrefix(session.AsError(err).Message, "invalid token") {
				t.Fatalf("a bearer nobody recognises: %q, want it called an invalid token", session.AsError(err).Message)
			}
		})
	}
	mux := http.NewServeMux()
	auth.Chain(fixed{}, dev).(auth.Router).Routes(mux)
	if _, pattern := mux.Handler(httptest.NewRequest("GET", "/auth/dev?user=a", nil)); pattern != "GET /auth/dev" {
		t.Fatalf("chain did not register the dev login route: %q", pattern)
	}
	if _, pattern := mux.Handler(httptest.NewRequest("GET", "/auth/config", nil)); pattern != "GET /auth/config" {
		t.Fatalf("chain did not register /auth/config: %q", pattern)
	}
	if got := dev.Describe(); got.Mode != auth.ModeDev || got.LoginURL != "/auth/dev" || got.Issuer != "" {
		t.Fatalf("dev describes itself as %+v", got)
	}
	// A chain with no Refresher member passes requests through untouched.
	called := false
	h := auth.Chain(fixed{}, dev).(auth.Refresher).Refresh(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	if !called {
		t.Fatal("Refresh did not call next")
	}
}

func TestDev_DescribeSuggestsUser(t *testing.T) {
	if got := (&auth.Dev{User: "ann"}).Describe(); got.Mode != auth.ModeDev || got.DevUser != "ann" {
		t.Fatalf("%+v", got)
	}
	if got := auth.Chain(&auth.Dev{User: "ann"}).(auth.Describer).Describe(); got.DevUser != "ann" {
		t.Fatalf("chain: %+v", got)
	}
}
