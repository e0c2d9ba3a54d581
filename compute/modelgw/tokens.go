package modelgw

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// TokenPrefix starts every token the gateway issues, so a token is
// recognisable in an agent's error output (the rest is random).
const TokenPrefix = "atrium-model-"

// ErrUnknownToken is returned by Activate for a token the gateway never
// issued or has revoked.
var ErrUnknownToken = errors.New("modelgw: unknown or revoked token")

// grant is what a token allows. Its fields are guarded by Gateway.mu.
type grant struct {
	session session.ID
	tenant  string
	active  bool
	turn    int64
	user    string
	// warned records that OnOverBudget was called for this activation.
	warned bool
	// refused records that OnRefused was called for this activation.
	refused bool
}

// Issue makes a new token for a session's agent process (or harness turn).
// It is refused until Activate. Tokens are random, kept in memory only and
// never logged; a node restart invalidates them all.
func (g *Gateway) Issue(id session.ID, tenant string) string {
	var b [32]byte
	rand.Read(b[:])
	tok := TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tokens[tok] = &grant{session: id, tenant: tenant}
	return tok
}

// Activate accepts requests with token, attributing their usage to turn
// and user, until Deactivate or Revoke.
func (g *Gateway) Activate(token string, turn int64, user string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr := g.tokens[token]
	if gr == nil {
		return ErrUnknownToken
	}
	gr.active, gr.turn, gr.user, gr.warned, gr.refused = true, turn, user, false, false
	return nil
}

// Deactivate refuses requests with token (401) until the next Activate.
// Answers already streaming go on.
func (g *Gateway) Deactivate(token string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gr := g.tokens[token]; gr != nil {
		gr.active = false
	}
}

// Revoke forgets token: it is refused from now on.
func (g *Gateway) Revoke(token string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.tokens, token)
}

// caller is who a request comes from, as of its start.
type caller struct {
	token   string
	session session.ID
	tenant  string
	turn    int64
	user    string
}

// authenticate finds the caller of r from the token in its key header.
func (g *Gateway) authenticate(r *http.Request) (caller, bool) {
	tok := requestToken(r)
	if tok == "" {
		return caller{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	gr := g.tokens[tok]
	if gr == nil || !gr.active {
		return caller{}, false
	}
	return caller{token: tok, session: gr.session, tenant: gr.tenant, turn: gr.turn, user: gr.user}, true
}

// requestToken is the key the client sent, in any of the headers agents
// use.
func requestToken(r *http.Request) string {
	if v := r.Header.Get("X-Api-Key"); v != "" {
		return v
	}
	if v := r.Header.Get("X-Goog-Api-Key"); v != "" {
		return v
	}
	if v := r.Header.Get("Authorization"); v != "" {
		if scheme, tok, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	return r.URL.Query().Get("key")
}
