package auth

import (
	"errors"
	"fmt"
	"net"
	"net/http"
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

// Throttle slows down guessing: an address that fails to authenticate
// Failures times within Window is refused for Window after the last of those
// failures, before any credential it sends is looked at. An address is an
// IPv4 address or an IPv6 /64 (one host's usual allocation).
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
			"too many failed logins from this address: retry in %ds", int(wait/time.Second)),
		retry: wait,
	}
}

// Throttled returns an Authenticator that refuses requests from addresses t
// throttles, before a asks for anything, and counts a's unauthenticated
// answers as failures. Answers that are not failures do not count: no
// credentials at all, a credential that is authentic but expired, or any
// other error. A success does not reset the count. With t nil, Throttled
// returns a.
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
	addr := clientAddr(r)
	if wait := x.t.wait(addr); wait > 0 {
		return session.Principal{}, newThrottledError(wait)
	}
	p, err := x.a.Authenticate(r)
	var exp *expiredError
	if err != nil && errors.Is(err, session.ErrUnauthenticated) && !errors.Is(err, ErrNoCredentials) && !errors.As(err, &exp) {
		x.t.fail(addr)
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
