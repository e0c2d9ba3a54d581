package auth

import (
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// DevCookie is the name of the cookie set by the dev browser login.
const DevCookie = "atrium_dev"

// DevTokenPrefix starts a dev bearer token: "Authorization: Bearer dev:<user>".
const DevTokenPrefix = "dev:"

// Dev is the identity of `atrium dev` when no issuer is configured: whoever
// connects from a loopback address is the user they name, either with
// "Authorization: Bearer dev:<user>" or with the cookie that the browser login
// GET /auth/dev?user=<user> sets. Requests from any other address are refused,
// so a dev server reachable from the network grants nobody anything.
//
// The zero value is ready to use.
type Dev struct {
	// Tenant is the tenant of every dev principal; empty by default.
	Tenant string
	// User is the user the browser's sign-in form suggests: the one the
	// CLI acts as by default on this machine. Empty: no suggestion.
	User string
}

var (
	_ Authenticator = (*Dev)(nil)
	_ Router        = (*Dev)(nil)
	_ Describer     = (*Dev)(nil)
)

// Authenticate implements Authenticator.
func (d *Dev) Authenticate(r *http.Request) (session.Principal, error) {
	if tok, ok := bearer(r); ok {
		user, ok := strings.CutPrefix(tok, DevTokenPrefix)
		if !ok {
			return session.Principal{}, noCredentials("invalid token: dev auth accepts only Authorization: Bearer dev:<user>")
		}
		return d.principal(r, user, session.ViaDev)
	}
	if c, err := r.Cookie(DevCookie); err == nil {
		b, err := base64.RawURLEncoding.DecodeString(c.Value)
		if err != nil {
			return session.Principal{}, session.Errorf(session.CodeUnauthenticated,
				"invalid %s cookie: log in again at /auth/dev?user=<user>", DevCookie)
		}
		return d.principal(r, string(b), session.ViaCookie)
	}
	return session.Principal{}, noCredentials(
		"no credentials: send Authorization: Bearer dev:<user>, or log in at /auth/dev?user=<user>")
}

// principal is the dev principal user, authenticated via via: a browser's
// cookie is ViaCookie, so that the gateway's CSRF rules apply to it too.
func (d *Dev) principal(r *http.Request, user, via string) (session.Principal, error) {
	if !loopback(r) {
		return session.Principal{}, errLoopbackOnly
	}
	if !LoopbackHost(r.Host) {
		return session.Principal{}, errLoopbackHost(r.Host)
	}
	if err := session.ValidUser(user); err != nil {
		return session.Principal{}, session.Errorf(session.CodeUnauthenticated,
			"invalid dev user: %s", session.AsError(err).Message)
	}
	return session.Principal{User: user, Tenant: d.Tenant, Via: via}, nil
}

// Describe implements Describer: mode "dev", with the browser login at
// /auth/dev.
func (d *Dev) Describe() ConfigInfo {
	return ConfigInfo{Mode: ModeDev, LoginURL: "/auth/dev", DevUser: d.User}
}

var errLoopbackOnly = session.Errorf(session.CodeUnauthenticated,
	"dev auth is loopback-only: connect from 127.0.0.1 or ::1, or configure an OIDC issuer")

// Routes implements Router: GET /auth/dev?user=<user> logs the browser in as
// user (loopback only) and redirects to /; GET /auth/logout forgets it.
func (d *Dev) Routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /auth/dev", d.login)
	mux.HandleFunc("GET /auth/logout", d.logout)
}

func (d *Dev) login(w http.ResponseWriter, r *http.Request) {
	if !loopback(r) {
		writeError(w, &session.Error{Code: session.CodeForbidden, Message: errLoopbackOnly.Message})
		return
	}
	if !LoopbackHost(r.Host) {
		writeError(w, &session.Error{Code: session.CodeForbidden, Message: errLoopbackHost(r.Host).Message})
		return
	}
	user := r.URL.Query().Get("user")
	if err := session.ValidUser(user); err != nil {
		writeError(w, session.Errorf(session.CodeBadRequest,
			"log in with /auth/dev?user=<user>: %s", session.AsError(err).Message))
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     DevCookie,
		Value:    base64.RawURLEncoding.EncodeToString([]byte(user)),
		Path:     "/",
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteLaxMode,
	})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (d *Dev) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name:     DevCookie,
		Value:    "",
		Path:     "/",
		MaxAge:   -1,
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteLaxMode,
	})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// errLoopbackHost refuses a dev request whose Host header is not a loopback
// name: a page of another site whose name was rebound to 127.0.0.1 (DNS
// rebinding) sends its own name.
func errLoopbackHost(host string) *session.Error {
	return session.Errorf(session.CodeUnauthenticated,
		"dev auth answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1]), not %q: "+
			"open the URL `atrium dev` printed", headerText(host, 100))
}

// LoopbackHost reports whether host (a Host header: a name or address, with
// an optional port) names this machine's loopback interface: "localhost", a
// name under ".localhost" (RFC 6761), or a loopback address.
func LoopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopback reports whether the request came from a loopback address.
func loopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// notMine is an unauthenticated error that also matches ErrNoCredentials: the
// request has no credentials this authenticator recognises.
type notMine struct{ err *session.Error }

func noCredentials(msg string) error {
	return &notMine{err: &session.Error{Code: session.CodeUnauthenticated, Message: msg}}
}

func (e *notMine) Error() string        { return e.err.Error() }
func (e *notMine) Unwrap() error        { return e.err }
func (e *notMine) Is(target error) bool { return target == ErrNoCredentials }

// writeError answers with the contract's error body.
func writeError(w http.ResponseWriter, err error) {
	e := session.AsError(err)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(e.Code.HTTPStatus())
	_ = json.NewEncoder(w).Encode(session.ErrorBody{Error: e})
}
