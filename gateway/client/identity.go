package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
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
	AuthModeOIDC   = api.AuthModeOIDC
	AuthModeDev    = api.AuthModeDev
	AuthModeTokens = api.AuthModeTokens
)

// AuthConfig is how a server authenticates callers: GET /auth/config.
type AuthConfig = api.AuthConfig

// The wire shapes of identity, tokens and the audit log (declared in
// session/api).
type (
	// Whoami is the caller as the server sees it: GET /v1/whoami.
	Whoami = api.Whoami
	// TokenInfo describes an API token; never its secret.
	TokenInfo = api.TokenInfo
	// NewToken is a token just created: the only time its secret is shown.
	NewToken = api.NewToken
	// AuditEntry is one record of the audit log.
	AuditEntry = api.AuditEntry
	// AuditPage is one page of audit entries, newest first.
	AuditPage = api.AuditPage
)

// TokenRequest asks CreateToken for a token (the body of POST /v1/tokens,
// api.TokenRequest).
type TokenRequest struct {
	// Name says what the token is for; required.
	Name string
	// ExpiresAt is when the token stops working; zero lets the server
	// decide.
	ExpiresAt time.Time
	// Role caps what the token may do on any session (viewer, driver or
	// owner); RoleNone means no cap beyond the creating user's rights.
	Role session.Role
}

// Outcomes of an AuditEntry.
const (
	AuditOK     = api.AuditOK
	AuditDenied = api.AuditDenied
	AuditFailed = api.AuditFailed
)

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
	body := api.TokenRequest{Name: req.Name, Role: req.Role}
	if !req.ExpiresAt.IsZero() {
		body.ExpiresAt = req.ExpiresAt.Format(time.RFC3339Nano) // as time.Time encodes itself
	}
	err := c.do(ctx, http.MethodPost, "/v1/tokens", body, &t)
	return t, err
}

// ListTokens returns the caller's API tokens, or with all every token of
// the caller's tenant (tenant admins only).
func (c *Client) ListTokens(ctx context.Context, all bool) ([]TokenInfo, error) {
	p := "/v1/tokens"
	if all {
		p += "?all=1"
	}
	var body api.TokenList
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
	var body api.TokenList
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
