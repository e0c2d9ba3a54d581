package api

import (
	"time"

	"github.com/atriumhq/atrium/session"
)

// Whoami is the caller as the server sees it: GET /v1/whoami.
type Whoami struct {
	User   string `json:"user"`
	Tenant string `json:"tenant"`
	// Admin is true for a tenant admin: owner rights on every session of
	// the tenant, and the audit log.
	Admin bool `json:"admin"`
	// Via is how the caller authenticated: "cookie", "oidc", "token" or
	// "dev".
	Via string `json:"via"`
	// ExpiresAt is when the credential expires; zero if it does not.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	// Name says what the token is for; required.
	Name string `json:"name"`
	// ExpiresAt is when the token stops working, an RFC 3339 time; empty
	// lets the server decide. It is a string on the wire so that the server
	// can say precisely what is wrong with a bad one.
	ExpiresAt string `json:"expires_at,omitempty"`
	// Role caps what the token may do on any session (viewer, driver or
	// owner); empty means no cap beyond the creating user's rights.
	Role session.Role `json:"role,omitempty"`
}

// TokenInfo describes an API token: everything but its secret.
type TokenInfo struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	User   string `json:"user"`
	Tenant string `json:"tenant"`
	// Role is the token's cap: the most it may do on any session, whatever
	// its user's role there. RoleNone means the user's own roles.
	Role       session.Role `json:"role,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	ExpiresAt  time.Time    `json:"expires_at,omitzero"`
	LastUsedAt time.Time    `json:"last_used_at,omitzero"`
}

// NewToken answers POST /v1/tokens: the only time a token's secret is
// shown.
type NewToken struct {
	// Token is the bearer: "atr_<id>_<secret>".
	Token string    `json:"token"`
	Info  TokenInfo `json:"info"`
}

// TokenList answers GET /v1/tokens and DELETE /v1/tokens?user=.
type TokenList struct {
	Tokens []TokenInfo `json:"tokens"`
}

// Outcomes of an AuditEntry.
const (
	AuditOK     = "ok"
	AuditDenied = "denied"
	AuditFailed = "failed"
)

// AuditEntry is one record of the audit log (GET /v1/audit).
type AuditEntry struct {
	ID     string    `json:"id"`
	Time   time.Time `json:"time"`
	Tenant string    `json:"tenant"`
	// Actor is the user, or "" when nobody was authenticated.
	Actor string `json:"actor"`
	Via   string `json:"via,omitempty"`
	// Action is login, login_failed, logout, auth_failed, token_created,
	// token_revoked, member_changed, session_created, session_deleted,
	// denied, or one of the background work's actions.
	Action  string `json:"action"`
	Session string `json:"session,omitempty"`
	// Target is e.g. the member whose role changed, or a token id.
	Target string `json:"target,omitempty"`
	// Outcome is AuditOK, AuditDenied or AuditFailed.
	Outcome string `json:"outcome"`
	// Detail is a short reason; never a secret or prompt text.
	Detail string `json:"detail,omitempty"`
	// Remote is the caller's address.
	Remote string `json:"remote"`
}

// AuditPage is one page of the audit log, newest first.
type AuditPage struct {
	Entries []AuditEntry `json:"entries"`
	// Next is the cursor of the following (older) page; "" at the end.
	Next string `json:"next"`
}

// Authentication modes of a server, the Mode of its AuthConfig.
const (
	// AuthModeOIDC: people log in through the OIDC issuer; bearers are its
	// tokens or API tokens.
	AuthModeOIDC = "oidc"
	// AuthModeDev: `atrium dev` without an issuer; the bearer "dev:<user>"
	// is anyone it names, from loopback only.
	AuthModeDev = "dev"
	// AuthModeTokens: only Atrium API tokens are accepted; no interactive
	// login.
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
	// confidential, some providers require one anyway. The browser
	// client's secret is never published.
	ClientID     string `json:"client_id,omitempty"`
	ClientSecret string `json:"client_secret,omitempty"`
	// Scopes are the scopes to request; empty means the CLI's defaults.
	Scopes []string `json:"scopes,omitempty"`
	// LoginURL is the browser login path ("/auth/login" or "/auth/dev").
	LoginURL string `json:"login_url,omitempty"`
	// DevUser is, in mode dev, the user name the sign-in form suggests:
	// the one the CLI on the server's machine acts as by default.
	DevUser string `json:"dev_user,omitempty"`
}
