package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/spf13/cobra"
	"golang.org/x/oauth2"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// DefaultLoginTimeout bounds how long `atrium login` waits for the browser
// in the loopback flow (the device flow ends when its code expires).
const DefaultLoginTimeout = 10 * time.Minute

// defaultScopes are requested when the server's /auth/config names none;
// offline_access is added when the issuer supports it, for a refresh token.
var defaultScopes = []string{oidc.ScopeOpenID, "email", "profile"}

func newLoginCmd(env *cliEnv) *cobra.Command {
	var (
		conn      connFlags
		noBrowser bool
		device    bool
		loopback  bool
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "login",
		Short: "Log in to a server through its identity provider",
		Long: `Log in to an Atrium server through the organisation's identity provider (OIDC)
and store the login for the client commands.

The server says how it authenticates (GET /auth/config). With an OIDC issuer,
login uses the OAuth device flow when the issuer supports it: open the page it
prints on any device and enter the code. Otherwise (or with --loopback) it
opens your browser on the issuer's login page and receives the result on
http://127.0.0.1:PORT/callback (authorization code with PKCE); --no-browser
prints the address to open instead.

The login (an ID token and a refresh token) is stored per server in
<config dir>/atrium/credentials.json (mode 0600; on Linux ~/.config/atrium,
or $ATRIUM_CONFIG_DIR) and refreshed automatically before it expires. The
client commands use it whenever no --token or ATRIUM_TOKEN is given.

A server running 'atrium dev' without an issuer needs no login: the client
commands send the dev identity dev:$USER. A server in API-token mode accepts
only tokens made with 'atrium token create': pass them with --token.`,
		Example: `  atrium login --server https://atrium.example.com
  atrium login --no-browser                 # on a machine without a browser
  atrium login --loopback                   # browser login even if the device flow is available
  ATRIUM_SERVER=https://atrium.example.com atrium login && atrium ls`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if device && loopback {
				return usageError(cmd, "give --device or --loopback, not both")
			}
			if timeout <= 0 {
				return usageError(cmd, "--timeout must be positive")
			}
			c, err := conn.anonymous(cmd, env)
			if err != nil {
				return err
			}
			l := &loginFlow{env: env, server: c.Server, noBrowser: noBrowser, device: device, loopback: loopback, timeout: timeout}
			return l.run(cmd.Context(), c)
		},
	}
	conn.registerServer(cmd)
	f := cmd.Flags()
	f.BoolVar(&noBrowser, "no-browser", false, "print the login address instead of opening a browser")
	f.BoolVar(&device, "device", false, "use the OAuth device flow (fails if the issuer lacks it)")
	f.BoolVar(&loopback, "loopback", false, "use the browser and a loopback redirect even if the device flow is available")
	f.DurationVar(&timeout, "timeout", DefaultLoginTimeout, "how long to wait for the browser login")
	return cmd
}

// loginFlow is one run of `atrium login`.
type loginFlow struct {
	env       *cliEnv
	server    string
	noBrowser bool
	device    bool
	loopback  bool
	timeout   time.Duration
}

// issuerMeta is what login reads of the issuer's discovery document beyond
// what go-oidc exposes.
type issuerMeta struct {
	DeviceAuthURL    string   `json:"device_authorization_endpoint"`
	AuthMethods      []string `json:"token_endpoint_auth_methods_supported"`
	ScopesSupported  []string `json:"scopes_supported"`
	ChallengeMethods []string `json:"code_challenge_methods_supported"`
}

func (l *loginFlow) say(format string, args ...any) {
	fmt.Fprintf(l.env.stderr, format+"\n", args...)
}

func (l *loginFlow) run(ctx context.Context, c *client.Client) error {
	cfg, err := c.AuthConfig(ctx)
	if err != nil {
		var se *session.Error
		if errors.As(err, &se) && se.Code == session.CodeNotFound {
			return cliError{err: err, msg: "the server at " + l.server + " does not say how to log in (no /auth/config)",
				hint: "is --server the URL of an Atrium gateway? an older server accepts only --token"}
		}
		return explain(err, l.server)
	}
	switch cfg.Mode {
	case client.AuthModeDev:
		l.say("The server at %s uses the dev identity and needs no login: pass --token dev:<user>", l.server)
		l.say("(without --token, the client commands send dev:$USER). Nothing was stored.")
		return nil
	case client.AuthModeTokens:
		return cliError{msg: "the server at " + l.server + " accepts only Atrium API tokens; there is nothing to log in to",
			hint: "pass --token atr_... (or set " + envToken + "); a user with access creates one with 'atrium token create'"}
	case client.AuthModeOIDC:
	default:
		return cliError{msg: fmt.Sprintf("the server at %s uses authentication mode %q, which this atrium does not know", l.server, cfg.Mode),
			hint: "upgrade atrium"}
	}
	if cfg.Issuer == "" || cfg.ClientID == "" {
		return cliError{msg: "the server at " + l.server + " names no OIDC issuer or client id for the CLI",
			hint: "ask its operator to configure the CLI client (see docs/auth.md)"}
	}

	provider, err := oidc.NewProvider(ctx, cfg.Issuer)
	if err != nil {
		if interrupted(ctx) {
			return exitError{code: 130, msg: "login aborted"}
		}
		return cliError{err: err, msg: fmt.Sprintf("cannot reach the identity provider %s: %v", cfg.Issuer, err),
			hint: "check your network; the server's operator configured this issuer"}
	}
	var meta issuerMeta
	if err := provider.Claims(&meta); err != nil {
		return fmt.Errorf("read the issuer's discovery document: %w", err)
	}
	oc := &oauth2.Config{
		ClientID:     cfg.ClientID,
		ClientSecret: cfg.ClientSecret,
		Endpoint:     provider.Endpoint(),
		Scopes:       scopesFor(cfg.Scopes, meta.ScopesSupported),
	}
	style := authStyleFor(cfg.ClientSecret, meta.AuthMethods)
	oc.Endpoint.AuthStyle = oauth2.AuthStyleInParams
	if style == authStyleHeader {
		oc.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
	}

	var (
		tok   *oauth2.Token
		nonce string
	)
	switch {
	case l.device && meta.DeviceAuthURL == "":
		return cliError{msg: "the identity provider " + cfg.Issuer + " does not support the device flow",
			hint: "run atrium login without --device to log in with your browser"}
	case l.device || (!l.loopback && meta.DeviceAuthURL != ""):
		tok, err = l.deviceFlow(ctx, oc)
		var unavailable deviceUnavailable
		if !l.device && errors.As(err, &unavailable) {
			// Providers advertise the device flow even for clients not
			// allowed to use it: fall back to the browser.
			l.say("The device flow is not available to this client (%v); using the browser instead.", unavailable.err)
			tok, nonce, err = l.loopbackFlow(ctx, oc)
		}
	default:
		tok, nonce, err = l.loopbackFlow(ctx, oc)
	}
	if err != nil {
		return err
	}

	stored := &storedLogin{
		Issuer: cfg.Issuer, ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret,
		TokenURL: oc.Endpoint.TokenURL, AuthStyle: style, Scopes: oc.Scopes, LoggedInAt: time.Now().UTC(),
	}
	if err := stored.setToken(tok); err != nil {
		return cliError{err: err, msg: "login failed: " + err.Error()}
	}
	idt, err := provider.Verifier(&oidc.Config{ClientID: cfg.ClientID}).Verify(ctx, stored.IDToken)
	if err != nil {
		return cliError{err: err, msg: "login failed: the ID token from " + cfg.Issuer + " did not verify: " + err.Error()}
	}
	if nonce != "" && subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(nonce)) != 1 {
		return cliError{msg: "login failed: the ID token's nonce does not match this login", hint: "run atrium login again"}
	}

	// Ask the server who the token makes us before storing it.
	c.Token = stored.IDToken
	who, err := c.Whoami(ctx)
	if err != nil {
		var se *session.Error
		if errors.As(err, &se) && se.Code == session.CodeUnauthenticated {
			return cliError{err: err, msg: "the server at " + l.server + " refused the login: " + se.Message,
				hint: "the server's operator may need to accept ID tokens for the CLI's client id " + cfg.ClientID}
		}
		return explain(err, l.server)
	}
	stored.User, stored.Tenant = who.User, who.Tenant
	store, err := newCredStore(l.env)
	if err != nil {
		return err
	}
	if err := store.put(l.server, stored); err != nil {
		return err
	}
	l.say("Stored the login in %s; it is refreshed automatically.", store.path)
	_, err = fmt.Fprintf(l.env.stdout, "Logged in to %s as %s%s.\n", l.server, who.User, tenantNote(who))
	return err
}

// tenantNote is " (tenant acme, admin)" or "".
func tenantNote(w client.Whoami) string {
	var parts []string
	if w.Tenant != "" {
		parts = append(parts, "tenant "+w.Tenant)
	}
	if w.Admin {
		parts = append(parts, "tenant admin")
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// scopesFor returns the scopes to request: the server's, else the defaults,
// with openid always and offline_access when the issuer lists it.
func scopesFor(server, supported []string) []string {
	scopes := slices.Clone(server)
	if len(scopes) == 0 {
		scopes = slices.Clone(defaultScopes)
		if slices.Contains(supported, oidc.ScopeOfflineAccess) {
			scopes = append(scopes, oidc.ScopeOfflineAccess)
		}
	}
	if !slices.Contains(scopes, oidc.ScopeOpenID) {
		scopes = append([]string{oidc.ScopeOpenID}, scopes...)
	}
	return scopes
}

// authStyleFor picks how to send the client credentials to the token
// endpoint: a public client (no secret) sends its id in the form; with a
// secret, client_secret_post when the issuer lists it, else
// client_secret_basic (the default of OIDC discovery).
func authStyleFor(secret string, methods []string) string {
	if secret == "" || slices.Contains(methods, "client_secret_post") {
		return authStyleParams
	}
	return authStyleHeader
}

// deviceUnavailable is the identity provider refusing to start a device
// login for this client.
type deviceUnavailable struct{ err error }

func (e deviceUnavailable) Error() string {
	return "start the device login: " + e.err.Error() + "\n  hint: run atrium login --loopback to log in with your browser"
}

// deviceFlow runs the OAuth 2.0 device authorization grant (RFC 8628).
func (l *loginFlow) deviceFlow(ctx context.Context, oc *oauth2.Config) (*oauth2.Token, error) {
	da, err := oc.DeviceAuth(ctx)
	if err != nil {
		if interrupted(ctx) {
			return nil, exitError{code: 130, msg: "login aborted"}
		}
		var re *oauth2.RetrieveError
		if errors.As(err, &re) {
			return nil, deviceUnavailable{oauthError(err)}
		}
		return nil, cliError{err: err, msg: "start the device login: " + err.Error()}
	}
	l.say("To log in, open %s and enter the code %s", da.VerificationURI, da.UserCode)
	open := da.VerificationURI
	if da.VerificationURIComplete != "" {
		l.say("(or open %s, which has the code filled in)", da.VerificationURIComplete)
		open = da.VerificationURIComplete
	}
	if !l.noBrowser {
		l.openBrowser(open)
	}
	l.say("Waiting for you to log in… (Ctrl-C to abort)")
	tok, err := oc.DeviceAccessToken(ctx, da)
	if err == nil {
		return tok, nil
	}
	var re *oauth2.RetrieveError
	switch {
	case interrupted(ctx):
		return nil, exitError{code: 130, msg: "login aborted"}
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &re) && re.ErrorCode == "expired_token":
		return nil, cliError{err: err, msg: "the code expired before the login was approved", hint: "run atrium login again"}
	case errors.As(err, &re) && re.ErrorCode == "access_denied":
		return nil, cliError{err: err, msg: "the login was denied at the identity provider"}
	}
	return nil, cliError{err: err, msg: "device login failed: " + oauthError(err).Error()}
}

// loopbackFlow runs the authorization code flow with PKCE (S256), state
// and nonce, receiving the code on a loopback redirect
// http://127.0.0.1:PORT/callback.
func (l *loginFlow) loopbackFlow(ctx context.Context, oc *oauth2.Config) (*oauth2.Token, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("listen for the login redirect: %w", err)
	}
	cfg := *oc
	cfg.RedirectURL = "http://" + ln.Addr().String() + "/callback"
	state, nonce, verifier := randomString(), randomString(), oauth2.GenerateVerifier()
	authURL := cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier), oidc.Nonce(nonce))

	cb := &callback{state: state, got: make(chan callbackResult, 1), done: make(chan string), quit: make(chan struct{})}
	srv := &http.Server{Handler: cb, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	defer func() {
		close(cb.quit)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		wg.Wait()
	}()

	if l.noBrowser {
		l.say("To log in, open this address in a browser on this machine:\n\n  %s\n", authURL)
	} else {
		l.say("Opening your browser to log in. If it does not open, visit:\n\n  %s\n", authURL)
		l.openBrowser(authURL)
	}
	l.say("Waiting for you to log in… (Ctrl-C to abort)")

	wctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var res callbackResult
	select {
	case res = <-cb.got:
	case <-wctx.Done():
		if interrupted(ctx) {
			return nil, "", exitError{code: 130, msg: "login aborted"}
		}
		return nil, "", cliError{msg: fmt.Sprintf("no login within %s", l.timeout), hint: "run atrium login again (or --timeout 30m)"}
	}
	// The browser waits for the outcome (see callback), so its page can
	// say whether the login worked.
	finish := func(msg string) {
		select {
		case cb.done <- msg:
		case <-time.After(5 * time.Second):
		}
	}
	if res.err != "" {
		finish("The login failed: " + res.err)
		return nil, "", cliError{msg: "the identity provider refused the login: " + res.err}
	}
	tok, err := cfg.Exchange(wctx, res.code, oauth2.VerifierOption(verifier))
	if err != nil {
		finish("The login failed: see the terminal.")
		if interrupted(ctx) {
			return nil, "", exitError{code: 130, msg: "login aborted"}
		}
		return nil, "", cliError{err: err, msg: "exchange the login code: " + oauthError(err).Error()}
	}
	finish("You are logged in to Atrium. You can close this tab and return to the terminal.")
	return tok, nonce, nil
}

// callback receives the authorization response on the loopback redirect.
// Only a response carrying this login's state counts; others (a stray
// request, a forged redirect) are refused and the login keeps waiting.
type callback struct {
	state string
	got   chan callbackResult // the first valid response
	done  chan string         // what to tell the browser
	quit  chan struct{}       // closed when the login stops listening
	once  sync.Once
}

type callbackResult struct {
	code string
	err  string // the provider's error and description
}

func (cb *callback) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/callback" {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(cb.state)) != 1 {
		writePage(w, http.StatusBadRequest, "This login response is not for the running atrium login (state mismatch).")
		return
	}
	res := callbackResult{code: q.Get("code")}
	if e := q.Get("error"); e != "" {
		res = callbackResult{err: strings.TrimSpace(e + ": " + q.Get("error_description"))}
	} else if res.code == "" {
		writePage(w, http.StatusBadRequest, "The login response has no code.")
		return
	}
	first := false
	cb.once.Do(func() {
		first = true
		cb.got <- res
	})
	if !first {
		writePage(w, http.StatusConflict, "This login was already answered.")
		return
	}
	select {
	case msg := <-cb.done:
		writePage(w, http.StatusOK, msg)
	case <-cb.quit:
		writePage(w, http.StatusServiceUnavailable, "The login stopped waiting: see the terminal.")
	case <-r.Context().Done():
	}
}

func writePage(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html><title>Atrium login</title><p style=\"font:16px sans-serif;margin:3em\">%s</p>\n", html.EscapeString(msg))
}

// openBrowser opens url with $BROWSER, else the platform's opener. It does
// not wait for the browser; failing to open it is not an error, the URL was
// printed.
func (l *loginFlow) openBrowser(url string) {
	var argv []string
	if b := lookupEnv(l.env, "BROWSER"); b != "" {
		first, _, _ := strings.Cut(b, ":")
		argv = strings.Fields(first)
		if i := slices.IndexFunc(argv, func(a string) bool { return strings.Contains(a, "%s") }); i >= 0 {
			argv[i] = strings.ReplaceAll(argv[i], "%s", url)
		} else {
			argv = append(argv, url)
		}
	} else {
		switch runtime.GOOS {
		case "darwin":
			argv = []string{"open", url}
		case "windows":
			argv = []string{"rundll32", "url.dll,FileProtocolHandler", url}
		default:
			argv = []string{"xdg-open", url}
		}
	}
	if len(argv) == 0 {
		return
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		l.say("(could not open a browser: %v)", err)
		return
	}
	_ = cmd.Process.Release() // the browser outlives us
}

func randomString() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand never fails on supported platforms.
	return hex.EncodeToString(b)
}

func newLogoutCmd(env *cliEnv) *cobra.Command {
	var conn connFlags
	cmd := &cobra.Command{
		Use:   "logout",
		Short: "Forget the stored login for a server",
		Long: `Delete the login that 'atrium login' stored for a server (its ID and refresh
tokens) from <config dir>/atrium/credentials.json. Logins to other servers
are kept. The identity provider's own session, if any, is not ended.`,
		Example: `  atrium logout
  atrium logout --server https://atrium.example.com`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := conn.anonymous(cmd, env)
			if err != nil {
				return err
			}
			store, err := newCredStore(env)
			if err != nil {
				return err
			}
			removed, err := store.remove(c.Server)
			if err != nil {
				return err
			}
			if !removed {
				_, err = fmt.Fprintf(env.stdout, "You were not logged in to %s; nothing to do.\n", c.Server)
				return err
			}
			_, err = fmt.Fprintf(env.stdout, "Logged out of %s: removed its login from %s.\n", c.Server, store.path)
			return err
		},
	}
	conn.registerServer(cmd)
	return cmd
}

func newWhoamiCmd(env *cliEnv) *cobra.Command {
	var (
		conn   connFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "whoami",
		Short: "Show who the server takes you for",
		Long: `Ask the server who the credentials the client commands send make you: your
user, tenant, whether you are a tenant admin, how you authenticated and when
the credential expires.`,
		Example: `  atrium whoami
  atrium whoami --json | jq -r .user
  atrium whoami --token "$BOT_TOKEN"`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := conn.client(cmd, env)
			if err != nil {
				return err
			}
			w, err := c.Whoami(cmd.Context())
			if err != nil {
				return explain(err, conn.server)
			}
			if asJSON {
				return writeJSON(env.stdout, struct {
					client.Whoami
					Server      string `json:"server"`
					Credentials string `json:"credentials"`
				}{w, conn.server, conn.source})
			}
			return printWhoami(env, w, &conn, time.Now())
		},
	}
	conn.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func printWhoami(env *cliEnv, w client.Whoami, conn *connFlags, now time.Time) error {
	via := w.Via
	switch conn.source {
	case sourceLogin:
		via += ", stored login"
	case sourceFlag:
		via += ", --token"
	case sourceEnv:
		via += ", " + envToken
	case sourceDev:
		via += ", the default dev:$USER"
	}
	lines := [][2]string{{"user", w.User}}
	if w.Tenant != "" {
		lines = append(lines, [2]string{"tenant", w.Tenant})
	}
	if w.Admin {
		lines = append(lines, [2]string{"admin", "yes (tenant admin)"})
	}
	lines = append(lines, [2]string{"via", via}, [2]string{"server", conn.server})
	exp := w.ExpiresAt
	if conn.login != nil && exp.IsZero() {
		exp = conn.login.Expiry
	}
	if !exp.IsZero() {
		note := "in " + humanDuration(exp.Sub(now))
		if exp.Before(now) {
			note = "expired " + humanDuration(now.Sub(exp)) + " ago"
		}
		if conn.source == sourceLogin {
			note += ", refreshed automatically"
		}
		lines = append(lines, [2]string{"expires", exp.Local().Format("2006-01-02 15:04 MST") + " (" + note + ")"})
	}
	for _, l := range lines {
		if _, err := fmt.Fprintf(env.stdout, "%-8s %s\n", l[0]+":", l[1]); err != nil {
			return err
		}
	}
	return nil
}
