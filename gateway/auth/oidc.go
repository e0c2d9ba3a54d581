package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"golang.org/x/oauth2"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
)

// Defaults of OIDCConfig.
const (
	DefaultCookieTTL       = 12 * time.Hour
	DefaultUserClaim       = "email"
	DefaultGroupsClaim     = "groups"
	DefaultProviderTimeout = 10 * time.Second
	// MinCookieKey is the least length of OIDCConfig.CookieKey in bytes.
	MinCookieKey = 32
	// LoginTimeout is how long a browser has to come back from the
	// provider to /auth/callback.
	LoginTimeout = 10 * time.Minute
)

// DefaultScopes returns the scopes asked for when OIDCConfig.Scopes is empty:
// openid profile email, and offline_access for a refresh token, which
// renews browser logins silently.
func DefaultScopes() []string {
	return []string{oidc.ScopeOpenID, "profile", "email", oidc.ScopeOfflineAccess}
}

// OIDCConfig configures logins and bearer tokens of an OpenID Connect
// provider. Setting names in Validate's errors are those of the
// configuration file (auth.oidc.*, auth.cookie_*).
type OIDCConfig struct {
	// Issuer is the provider's issuer URL: https, or http for a provider on
	// a loopback address. Its discovery document is read at start-up.
	Issuer string
	// ClientID and ClientSecret are the gateway's (confidential) client.
	ClientID     string
	ClientSecret string
	// RedirectURL is the gateway's /auth/callback URL as browsers reach it,
	// registered with the provider. An https URL makes the cookies Secure.
	RedirectURL string
	// Scopes are asked for at login; default DefaultScopes().
	Scopes []string
	// Audience, if set, is also accepted as the audience of bearer tokens:
	// JWT access tokens issued for Atrium as an API.
	Audience string
	// UserClaim names the claim that is a user's name; default "email".
	// A token without it falls back to "sub". With "email", a token whose
	// email_verified is false is refused.
	UserClaim string
	// TenantClaim names the claim holding a user's tenant (e.g. "org"): a
	// string, or a list with exactly one value. A user without it is
	// refused. Leave it empty for a single-tenant install: everyone is then
	// in DefaultTenant.
	TenantClaim   string
	DefaultTenant string
	// GroupsClaim names the claim listing a user's groups; default
	// "groups". Members of AdminGroup are admins of their tenant.
	GroupsClaim string
	AdminGroup  string
	// OperatorGroup's members are operators (session.Principal.Operator):
	// they read the whole cluster's state, every tenant's included. Empty:
	// nobody logged in through the provider is an operator.
	OperatorGroup string
	// CookieKey seals the login cookie (AES-GCM): at least MinCookieKey
	// random bytes. Changing it logs everybody out.
	CookieKey []byte
	// CookieTTL is how long a browser login lasts; default
	// DefaultCookieTTL. Silent refreshes do not extend it.
	CookieTTL time.Duration
	// Secure forces the Secure flag on cookies; it is on anyway when
	// RedirectURL is https.
	Secure bool
	// PostLogoutRedirectURL, if set, is where the provider sends the
	// browser after logout (it must be registered with the provider).
	PostLogoutRedirectURL string
	// CLIClientID and CLIClientSecret are the public client of `atrium
	// login`, published by GET /auth/config; default ClientID and no
	// secret. Tokens issued to it are accepted as bearers.
	CLIClientID     string
	CLIClientSecret string
	// HTTPClient talks to the provider; default a client of its own with a
	// DefaultProviderTimeout timeout, closed by Close.
	HTTPClient *http.Client
	// Audit records logins, failed logins and logouts; default
	// audit.Discard.
	Audit audit.Recorder
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now. Tests set it.
	Now func() time.Time
}

// Validate reports every setting that is wrong, naming it.
func (c *OIDCConfig) Validate() error {
	var errs []error
	bad := func(setting, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", setting, fmt.Sprintf(format, args...)))
	}
	switch err := checkURL(c.Issuer); {
	case c.Issuer == "":
		bad("auth.oidc.issuer", "required (the URL of your OpenID Connect provider)")
	case err != nil:
		bad("auth.oidc.issuer", "%q %v", c.Issuer, err)
	}
	if c.ClientID == "" {
		bad("auth.oidc.client_id", "required (the client registered for Atrium at the provider)")
	}
	switch err := checkURL(c.RedirectURL); {
	case c.RedirectURL == "":
		bad("public_url", "required: the OIDC redirect URL <public_url>/auth/callback is built from it")
	case err != nil:
		bad("public_url", "redirect URL %q %v", c.RedirectURL, err)
	}
	const how = "generate one with `openssl rand -base64 32`"
	switch n := len(c.CookieKey); {
	case n == 0:
		bad("auth.cookie_key", "required (it seals browser logins); %s", how)
	case n < MinCookieKey:
		bad("auth.cookie_key", "%d bytes is too short (at least %d); %s", n, MinCookieKey, how)
	}
	if c.CookieTTL != 0 && c.CookieTTL < time.Minute {
		bad("auth.cookie_ttl", "%v is too short (at least 1m)", c.CookieTTL)
	}
	if c.TenantClaim != "" && c.DefaultTenant != "" {
		bad("auth.oidc.default_tenant", "set either auth.oidc.tenant_claim (each user's tenant comes from that claim) "+
			"or auth.oidc.default_tenant (one tenant for everybody), not both")
	}
	if len(c.Scopes) > 0 && !slices.Contains(c.Scopes, oidc.ScopeOpenID) {
		bad("auth.oidc.scopes", "must include openid")
	}
	if c.PostLogoutRedirectURL != "" {
		if err := checkURL(c.PostLogoutRedirectURL); err != nil {
			bad("auth.oidc.post_logout_redirect_url", "%q %v", c.PostLogoutRedirectURL, err)
		}
	}
	return errors.Join(errs...)
}

// checkURL accepts an absolute https URL, or http for a loopback host.
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return errors.New("is not an absolute http(s) URL")
	}
	if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		return errors.New("must be an https URL (http is allowed only for loopback)")
	}
	return nil
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// OIDC authenticates the users of an OpenID Connect provider: browsers log
// in with the authorization code flow (PKCE S256, state and nonce) and get a
// sealed login cookie, renewed silently with the provider's refresh token;
// other clients send the provider's ID tokens, or JWT access tokens for
// OIDCConfig.Audience, as bearers.
//
// It implements Authenticator, Router (/auth/login, /auth/callback,
// /auth/logout), Describer and Refresher.
type OIDC struct {
	cfg        OIDCConfig
	log        *slog.Logger
	audit      audit.Recorder
	now        func() time.Time
	client     *http.Client
	ownClient  bool
	oauth      oauth2.Config
	verifier   *oidc.IDTokenVerifier
	keys       *keySet
	algs       []string
	audiences  []string
	endSession string
	seal       *sealer
	secure     bool
	refreshes  refreshes
	failures   auditLimit
	closeOnce  sync.Once
}

var (
	_ Authenticator = (*OIDC)(nil)
	_ Router        = (*OIDC)(nil)
	_ Describer     = (*OIDC)(nil)
	_ Refresher     = (*OIDC)(nil)
)

// asymmetric lists the signature algorithms accepted when the provider
// advertises them: never "none" or a shared-secret (HS*) algorithm.
var asymmetric = []string{
	oidc.RS256, oidc.RS384, oidc.RS512, oidc.PS256, oidc.PS384, oidc.PS512,
	oidc.ES256, oidc.ES384, oidc.ES512, oidc.EdDSA,
}

// NewOIDC fills cfg's defaults, validates it and reads the issuer's
// discovery document. ctx bounds the discovery request only.
func NewOIDC(ctx context.Context, cfg OIDCConfig) (*OIDC, error) {
	if cfg.UserClaim == "" {
		cfg.UserClaim = DefaultUserClaim
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = DefaultGroupsClaim
	}
	if len(cfg.Scopes) == 0 {
		cfg.Scopes = DefaultScopes()
	}
	if cfg.CookieTTL == 0 {
		cfg.CookieTTL = DefaultCookieTTL
	}
	if cfg.CLIClientID == "" {
		cfg.CLIClientID = cfg.ClientID
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := &OIDC{
		cfg:    cfg,
		log:    cfg.Logger,
		audit:  cfg.Audit,
		now:    cfg.Now,
		client: cfg.HTTPClient,
		secure: cfg.Secure || strings.HasPrefix(cfg.RedirectURL, "https:"),
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.audit == nil {
		o.audit = audit.Discard
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.client == nil {
		o.client = &http.Client{
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
			Timeout:   DefaultProviderTimeout,
		}
		o.ownClient = true
	}
	var err error
	if o.seal, err = newSealer(cfg.CookieKey); err != nil {
		return nil, err
	}

	provider, err := oidc.NewProvider(oidc.ClientContext(ctx, o.client), cfg.Issuer)
	if err != nil {
		o.Close()
		return nil, fmt.Errorf("auth.oidc.issuer: read the discovery document of %s: %w", cfg.Issuer, err)
	}
	var meta struct {
		JWKSURL    string   `json:"jwks_uri"`
		Algs       []string `json:"id_token_signing_alg_values_supported"`
		EndSession string   `json:"end_session_endpoint"`
		PKCE       []string `json:"code_challenge_methods_supported"`
	}
	if err := provider.Claims(&meta); err != nil {
		o.Close()
		return nil, fmt.Errorf("auth.oidc.issuer: decode the discovery document of %s: %w", cfg.Issuer, err)
	}
	if meta.JWKSURL == "" {
		o.Close()
		return nil, fmt.Errorf("auth.oidc.issuer: the discovery document of %s has no jwks_uri", cfg.Issuer)
	}
	if len(meta.PKCE) > 0 && !slices.Contains(meta.PKCE, "S256") {
		o.Close()
		return nil, fmt.Errorf("auth.oidc.issuer: %s does not support PKCE with S256 (it offers %s), which Atrium's login needs",
			cfg.Issuer, strings.Join(meta.PKCE, ", "))
	}
	for _, a := range meta.Algs {
		if slices.Contains(asymmetric, a) {
			o.algs = append(o.algs, a)
		}
	}
	if len(o.algs) == 0 {
		o.algs = []string{oidc.RS256}
	}
	o.endSession = meta.EndSession
	jalgs := make([]jose.SignatureAlgorithm, len(o.algs))
	for i, a := range o.algs {
		jalgs[i] = jose.SignatureAlgorithm(a)
	}
	o.keys = &keySet{url: meta.JWKSURL, client: o.client, now: o.now, algs: jalgs, log: o.log}
	o.verifier = oidc.NewVerifier(cfg.Issuer, o.keys, &oidc.Config{
		SkipClientIDCheck:    true, // checked by verify, which accepts several audiences
		SupportedSigningAlgs: o.algs,
		Now:                  o.now,
	})
	o.audiences = []string{cfg.ClientID}
	if cfg.CLIClientID != cfg.ClientID {
		o.audiences = append(o.audiences, cfg.CLIClientID)
	}
	if cfg.Audience != "" {
		o.audiences = append(o.audiences, cfg.Audience)
	}
	o.oauth = oauth2.Config{
		ClientID:     cfg.ClientID,
		ClientSecret: cfg.ClientSecret,
		Endpoint:     provider.Endpoint(),
		RedirectURL:  cfg.RedirectURL,
		Scopes:       cfg.Scopes,
	}
	return o, nil
}

// Close releases the connections to the provider (if OIDC made its own HTTP
// client). It is safe to call more than once.
func (o *OIDC) Close() error {
	o.closeOnce.Do(func() {
		if o.ownClient {
			o.client.CloseIdleConnections()
		}
	})
	return nil
}

// Describe implements Describer: mode "oidc", with the CLI's client.
func (o *OIDC) Describe() ConfigInfo {
	return ConfigInfo{
		Mode:         ModeOIDC,
		Issuer:       o.cfg.Issuer,
		ClientID:     o.cfg.CLIClientID,
		ClientSecret: o.cfg.CLIClientSecret,
		Scopes:       slices.Clone(o.cfg.Scopes),
		LoginURL:     "/auth/login",
	}
}

// Authenticate implements Authenticator. A bearer that is a JWT is verified
// as the issuer's ID token (audience ClientID or CLIClientID) or access token
// (audience Audience); other bearers are not OIDC's (ErrNoCredentials).
// Without a bearer, the login cookie is checked.
func (o *OIDC) Authenticate(r *http.Request) (session.Principal, error) {
	if tok, ok := bearer(r); ok {
		if !isJWT(tok) {
			return session.Principal{}, noCredentials(
				"unrecognised bearer token: send an ID token or access token of " + o.cfg.Issuer + ", or an Atrium API token")
		}
		return o.bearerPrincipal(r.Context(), tok)
	}
	if c, err := r.Cookie(LoginCookie); err == nil {
		return o.cookiePrincipal(c.Value)
	}
	return session.Principal{}, noCredentials(
		"no credentials: log in at /auth/login, or send Authorization: Bearer <token> (atrium login)")
}

func (o *OIDC) bearerPrincipal(ctx context.Context, raw string) (session.Principal, error) {
	tok, claims, err := o.verify(ctx, raw, o.audiences)
	if err != nil {
		return session.Principal{}, err
	}
	p, err := o.principal(claims)
	if err != nil {
		return session.Principal{}, err
	}
	p.Via = session.ViaOIDC
	p.Expires = tok.Expiry
	return p, nil
}

func (o *OIDC) cookiePrincipal(value string) (session.Principal, error) {
	var l login
	if err := o.seal.open(LoginCookie, value, &l); err != nil {
		return session.Principal{}, session.Errorf(session.CodeUnauthenticated,
			"the login cookie is not valid (altered, or sealed with another key): log in again at /auth/login")
	}
	now := o.now()
	expires := time.Unix(l.Expires, 0)
	if !now.Before(expires) {
		return session.Principal{}, expired(session.Errorf(session.CodeUnauthenticated,
			"your login expired at %s: log in again at /auth/login", expires.UTC().Format(time.RFC3339)))
	}
	if l.Refresh != "" && !now.Before(time.Unix(l.Fresh, 0)) {
		return session.Principal{}, expired(session.Errorf(session.CodeUnauthenticated,
			"session expired: log in again at /auth/login"))
	}
	return session.Principal{User: l.User, Tenant: l.Tenant, Admin: l.Admin, Operator: l.Operator, Via: session.ViaCookie, Expires: expires}, nil
}

// isJWT reports whether tok looks like a signed JWT: three dot-separated
// parts, the first a base64url JSON object.
func isJWT(tok string) bool {
	h, _, ok := strings.Cut(tok, ".")
	if !ok || strings.Count(tok, ".") != 2 {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(h)
	return err == nil && json.Valid(b) && strings.HasPrefix(strings.TrimSpace(string(b)), "{")
}

// unverified is what verify reads from a token before checking it, to say
// precisely what is wrong with a token that fails.
type unverified struct {
	Alg    string `json:"alg"`
	Issuer string `json:"iss"`
}

// verify checks raw: its algorithm is one the issuer signs with, its issuer
// is the issuer, its signature verifies with a key the issuer publishes, it
// has not expired, and its audience has one of audiences. It returns the
// token and its claims, or an unauthenticated error saying why not (or an
// unavailable one if the issuer's keys cannot be fetched).
func (o *OIDC) verify(ctx context.Context, raw string, audiences []string) (*oidc.IDToken, map[string]any, error) {
	parts := strings.Split(raw, ".")
	var head, body unverified
	if len(parts) != 3 || decodePart(parts[0], &head) != nil || decodePart(parts[1], &body) != nil {
		return nil, nil, unauthenticated("malformed token: not a signed JWT")
	}
	if !slices.Contains(o.algs, head.Alg) {
		return nil, nil, unauthenticated("signing algorithm %q is not accepted: %s signs with %s",
			clip(head.Alg), o.cfg.Issuer, strings.Join(o.algs, ", "))
	}
	if body.Issuer != o.cfg.Issuer {
		return nil, nil, unauthenticated("issuer %q is not %q: send a token of the configured issuer", clip(body.Issuer), o.cfg.Issuer)
	}
	note := &keyNote{}
	tok, err := o.verifier.Verify(context.WithValue(ctx, keyNoteKey{}, note), raw)
	if err != nil {
		return nil, nil, o.verifyError(err, note.err)
	}
	if !slices.ContainsFunc(tok.Audience, func(a string) bool { return slices.Contains(audiences, a) }) {
		return nil, nil, unauthenticated("audience %q not accepted: the token was issued for another client", clip(strings.Join(tok.Audience, ",")))
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return nil, nil, unauthenticated("malformed token: claims are not a JSON object")
	}
	return tok, claims, nil
}

// verifyError explains why go-oidc refused a token; keyErr is the key set's
// own error, if the signature check failed.
func (o *OIDC) verifyError(err, keyErr error) error {
	var (
		exp     *oidc.TokenExpiredError
		unknown *unknownKeyError
		down    *keysUnavailableError
	)
	switch {
	case errors.As(keyErr, &down):
		return session.Errorf(session.CodeUnavailable, "cannot fetch the identity provider's signing keys: try again shortly")
	case errors.As(keyErr, &unknown):
		return unauthenticated("unknown signing key %q: %s does not publish it (a token of another issuer, or of a key that was rotated out)",
			clip(unknown.kid), o.cfg.Issuer)
	case errors.Is(keyErr, errBadSignature):
		return unauthenticated("signature does not verify: the token was altered or not signed by %s", o.cfg.Issuer)
	case keyErr != nil:
		return unauthenticated("malformed token: %s", clip(keyErr.Error()))
	case errors.As(err, &exp):
		return expired(unauthenticated("token expired at %s: get a new one (atrium login)", exp.Expiry.UTC().Format(time.RFC3339)))
	}
	return unauthenticated("invalid token: %s", clip(strings.TrimPrefix(err.Error(), "oidc: ")))
}

func decodePart(s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// clip shortens text taken from a token for an error message.
func clip(s string) string {
	const n = 80
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func unauthenticated(format string, args ...any) *session.Error {
	return session.Errorf(session.CodeUnauthenticated, format, args...)
}

// principal maps a verified token's claims to the caller. Claims that cannot
// make an Atrium user give a forbidden error saying what is missing.
func (o *OIDC) principal(claims map[string]any) (session.Principal, error) {
	user, _ := claims[o.cfg.UserClaim].(string)
	if user == "" {
		user, _ = claims["sub"].(string)
	}
	if user == "" {
		return session.Principal{}, session.Errorf(session.CodeForbidden,
			"the token has neither a %q nor a \"sub\" claim to name you", o.cfg.UserClaim)
	}
	if o.cfg.UserClaim == "email" && user == claims["email"] && isFalse(claims["email_verified"]) {
		return session.Principal{}, session.Errorf(session.CodeForbidden,
			"email %q is not verified at the identity provider: verify it there, then log in again", clip(user))
	}
	if err := session.ValidUser(user); err != nil {
		return session.Principal{}, session.Errorf(session.CodeForbidden,
			"the %q claim is not a usable Atrium user name: %s", o.cfg.UserClaim, session.AsError(err).Message)
	}
	p := session.Principal{User: user, Tenant: o.cfg.DefaultTenant}
	if c := o.cfg.TenantClaim; c != "" {
		vals := claimStrings(claims[c])
		switch {
		case len(vals) == 0:
			return session.Principal{}, session.Errorf(session.CodeForbidden,
				"your account has no %q claim, which names your Atrium tenant: ask your identity provider's administrator to set it", c)
		case len(vals) > 1:
			return session.Principal{}, session.Errorf(session.CodeForbidden,
				"your %q claim has %d values: Atrium needs exactly one tenant per user", c, len(vals))
		}
		if err := validTenant(vals[0]); err != nil {
			return session.Principal{}, session.Errorf(session.CodeForbidden, "your %q claim: %v", c, err)
		}
		p.Tenant = vals[0]
	}
	if g := o.cfg.AdminGroup; g != "" {
		p.Admin = slices.Contains(claimStrings(claims[o.cfg.GroupsClaim]), g)
	}
	if g := o.cfg.OperatorGroup; g != "" {
		p.Operator = slices.Contains(claimStrings(claims[o.cfg.GroupsClaim]), g)
	}
	return p, nil
}

// claimStrings reads a claim that is a string or a list of strings.
func claimStrings(v any) []string {
	switch v := v.(type) {
	case string:
		if v == "" {
			return nil
		}
		return []string{v}
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			if s, ok := e.(string); ok && s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// isFalse reports whether a boolean claim is present and false (some
// providers send booleans as strings).
func isFalse(v any) bool {
	return v == false || v == "false"
}

func validTenant(t string) error {
	if len(t) > 128 {
		return errors.New("a tenant is at most 128 characters")
	}
	for _, r := range t {
		if r <= 0x20 || r == 0x7f {
			return fmt.Errorf("tenant %q has a space or control character", clip(t))
		}
	}
	return nil
}

// expiredError marks an authentic credential that has expired. A Throttle
// does not count it as a failure: it is not a guess.
type expiredError struct{ err *session.Error }

func expired(err *session.Error) error { return &expiredError{err: err} }

func (e *expiredError) Error() string { return e.err.Error() }
func (e *expiredError) Unwrap() error { return e.err }
