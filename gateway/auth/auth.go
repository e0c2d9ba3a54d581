// Package auth owns how the gateway learns who is calling: the Authenticator
// interface every identity source implements (the dev identity here; OIDC and
// API tokens slot in beside it), a Chain that tries several of them, and the
// optional browser login routes under /auth/.
//
// An authenticator only says who the caller is. What the caller may do on a
// session is decided from the session's roles (package session).
package auth

import (
	"errors"
	"net/http"
	"strings"

	"github.com/atriumhq/atrium/session"
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

// ErrNoCredentials means the request carries no credentials the
// authenticator recognises. It matches session.ErrUnauthenticated too.
var ErrNoCredentials = &session.Error{
	Code:    session.CodeUnauthenticated,
	Message: "no credentials: send Authorization: Bearer <token> or log in",
}

// Chain returns an Authenticator that asks each of as in turn and answers with
// the first that recognises the request's credentials (returns anything other
// than ErrNoCredentials). A Chain is a Router for every member that is one.
func Chain(as ...Authenticator) Authenticator {
	return chain(as)
}

type chain []Authenticator

func (c chain) Authenticate(r *http.Request) (session.Principal, error) {
	for _, a := range c {
		p, err := a.Authenticate(r)
		if errors.Is(err, ErrNoCredentials) {
			continue
		}
		return p, err
	}
	return session.Principal{}, ErrNoCredentials
}

func (c chain) Routes(mux *http.ServeMux) {
	for _, a := range c {
		if r, ok := a.(Router); ok {
			r.Routes(mux)
		}
	}
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
