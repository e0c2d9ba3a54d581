// Package auth owns how the gateway learns who is calling: the Authenticator
// interface every identity source implements (the dev identity, an OIDC
// provider's logins and bearer tokens, Atrium API tokens), a Chain that tries
// several of them, the browser login routes under /auth/ with GET /auth/config
// describing them, and throttling of repeated failed authentications.
//
// An authenticator only says who the caller is. What the caller may do on a
// session is decided from the session's roles (package session).
package auth

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// Authenticator identifies the caller of an HTTP request.
//
// Authenticate returns the caller's principal, or an error matching
// session.ErrUnauthenticated whose message tells the caller what to send. An
// authenticator that finds no credentials of its kind on the request returns
// an error matching ErrNoCredentials, so that a Chain can try the next one.
// Any other error (an identity provider that cannot be reached, say) is
// returned as it is and answered with its own code.
type Authenticator interface {
	Authenticate(r *http.Request) (session.Principal, error)
}

// Router is implemented by authenticators that have browser login routes.
// Routes registers them on mux; every pattern is under /auth/, which the
// gateway serves without authentication.
type Router interface {
	Routes(mux *http.ServeMux)
}

// Describer is implemented by authenticators that tell clients how to log in:
// their answer is the body of GET /auth/config, which a Chain serves.
type Describer interface {
	Describe() ConfigInfo
}

// Refresher is implemented by authenticators whose credentials are renewed as
// requests pass, such as the OIDC login cookie. Refresh returns a handler that
// renews the request's credentials when they are due (on the request, so that
// Authenticate sees the new ones, and on the response, so that the browser
// keeps them) and then calls next. The gateway wraps its whole handler with it.
type Refresher interface {
	Refresh(next http.Handler) http.Handler
}

// Login modes of ConfigInfo.
const (
	ModeOIDC   = api.AuthModeOIDC   // log in at the OIDC issuer; bearers are its tokens or API tokens
	ModeDev    = api.AuthModeDev    // the loopback-only dev identity of `atrium dev`
	ModeTokens = api.AuthModeTokens // API tokens only: no interactive login
)

// ConfigInfo is the answer of GET /auth/config: how clients log in
// (api.AuthConfig).
type ConfigInfo = api.AuthConfig

// ErrNoCredentials means the request carries no credentials the
// authenticator recognises. It matches session.ErrUnauthenticated too.
var ErrNoCredentials = &session.Error{
	Code:    session.CodeUnauthenticated,
	Message: "no credentials: send Authorization: Bearer <token> or log in",
}

// Chain returns an Authenticator that asks each of as in turn and answers with
// the first that recognises the request's credentials (returns anything other
// than ErrNoCredentials).
//
// A Chain is also a Router: it registers every member's routes and
// GET /auth/config, which answers with the chain's Describe. It is a
// Describer: it describes itself as its first member with a browser login
// (a LoginURL), else as its first member that describes itself at all, else
// as ModeTokens. And it is a Refresher that applies every member's Refresh.
func Chain(as ...Authenticator) Authenticator {
	return chain(as)
}

type chain []Authenticator

var (
	_ Router    = chain(nil)
	_ Describer = chain(nil)
	_ Refresher = chain(nil)
)

func (c chain) Authenticate(r *http.Request) (session.Principal, error) {
	var first error // the first member's own account of the missing credentials
	for _, a := range c {
		p, err := a.Authenticate(r)
		if errors.Is(err, ErrNoCredentials) {
			if first == nil && err != ErrNoCredentials {
				first = err
			}
			continue
		}
		return p, err
	}
	if first != nil {
		return session.Principal{}, first
	}
	if _, ok := bearer(r); ok {
		return session.Principal{}, errBearerUnknown
	}
	return session.Principal{}, ErrNoCredentials
}

// errBearerUnknown answers a bearer that no member of a Chain recognises.
var errBearerUnknown = noCredentials("invalid token: this server accepts Atrium API tokens (atr_…); " +
	"create one with `atrium token create` (on a new server: `atrium token create --bootstrap` on its machine)")

// Routes implements Router.
func (c chain) Routes(mux *http.ServeMux) {
	for _, a := range c {
		if r, ok := a.(Router); ok {
			r.Routes(mux)
		}
	}
	mux.HandleFunc("GET /auth/config", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, c.Describe())
	})
}

// Describe implements Describer.
func (c chain) Describe() ConfigInfo {
	var first *ConfigInfo
	for _, a := range c {
		d, ok := a.(Describer)
		if !ok {
			continue
		}
		info := d.Describe()
		if info.LoginURL != "" {
			return info
		}
		if first == nil {
			first = &info
		}
	}
	if first != nil {
		return *first
	}
	return ConfigInfo{Mode: ModeTokens}
}

// Refresh implements Refresher.
func (c chain) Refresh(next http.Handler) http.Handler {
	for i := len(c) - 1; i >= 0; i-- {
		if r, ok := c[i].(Refresher); ok {
			next = r.Refresh(next)
		}
	}
	return next
}

// Challenge returns the value of the WWW-Authenticate header for a request
// refused with err (RFC 6750): `Bearer realm="atrium"` when the request had
// no credentials, and otherwise `Bearer realm="atrium", error="invalid_token",
// error_description="<why>"`, with the reason reduced to the characters the
// header allows.
func Challenge(err error) string {
	const plain = `Bearer realm="atrium"`
	if err == nil || errors.Is(err, ErrNoCredentials) || !errors.Is(err, session.ErrUnauthenticated) {
		return plain
	}
	return plain + `, error="invalid_token", error_description="` + headerText(session.AsError(err).Message, 200) + `"`
}

// headerText reduces s to at most n characters that may appear in a quoted
// RFC 6750 error_description: printable ASCII except '"' and '\'.
func headerText(s string, n int) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= n {
			break
		}
		switch {
		case r == '"':
			b.WriteByte('\'')
		case r == '\\':
			b.WriteByte('/')
		case r < 0x20 || r > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// bearer returns the token of an "Authorization: Bearer <token>" header and
// whether the request has one.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	return h[len(prefix):], true
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
