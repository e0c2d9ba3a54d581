package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Defaults of Throttle.
const (
	DefaultThrottleFailures = 10
	DefaultThrottleWindow   = time.Minute
	DefaultThrottleAddrs    = 100000
)

// Throttle pushes back on a client that keeps failing to authenticate as one
// identity: a (client address, claimed identity) pair that fails Failures
// times within Window gets 429 with Retry-After for Window after the last of
// those failures, instead of 401. The address is an IPv4 address or an IPv6
// /64 (one host's usual allocation); put a TrustedProxies.Handler in front so
// that it is the real client's and not the proxy's. The claimed identity is
// what the credential says it is before it is checked (an API token's id, a
// JWT's subject, a dev user), so one client's bad requests never touch other
// users behind the same proxy or NAT.
//
// A valid credential is never locked out: a throttled pair's credential is
// still checked, and one that is valid passes (and clears the pair's
// failures). Every credential Atrium accepts is a 256-bit secret or a
// signature, so the answer to a guess tells nothing useful.
//
// The zero value is ready to use; set the fields before first use.
type Throttle struct {
	// Failures is how many failures within Window throttle an address;
	// default DefaultThrottleFailures.
	Failures int
	// Window is both the period failures are counted over and how long a
	// throttled address waits; default DefaultThrottleWindow.
	Window time.Duration
	// MaxAddrs bounds the addresses tracked; default DefaultThrottleAddrs.
	// When full, addresses that are not throttled are forgotten first.
	MaxAddrs int
	// Now is the clock; default time.Now.
	Now func() time.Time

	mu     sync.Mutex
	addrs  map[string]*strikes // guarded by mu
	pruned time.Time           // guarded by mu
}

// strikes are one address's recent failures.
type strikes struct {
	n     int
	since time.Time // the first failure counted
	until time.Time // refused until then
}

func (t *Throttle) settings() (failures int, window time.Duration, max int, now time.Time) {
	failures, window, max = t.Failures, t.Window, t.MaxAddrs
	if failures <= 0 {
		failures = DefaultThrottleFailures
	}
	if window <= 0 {
		window = DefaultThrottleWindow
	}
	if max <= 0 {
		max = DefaultThrottleAddrs
	}
	if t.Now != nil {
		now = t.Now()
	} else {
		now = time.Now()
	}
	return failures, window, max, now
}

// wait returns how long addr must wait before it may try again; zero if it
// may now.
func (t *Throttle) wait(addr string) time.Duration {
	_, _, _, now := t.settings()
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.addrs[addr]
	if !ok || !now.Before(s.until) {
		return 0
	}
	return s.until.Sub(now)
}

// forgive forgets the failures of key, which just authenticated.
func (t *Throttle) forgive(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.addrs, key)
}

// fail counts a failure of addr.
func (t *Throttle) fail(addr string) {
	failures, window, max, now := t.settings()
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.addrs[addr]
	if !ok {
		if t.addrs == nil {
			t.addrs = make(map[string]*strikes)
		}
		if len(t.addrs) >= max && !t.makeRoomLocked(now, window, max) {
			return
		}
		s = &strikes{}
		t.addrs[addr] = s
	}
	if now.Sub(s.since) >= window {
		s.n, s.since = 0, now
	}
	s.n++
	if s.n >= failures {
		s.until = now.Add(window)
		s.n, s.since = 0, s.until
	}
}

// makeRoomLocked frees a slot for a new address: it forgets addresses whose
// strikes are over (at most once a second), else one address that is not
// throttled. It reports whether there is room.
func (t *Throttle) makeRoomLocked(now time.Time, window time.Duration, max int) bool {
	if now.Sub(t.pruned) >= time.Second {
		t.pruned = now
		for a, s := range t.addrs {
			if !now.Before(s.until) && now.Sub(s.since) >= window {
				delete(t.addrs, a)
			}
		}
	}
	if len(t.addrs) < max {
		return true
	}
	for a, s := range t.addrs {
		if !now.Before(s.until) {
			delete(t.addrs, a)
			return true
		}
	}
	return false
}

// ThrottledError refuses a request from a throttled address. It matches
// session.ErrTooManyRequests (errors.Is, session.AsError); RetryAfter is the
// value of the Retry-After header.
type ThrottledError struct {
	err   *session.Error
	retry time.Duration
}

// Error implements error.
func (e *ThrottledError) Error() string { return e.err.Error() }

// Unwrap returns the wire error.
func (e *ThrottledError) Unwrap() error { return e.err }

// RetryAfter returns how long the caller must wait, rounded up to a second.
func (e *ThrottledError) RetryAfter() time.Duration { return e.retry }

func newThrottledError(wait time.Duration) *ThrottledError {
	wait = (wait + time.Second - 1).Truncate(time.Second)
	return &ThrottledError{
		err: session.Errorf(session.CodeTooManyRequests,
			"too many failed logins from this address as this identity: retry in %ds", int(wait/time.Second)),
		retry: wait,
	}
}

// Throttled returns an Authenticator that counts a's unauthenticated answers
// as failures of the request's (client address, claimed identity), and
// answers the failures of a throttled pair with a ThrottledError. Answers
// that are not failures do not count: no credentials at all, a credential
// that is authentic but expired, or any other error. A success of a
// throttled pair clears it. With t nil, Throttled returns a.
//
// The result is a Router, Describer and Refresher through a.
func Throttled(a Authenticator, t *Throttle) Authenticator {
	if t == nil {
		return a
	}
	return &throttled{a: a, t: t}
}

type throttled struct {
	a Authenticator
	t *Throttle
}

var (
	_ Router    = (*throttled)(nil)
	_ Describer = (*throttled)(nil)
	_ Refresher = (*throttled)(nil)
)

func (x *throttled) Authenticate(r *http.Request) (session.Principal, error) {
	key := clientAddr(r) + "\x00" + claimedIdentity(r)
	wait := x.t.wait(key)
	p, err := x.a.Authenticate(r)
	var exp *expiredError
	failed := err != nil && errors.Is(err, session.ErrUnauthenticated) && !errors.Is(err, ErrNoCredentials) && !errors.As(err, &exp)
	switch {
	case err == nil && wait > 0:
		x.t.forgive(key)
	case failed && wait > 0:
		return session.Principal{}, newThrottledError(wait)
	case failed:
		x.t.fail(key)
	}
	return p, err
}

func (x *throttled) Routes(mux *http.ServeMux) {
	if r, ok := x.a.(Router); ok {
		r.Routes(mux)
	}
}

func (x *throttled) Describe() ConfigInfo {
	if d, ok := x.a.(Describer); ok {
		return d.Describe()
	}
	return ConfigInfo{Mode: ModeTokens}
}

func (x *throttled) Refresh(next http.Handler) http.Handler {
	if r, ok := x.a.(Refresher); ok {
		return r.Refresh(next)
	}
	return next
}

// clientAddr is the key a Throttle counts a request's failures under: its
// IPv4 address, or its IPv6 address's /64.
func clientAddr(r *http.Request) string {
	host := remoteHost(r)
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() != nil {
		return ip.String()
	}
	return fmt.Sprintf("%s/64", ip.Mask(net.CIDRMask(64, 128)))
}

// claimedIdentity is who r's credential says it is, before anything is
// checked: an API token's id, the subject of a JWT, a dev user, or the kind
// of credential when it names nobody. It is bounded, so that a request
// cannot make the throttle keep large keys.
func claimedIdentity(r *http.Request) string {
	const max = 128
	bound := func(s string) string {
		if len(s) > max {
			return s[:max]
		}
		return s
	}
	tok, ok := bearer(r)
	if !ok {
		if c, err := r.Cookie(LoginCookie); err == nil {
			return bound("cookie:" + cookieSubject(c.Value))
		}
		if c, err := r.Cookie(DevCookie); err == nil {
			return bound("devcookie:" + c.Value)
		}
		return ""
	}
	tok = strings.TrimSpace(tok)
	switch {
	case strings.HasPrefix(tok, TokenPrefix):
		id, _, _ := strings.Cut(strings.TrimPrefix(tok, TokenPrefix), "_")
		return bound("token:" + id)
	case strings.HasPrefix(tok, DevTokenPrefix):
		return bound(tok)
	case strings.HasPrefix(tok, BootstrapPrefix):
		return "bootstrap"
	case isJWT(tok):
		return bound("jwt:" + jwtSubject(tok))
	}
	return "bearer"
}

// jwtSubject is the unverified iss and sub of a JWT, or "" if it has none.
func jwtSubject(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		Iss string `json:"iss"`
		Sub string `json:"sub"`
	}
	if json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c.Iss + " " + c.Sub
}

// cookieSubject names a login cookie by a digest of its value: it is
// sealed, so its subject cannot be read without opening it.
func cookieSubject(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:8])
}
