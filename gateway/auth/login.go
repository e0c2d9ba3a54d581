package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
)

const (
	// refreshEarly is how long before the identity's expiry a request
	// renews it, so requests near the boundary do not fail.
	refreshEarly = 30 * time.Second
	// refreshReuse is how long the result of a refresh answers requests
	// that still carry the old cookie (parallel requests of one page), so
	// one refresh token is redeemed once: providers that rotate refresh
	// tokens revoke every login of a token that is used twice.
	refreshReuse = time.Minute
	// maxRefreshes bounds the refresh results kept for reuse.
	maxRefreshes = 10000
)

// Routes implements Router: GET /auth/login?next=<path> starts a login,
// GET /auth/callback finishes it, GET or POST /auth/logout ends it.
func (o *OIDC) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /auth/login", o.login)
	mux.HandleFunc("GET /auth/callback", o.callback)
	mux.HandleFunc("GET /auth/logout", o.logout)
	mux.HandleFunc("POST /auth/logout", o.logout)
}

// login redirects the browser to the provider: authorization code flow with
// PKCE S256, a random state and nonce, kept with the verifier and the page to
// return to in a sealed cookie for LoginTimeout.
func (o *OIDC) login(w http.ResponseWriter, r *http.Request) {
	p := pending{
		State:    random(),
		Nonce:    random(),
		Verifier: oauth2.GenerateVerifier(),
		Next:     safeNext(r.URL.Query().Get("next")),
		Expires:  o.now().Add(LoginTimeout).Unix(),
	}
	v, err := o.seal.seal(stateCookie, p)
	if err != nil {
		o.log.Error("start login", "err", err)
		writeError(w, session.Errorf(session.CodeInternal, "cannot start a login: try again"))
		return
	}
	http.SetCookie(w, cookie(stateCookie, v, "/auth/", LoginTimeout, o.secure))
	http.Redirect(w, r, o.oauth.AuthCodeURL(p.State, oidc.Nonce(p.Nonce), oauth2.S256ChallengeOption(p.Verifier)), http.StatusFound)
}

// callback finishes a login: it checks the state, redeems the code with the
// PKCE verifier, verifies the ID token and its nonce, maps the claims to a
// user and sets the login cookie.
func (o *OIDC) callback(w http.ResponseWriter, r *http.Request) {
	// The login in progress ends here, whatever happens.
	http.SetCookie(w, cookie(stateCookie, "", "/auth/", 0, o.secure))
	fail := func(actor string, err *session.Error) {
		outcome := audit.Failed
		if err.Code == session.CodeForbidden {
			outcome = audit.Denied
		}
		if o.failures.allow(remoteHost(r), o.now()) {
			o.record(r, audit.Entry{Actor: actor, Action: audit.ActLoginFailed, Outcome: outcome, Detail: err.Message})
		}
		writeError(w, err)
	}
	const again = "start again at /auth/login"
	c, err := r.Cookie(stateCookie)
	if err != nil {
		fail("", session.Errorf(session.CodeBadRequest,
			"no login in progress (it took over %v, or this browser blocks cookies): %s", LoginTimeout, again))
		return
	}
	var p pending
	if err := o.seal.open(stateCookie, c.Value, &p); err != nil {
		fail("", session.Errorf(session.CodeBadRequest, "the login state cookie is not valid: %s", again))
		return
	}
	if !o.now().Before(time.Unix(p.Expires, 0)) {
		fail("", session.Errorf(session.CodeBadRequest, "the login took over %v: %s", LoginTimeout, again))
		return
	}
	q := r.URL.Query()
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(p.State)) != 1 {
		fail("", session.Errorf(session.CodeBadRequest,
			"the login state does not match this browser's login (was another login started since?): %s", again))
		return
	}
	if e := q.Get("error"); e != "" {
		msg := "the identity provider refused the login: " + headerText(e, 60)
		if d := q.Get("error_description"); d != "" {
			msg += ": " + headerText(d, 200)
		}
		fail("", session.Errorf(session.CodeUnauthenticated, "%s", msg))
		return
	}
	code := q.Get("code")
	if code == "" {
		fail("", session.Errorf(session.CodeBadRequest, "the identity provider sent no code: %s", again))
		return
	}
	ctx := oidc.ClientContext(r.Context(), o.client)
	tok, err := o.oauth.Exchange(ctx, code, oauth2.VerifierOption(p.Verifier))
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			fail("", session.Errorf(session.CodeUnauthenticated,
				"the identity provider did not accept the login code (%s): %s", headerText(re.ErrorCode, 60), again))
			return
		}
		o.log.Warn("redeem login code", "err", err)
		fail("", session.Errorf(session.CodeUnavailable, "cannot reach the identity provider: try again shortly"))
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		fail("", session.Errorf(session.CodeUnauthenticated,
			"the identity provider returned no ID token (is the openid scope configured?)"))
		return
	}
	idt, claims, err := o.verify(ctx, raw, []string{o.cfg.ClientID})
	if err != nil {
		fail("", session.AsError(err))
		return
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(p.Nonce)) != 1 {
		fail("", session.Errorf(session.CodeUnauthenticated, "the ID token's nonce does not match this login: %s", again))
		return
	}
	who, err := o.principal(claims)
	if err != nil {
		user, _ := claims[o.cfg.UserClaim].(string)
		fail(user, session.AsError(err))
		return
	}
	l := login{
		User:     who.User,
		Tenant:   who.Tenant,
		Admin:    who.Admin,
		Operator: who.Operator,
		Subject:  idt.Subject,
		Expires:  o.now().Add(o.cfg.CookieTTL).Unix(),
		Fresh:    idt.Expiry.Unix(),
		Refresh:  tok.RefreshToken,
	}
	value, err := o.sealLogin(&l)
	if err != nil {
		o.log.Error("seal login cookie", "err", err)
		writeError(w, session.Errorf(session.CodeInternal, "cannot complete the login: try again"))
		return
	}
	http.SetCookie(w, cookie(LoginCookie, value, "/", time.Unix(l.Expires, 0).Sub(o.now()), o.secure))
	o.record(r, audit.Entry{Tenant: who.Tenant, Actor: who.User, Action: audit.ActLogin, Outcome: audit.OK})
	http.Redirect(w, r, p.Next, http.StatusSeeOther)
}

// sealLogin seals l for the login cookie. A refresh token too large for a
// cookie is left out: the login then lasts as long as the ID token.
func (o *OIDC) sealLogin(l *login) (string, error) {
	v, err := o.seal.seal(LoginCookie, l)
	if err != nil || len(v) <= maxCookieValue || l.Refresh == "" {
		return v, err
	}
	o.log.Warn("the provider's refresh token is too large for the login cookie: logins will not be renewed silently",
		"bytes", len(l.Refresh))
	l.Refresh = ""
	return o.seal.seal(LoginCookie, l)
}

// logout clears the login cookie and sends the browser to the provider's
// end_session_endpoint, if it has one, else to /.
func (o *OIDC) logout(w http.ResponseWriter, r *http.Request) {
	var l login
	if c, err := r.Cookie(LoginCookie); err == nil && o.seal.open(LoginCookie, c.Value, &l) == nil {
		o.record(r, audit.Entry{Tenant: l.Tenant, Actor: l.User, Action: audit.ActLogout, Outcome: audit.OK})
	}
	http.SetCookie(w, cookie(LoginCookie, "", "/", 0, o.secure))
	target := "/"
	if o.endSession != "" {
		if u, err := url.Parse(o.endSession); err == nil {
			q := u.Query()
			q.Set("client_id", o.cfg.ClientID)
			if o.cfg.PostLogoutRedirectURL != "" {
				q.Set("post_logout_redirect_uri", o.cfg.PostLogoutRedirectURL)
			}
			u.RawQuery = q.Encode()
			target = u.String()
		}
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// record writes an audit entry about r. A failure to audit is logged and
// does not refuse the login: the audit log being full must not lock
// everybody out.
func (o *OIDC) record(r *http.Request, e audit.Entry) {
	e.Via = session.ViaCookie
	e.Remote = remoteHost(r)
	if err := o.audit.Record(context.WithoutCancel(r.Context()), e); err != nil {
		o.log.Error("audit", "action", e.Action, "err", err)
	}
}

// Refresh implements Refresher. A request whose login cookie's identity is
// due (its ID token expires within refreshEarly) and that has a refresh
// token gets a new identity from the provider before next runs: the new
// cookie replaces the old one on the request and is set on the response. A
// refresh the provider refuses clears the cookie; Authenticate then answers
// "session expired: log in again". Requests under /auth/ and requests with
// a bearer are passed on untouched.
func (o *OIDC) Refresh(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/auth/") {
			next.ServeHTTP(w, r)
			return
		}
		if _, ok := bearer(r); ok {
			next.ServeHTTP(w, r)
			return
		}
		c, err := r.Cookie(LoginCookie)
		if err != nil {
			next.ServeHTTP(w, r)
			return
		}
		var l login
		if o.seal.open(LoginCookie, c.Value, &l) != nil || l.Refresh == "" {
			next.ServeHTTP(w, r)
			return
		}
		now := o.now()
		if !now.Before(time.Unix(l.Expires, 0)) || now.Before(time.Unix(l.Fresh, 0).Add(-refreshEarly)) {
			next.ServeHTTP(w, r)
			return
		}
		value, nl, err := o.refreshLogin(r, c.Value, l)
		if err != nil {
			if !errors.Is(err, errProviderDown) {
				http.SetCookie(w, cookie(LoginCookie, "", "/", 0, o.secure))
			}
			next.ServeHTTP(w, r)
			return
		}
		http.SetCookie(w, cookie(LoginCookie, value, "/", time.Unix(nl.Expires, 0).Sub(now), o.secure))
		next.ServeHTTP(w, withCookie(r, LoginCookie, value))
	})
}

// withCookie returns a shallow copy of r whose cookie name has value.
func withCookie(r *http.Request, name, value string) *http.Request {
	r2 := r.WithContext(r.Context())
	r2.Header = r.Header.Clone()
	var parts []string
	for _, c := range r.Cookies() {
		if c.Name == name {
			c.Value = value
		}
		parts = append(parts, (&http.Cookie{Name: c.Name, Value: c.Value}).String())
	}
	r2.Header.Set("Cookie", strings.Join(parts, "; "))
	return r2
}

// errProviderDown means a refresh failed because the provider could not be
// reached: the login is kept, to be refreshed by a later request.
var errProviderDown = errors.New("identity provider unreachable")

// refreshes lets parallel requests carrying one login cookie share one
// refresh, and requests still carrying it shortly after reuse its result.
type refreshes struct {
	mu     sync.Mutex
	calls  map[[32]byte]*refreshCall // guarded by mu; keyed by the old cookie's hash
	pruned time.Time                 // guarded by mu
}

type refreshCall struct {
	done  chan struct{} // closed when the fields below are set
	value string
	l     login
	err   error
	at    time.Time
}

// refreshLogin returns the cookie value and login that replace old (whose
// contents are l), refreshing with the provider unless a refresh of old is
// under way or was just done.
func (o *OIDC) refreshLogin(r *http.Request, old string, l login) (string, login, error) {
	key := sha256.Sum256([]byte(old))
	now := o.now()
	rs := &o.refreshes
	rs.mu.Lock()
	if rs.calls == nil {
		rs.calls = make(map[[32]byte]*refreshCall)
	}
	if now.Sub(rs.pruned) > refreshReuse || len(rs.calls) >= maxRefreshes {
		rs.pruneLocked(now)
	}
	if call, ok := rs.calls[key]; ok {
		rs.mu.Unlock()
		select {
		case <-call.done:
			return call.value, call.l, call.err
		case <-r.Context().Done():
			return "", login{}, errProviderDown
		}
	}
	call := &refreshCall{done: make(chan struct{})}
	if len(rs.calls) < maxRefreshes {
		rs.calls[key] = call
	}
	rs.mu.Unlock()

	// The refresh outlives this request: others may be waiting for it.
	call.value, call.l, call.err = o.refresh(context.WithoutCancel(r.Context()), l)
	call.at = o.now()
	close(call.done)
	if call.err != nil && !errors.Is(call.err, errProviderDown) {
		o.record(r, audit.Entry{Tenant: l.Tenant, Actor: l.User, Action: audit.ActLoginFailed, Outcome: audit.Failed,
			Detail: "silent refresh refused: " + call.err.Error()})
	}
	return call.value, call.l, call.err
}

// pruneLocked forgets refreshes finished more than refreshReuse ago.
func (rs *refreshes) pruneLocked(now time.Time) {
	rs.pruned = now
	for k, c := range rs.calls {
		select {
		case <-c.done:
			if now.Sub(c.at) > refreshReuse {
				delete(rs.calls, k)
			}
		default:
		}
	}
}

// refresh redeems l's refresh token for a new identity. Its errors are
// errProviderDown or a reason the login is over.
func (o *OIDC) refresh(ctx context.Context, l login) (string, login, error) {
	ctx = oidc.ClientContext(ctx, o.client)
	tok, err := o.oauth.TokenSource(ctx, &oauth2.Token{RefreshToken: l.Refresh}).Token()
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			return "", login{}, errors.New("the provider refused the refresh token (" + headerText(re.ErrorCode, 60) + ")")
		}
		o.log.Warn("refresh login", "err", err)
		return "", login{}, errProviderDown
	}
	nl := l
	if raw, _ := tok.Extra("id_token").(string); raw != "" {
		idt, claims, err := o.verify(ctx, raw, []string{o.cfg.ClientID})
		if err != nil {
			if errors.Is(err, session.ErrUnavailable) {
				return "", login{}, errProviderDown
			}
			return "", login{}, err
		}
		if idt.Subject != l.Subject {
			return "", login{}, errors.New("the refreshed ID token is for another subject")
		}
		who, err := o.principal(claims)
		if err != nil {
			return "", login{}, err
		}
		nl.User, nl.Tenant, nl.Admin, nl.Operator, nl.Fresh = who.User, who.Tenant, who.Admin, who.Operator, idt.Expiry.Unix()
	} else {
		// No new ID token (the provider need not send one): the refresh
		// still shows the login is alive at the provider.
		fresh := tok.Expiry
		if fresh.IsZero() {
			fresh = o.now().Add(5 * time.Minute)
		}
		nl.Fresh = fresh.Unix()
	}
	if tok.RefreshToken != "" {
		nl.Refresh = tok.RefreshToken
	}
	value, err := o.sealLogin(&nl)
	if err != nil {
		return "", login{}, err
	}
	return value, nl, nil
}

// Limits of failed-login audit entries: anyone can call /auth/callback, so
// one address gets at most one entry per failedLoginEvery, and at most
// maxFailingAddrs addresses are tracked at once.
const (
	failedLoginEvery = 10 * time.Second
	maxFailingAddrs  = 10000
)

// auditLimit keeps a flood of failed logins from filling the audit log.
type auditLimit struct {
	mu   sync.Mutex
	last map[string]time.Time // guarded by mu; an address's last entry
}

// allow reports whether a failed login of addr at now may be audited.
func (l *auditLimit) allow(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[addr]; ok && now.Sub(t) < failedLoginEvery {
		return false
	}
	if l.last == nil {
		l.last = make(map[string]time.Time)
	}
	if len(l.last) >= maxFailingAddrs {
		for a, t := range l.last {
			if now.Sub(t) >= failedLoginEvery {
				delete(l.last, a)
			}
		}
		if len(l.last) >= maxFailingAddrs {
			return false
		}
	}
	l.last[addr] = now
	return true
}

// safeNext returns next if it is a path on this site ("/s/abc"), else "/".
func safeNext(next string) string {
	if next == "" || next[0] != '/' || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n\t") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil {
		return "/"
	}
	return next
}

// random returns 256 random bits, base64url-encoded.
func random() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// remoteHost is the address a request came from, without its port.
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
