package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TokenSource supplies the bearer token a Client sends. Token is called
// before every request and every WebSocket connection, concurrently when
// the Client is used concurrently; it should return a cached token until
// that token is about to expire.
type TokenSource interface {
	Token(ctx context.Context) (string, error)
}

// TokenFunc adapts a function to a TokenSource.
type TokenFunc func(ctx context.Context) (string, error)

// Token calls f.
func (f TokenFunc) Token(ctx context.Context) (string, error) { return f(ctx) }

// Authentication modes of a server, the Mode of its AuthConfig.
const (
	// AuthModeOIDC: people log in through the OIDC issuer; API tokens
	// work too.
	AuthModeOIDC = "oidc"
	// AuthModeDev: `atrium dev` without an issuer; the bearer
	// "dev:<user>" is anyone it names, from loopback only.
	AuthModeDev = "dev"
	// AuthModeTokens: only Atrium API tokens are accepted.
	AuthModeTokens = "tokens"
)

// AuthConfig is how a server authenticates callers: GET /auth/config.
type AuthConfig struct {
	// Mode is AuthModeOIDC, AuthModeDev or AuthModeTokens.
	Mode string `json:"mode"`
	// Issuer is the OIDC issuer URL (mode oidc).
	Issuer string `json:"issuer,omitempty"`
	// ClientID and ClientSecret identify the CLI to the issuer. They are
	// a public "installed application" client: the secret is not
	// confidential, some providers require one anyway.
	ClientID     string `json:"client_id,omitempty"`
	ClientSecret string `json:"client_secret,omitempty"`
	// Scopes are the scopes to request; empty means the CLI's defaults.
	Scopes []string `json:"scopes,omitempty"`
	// LoginURL is the browser login path ("/auth/login" or "/auth/dev").
	LoginURL string `json:"login_url,omitempty"`
}

// Whoami is the caller as the server sees it: GET /v1/whoami.
type Whoami struct {
	User   string `json:"user"`
	Tenant string `json:"tenant,omitempty"`
	// Admin is true for a tenant admin: owner rights on every session of
	// the tenant, and the audit log.
	Admin bool `json:"admin,omitempty"`
	// Via is how the caller authenticated: "cookie", "oidc", "token" or
	// "dev".
	Via string `json:"via,omitempty"`
	// ExpiresAt is when the credential expires; zero if it does not.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	// Name says what the token is for; required.
	Name string `json:"name"`
	// ExpiresAt is when the token stops working; zero lets the server
	// decide.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Role caps what the token may do on any session (viewer, driver or
	// owner); RoleNone means no cap beyond the creating user's rights.
	Role session.Role `json:"role,omitempty"`
}

// TokenInfo describes an API token; never its secret.
type TokenInfo struct {
	ID         string       `json:"id"`
	Name       string       `json:"name"`
	User       string       `json:"user"`
	Tenant     string       `json:"tenant,omitempty"`
	Role       session.Role `json:"role,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	ExpiresAt  time.Time    `json:"expires_at,omitzero"`
	LastUsedAt time.Time    `json:"last_used_at,omitzero"`
}

// NewToken is a token just created: the only time its secret is shown.
type NewToken struct {
	// Token is the bearer: "atr_<id>_<secret>".
	Token string    `json:"token"`
	Info  TokenInfo `json:"info"`
}

// Outcomes of an AuditEntry.
const (
	AuditOK     = "ok"
	AuditDenied = "denied"
	AuditFailed = "failed"
)

// AuditEntry is one record of the audit log.
type AuditEntry struct {
	ID     string    `json:"id"`
	Time   time.Time `json:"time"`
	Tenant string    `json:"tenant"`
	// Actor is the user, or "" when nobody was authenticated.
	Actor string `json:"actor"`
	Via   string `json:"via,omitempty"`
	// Action is login, login_failed, logout, auth_failed, token_created,
	// token_revoked, member_changed, session_created, session_deleted or
	// denied.
	Action  string `json:"action"`
	Session string `json:"session,omitempty"`
	Target  string `json:"target,omitempty"`
	// Outcome is AuditOK, AuditDenied or AuditFailed.
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
	// Remote is the caller's address.
	Remote string `json:"remote"`
}

// AuditQuery selects audit entries; zero fields do not filter.
type AuditQuery struct {
	Actor   string
	Action  string
	Session session.ID
	// Since and Until bound the entries' time.
	Since, Until time.Time
	// Limit is the most entries of one page; 0 lets the server choose.
	Limit int
	// Cursor continues from a previous page's Next.
	Cursor string
}

// AuditPage is one page of audit entries, newest first.
type AuditPage struct {
	Entries []AuditEntry `json:"entries"`
	// Next is the cursor of the following (older) page; "" at the end.
	Next string `json:"next"`
}

// AuthConfig returns how the server authenticates callers. It sends no
// credentials.
func (c *Client) AuthConfig(ctx context.Context) (AuthConfig, error) {
	var cfg AuthConfig
	err := c.send(ctx, http.MethodGet, "/auth/config", false, nil, &cfg)
	return cfg, err
}

// Whoami returns the caller as the server sees it.
func (c *Client) Whoami(ctx context.Context) (Whoami, error) {
	var w Whoami
	err := c.do(ctx, http.MethodGet, "/v1/whoami", nil, &w)
	return w, err
}

// CreateToken creates an API token of the caller.
func (c *Client) CreateToken(ctx context.Context, req TokenRequest) (NewToken, error) {
	var t NewToken
	if req.Name == "" {
		return t, session.Errorf(session.CodeBadRequest, "a token needs a name")
	}
	if req.Role != session.RoleNone && !req.Role.Valid() {
		return t, session.Errorf(session.CodeBadRequest, "unknown role %q: want viewer, driver or owner", req.Role)
	}
	err := c.do(ctx, http.MethodPost, "/v1/tokens", req, &t)
	return t, err
}

// ListTokens returns the caller's API tokens, or with all every token of
// the caller's tenant (tenant admins only).
func (c *Client) ListTokens(ctx context.Context, all bool) ([]TokenInfo, error) {
	p := "/v1/tokens"
	if all {
		p += "?all=1"
	}
	var body struct {
		Tokens []TokenInfo `json:"tokens"`
	}
	if err := c.do(ctx, http.MethodGet, p, nil, &body); err != nil {
		return nil, err
	}
	return body.Tokens, nil
}

// RevokeToken revokes an API token by its id: one of the caller's, or any
// of the tenant's for a tenant admin.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	if id == "" {
		return session.Errorf(session.CodeBadRequest, "token id is empty")
	}
	return c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), nil, nil)
}

// RevokeUserTokens revokes every API token of user in the caller's tenant
// (the caller's own, or any user's for a tenant admin) and returns them.
func (c *Client) RevokeUserTokens(ctx context.Context, user string) ([]TokenInfo, error) {
	if user == "" {
		return nil, session.Errorf(session.CodeBadRequest, "user is empty")
	}
	var body struct {
		Tokens []TokenInfo `json:"tokens"`
	}
	if err := c.do(ctx, http.MethodDelete, "/v1/tokens?user="+url.QueryEscape(user), nil, &body); err != nil {
		return nil, err
	}
	return body.Tokens, nil
}

// Audit returns one page of the audit log, newest first (tenant admins
// only). Continue with q.Cursor set to the page's Next until it is "".
func (c *Client) Audit(ctx context.Context, q AuditQuery) (AuditPage, error) {
	v := url.Values{}
	set := func(k, val string) {
		if val != "" {
			v.Set(k, val)
		}
	}
	set("cursor", q.Cursor)
	set("actor", q.Actor)
	set("action", q.Action)
	set("session", string(q.Session))
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	p := "/v1/audit"
	if len(v) > 0 {
		p += "?" + v.Encode()
	}
	var page AuditPage
	if err := c.do(ctx, http.MethodGet, p, nil, &page); err != nil {
		return AuditPage{}, err
	}
	if page.Entries == nil {
		page.Entries = []AuditEntry{}
	}
	return page, nil
}
