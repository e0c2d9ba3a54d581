package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"

	"github.com/atriumhq/atrium/session"
)

// Stored logins: `atrium login` keeps one per server in
// <config dir>/atrium/credentials.json (directory 0700, file 0600).
const (
	credentialsName = "credentials.json"
	credentialsVer  = 1
	// envConfigDir overrides the directory of credentials.json.
	envConfigDir = "ATRIUM_CONFIG_DIR"
	// refreshMargin: an ID token with less than this left is refreshed
	// before it is used, so it does not expire in flight.
	refreshMargin = 2 * time.Minute
)

// Auth styles of a stored login: how the client authenticates to the
// token endpoint.
const (
	authStyleParams = "params" // client_secret_post, or a public client
	authStyleHeader = "header" // client_secret_basic
)

// credentials is the content of credentials.json.
type credentials struct {
	Version int `json:"version"`
	// Servers maps a server's URL (as client.New normalises it) to the
	// login stored for it.
	Servers map[string]*storedLogin `json:"servers"`
}

// storedLogin is an OIDC login to one server: what is needed to send its ID
// token and to refresh it without asking the server again.
type storedLogin struct {
	Issuer   string `json:"issuer"`
	ClientID string `json:"client_id"`
	// ClientSecret is the server's public CLI client secret (an
	// "installed application" secret, not confidential), if any.
	ClientSecret string   `json:"client_secret,omitempty"`
	TokenURL     string   `json:"token_url"`
	AuthStyle    string   `json:"auth_style"`
	Scopes       []string `json:"scopes,omitempty"`

	User   string `json:"user,omitempty"`
	Tenant string `json:"tenant,omitempty"`

	IDToken      string `json:"id_token"`
	AccessToken  string `json:"access_token,omitempty"`
	TokenType    string `json:"token_type,omitempty"`
	RefreshToken string `json:"refresh_token,omitempty"`
	// Expiry is the ID token's expiry (its exp claim): the bearer the CLI
	// sends is the ID token.
	Expiry     time.Time `json:"expiry"`
	LoggedInAt time.Time `json:"logged_in_at"`
}

// credStore reads and writes credentials.json.
type credStore struct {
	path string
}

// configDir returns the user's configuration directory the way
// os.UserConfigDir does, but reading the environment through getenv (so
// tests choose it), with ATRIUM_CONFIG_DIR taking precedence as the atrium
// directory itself.
func configDir(getenv func(string) string) (string, error) {
	if d := getenv(envConfigDir); d != "" {
		return d, nil
	}
	var base string
	switch runtime.GOOS {
	case "windows":
		base = getenv("AppData")
	case "darwin", "ios":
		if h := getenv("HOME"); h != "" {
			base = filepath.Join(h, "Library", "Application Support")
		}
	default:
		base = getenv("XDG_CONFIG_HOME")
		if base != "" && !filepath.IsAbs(base) {
			base = ""
		}
		if base == "" {
			if h := getenv("HOME"); h != "" {
				base = filepath.Join(h, ".config")
			}
		}
	}
	if base == "" {
		return "", errors.New("cannot find your configuration directory: set HOME, XDG_CONFIG_HOME or " + envConfigDir)
	}
	return filepath.Join(base, "atrium"), nil
}

// newCredStore returns the store of the user's credentials.json.
func newCredStore(env *cliEnv) (*credStore, error) {
	getenv := env.getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	dir, err := configDir(getenv)
	if err != nil {
		return nil, err
	}
	return &credStore{path: filepath.Join(dir, credentialsName)}, nil
}

// load reads the file; a missing file is an empty one. A file that other
// users may read or write is refused: it holds refresh tokens.
func (s *credStore) load() (*credentials, error) {
	c := &credentials{Version: credentialsVer, Servers: map[string]*storedLogin{}}
	f, err := os.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open stored logins: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat stored logins: %w", err)
	}
	if runtime.GOOS != "windows" && st.Mode().Perm()&0o077 != 0 {
		return nil, cliError{
			msg:  fmt.Sprintf("%s is accessible to other users (mode %04o) and holds your login tokens, so atrium will not use it", s.path, st.Mode().Perm()),
			hint: fmt.Sprintf("run 'chmod 600 %s', or delete it and run 'atrium login' again", s.path),
		}
	}
	if err := json.NewDecoder(f).Decode(c); err != nil {
		return nil, cliError{err: err, msg: fmt.Sprintf("%s is not valid JSON: %v", s.path, err),
			hint: "delete it and run 'atrium login' again"}
	}
	if c.Version > credentialsVer {
		return nil, cliError{msg: fmt.Sprintf("%s was written by a newer atrium (version %d)", s.path, c.Version),
			hint: "upgrade atrium, or delete the file and run 'atrium login' again"}
	}
	if c.Servers == nil {
		c.Servers = map[string]*storedLogin{}
	}
	return c, nil
}

// save replaces the file atomically: a temporary file in the same
// directory (mode 0600), synced, renamed over the old one.
func (s *credStore) save(c *credentials) error {
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	c.Version = credentialsVer
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode stored logins: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".credentials-*.json")
	if err != nil {
		return fmt.Errorf("save stored logins: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if err := tmp.Chmod(0o600); err != nil && runtime.GOOS != "windows" {
		tmp.Close()
		return fmt.Errorf("save stored logins: %w", err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("save stored logins: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save stored logins: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save stored logins: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("save stored logins: %w", err)
	}
	return nil
}

// get returns the login stored for server, or nil.
func (s *credStore) get(server string) (*storedLogin, error) {
	c, err := s.load()
	if err != nil {
		return nil, err
	}
	return c.Servers[server], nil
}

// put stores l as the login for server, keeping the others.
func (s *credStore) put(server string, l *storedLogin) error {
	c, err := s.load()
	if err != nil {
		return err
	}
	c.Servers[server] = l
	return s.save(c)
}

// remove deletes the login of server and reports whether there was one.
func (s *credStore) remove(server string) (bool, error) {
	c, err := s.load()
	if err != nil {
		return false, err
	}
	if _, ok := c.Servers[server]; !ok {
		return false, nil
	}
	delete(c.Servers, server)
	return true, s.save(c)
}

// idTokenExpiry reads the exp claim of a JWT without verifying it: the
// server verifies the token; the CLI only needs to know when to refresh.
func idTokenExpiry(jwt string) (time.Time, error) {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return time.Time{}, errors.New("the ID token is not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("decode the ID token's claims: %w", err)
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(b, &claims); err != nil {
		return time.Time{}, fmt.Errorf("decode the ID token's claims: %w", err)
	}
	if claims.Exp == nil {
		return time.Time{}, errors.New("the ID token has no exp claim")
	}
	f, err := claims.Exp.Float64()
	if err != nil {
		return time.Time{}, fmt.Errorf("the ID token's exp claim: %w", err)
	}
	return time.Unix(int64(f), 0).UTC(), nil
}

// oauthConfig is the OAuth client of a stored login, for refreshing it.
func (l *storedLogin) oauthConfig() *oauth2.Config {
	style := oauth2.AuthStyleInParams
	if l.AuthStyle == authStyleHeader {
		style = oauth2.AuthStyleInHeader
	}
	return &oauth2.Config{
		ClientID:     l.ClientID,
		ClientSecret: l.ClientSecret,
		Endpoint:     oauth2.Endpoint{TokenURL: l.TokenURL, AuthStyle: style},
		Scopes:       l.Scopes,
	}
}

// setToken stores tok (from a code, device or refresh grant) in l. A
// refresh response without a refresh token keeps the old one.
func (l *storedLogin) setToken(tok *oauth2.Token) error {
	idt, _ := tok.Extra("id_token").(string)
	if idt == "" {
		return errors.New("the identity provider returned no ID token (is the openid scope granted?)")
	}
	exp, err := idTokenExpiry(idt)
	if err != nil {
		return err
	}
	l.IDToken, l.Expiry = idt, exp
	l.AccessToken, l.TokenType = tok.AccessToken, tok.TokenType
	if tok.RefreshToken != "" {
		l.RefreshToken = tok.RefreshToken
	}
	return nil
}

// loginTokens is the client.TokenSource of a stored login: it hands out the
// ID token and, when it is about to expire, refreshes it with the refresh
// token and saves the result, so long `attach` sessions and their
// reconnects keep working.
type loginTokens struct {
	store  *credStore
	server string
	now    func() time.Time

	mu    sync.Mutex
	login *storedLogin // guarded by mu
}

// Token returns a valid ID token, refreshing it first if needed.
func (t *loginTokens) Token(ctx context.Context) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if now.Add(refreshMargin).Before(t.login.Expiry) {
		return t.login.IDToken, nil
	}
	// Another atrium process may have refreshed it already.
	if fresh, err := t.store.get(t.server); err == nil && fresh != nil && now.Add(refreshMargin).Before(fresh.Expiry) {
		t.login = fresh
		return fresh.IDToken, nil
	}
	err := t.refreshLocked(ctx)
	if err == nil {
		return t.login.IDToken, nil
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if now.Before(t.login.Expiry) {
		return t.login.IDToken, nil // not expired yet; retry the refresh next time
	}
	return "", t.expired(err)
}

func (t *loginTokens) refreshLocked(ctx context.Context) error {
	if t.login.RefreshToken == "" {
		return errors.New("the identity provider gave no refresh token")
	}
	l := *t.login
	old := &oauth2.Token{AccessToken: l.AccessToken, TokenType: l.TokenType, RefreshToken: l.RefreshToken,
		Expiry: time.Unix(1, 0)} // expired: the ID token is what needs refreshing
	tok, err := l.oauthConfig().TokenSource(ctx, old).Token()
	if err != nil {
		return oauthError(err)
	}
	if err := l.setToken(tok); err != nil {
		return err
	}
	if err := t.store.put(t.server, &l); err != nil {
		return err
	}
	t.login = &l
	return nil
}

// expired is the error of a login that can no longer be used. It is an
// unauthenticated session.Error underneath, so the SDK's streams treat it
// as terminal instead of retrying.
func (t *loginTokens) expired(cause error) error {
	msg := "your login expired: run atrium login"
	if t.server != DefaultServer {
		msg += " --server " + t.server
	}
	return cliError{
		err:  &session.Error{Code: session.CodeUnauthenticated, Message: msg},
		msg:  msg,
		hint: "refreshing it failed: " + cause.Error(),
	}
}

// oauthError says what an identity provider answered, without echoing
// response bodies (which might hold tokens).
func oauthError(err error) error {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		return err
	}
	switch {
	case re.ErrorCode != "" && re.ErrorDescription != "":
		return fmt.Errorf("the identity provider answered %s: %s", re.ErrorCode, re.ErrorDescription)
	case re.ErrorCode != "":
		return fmt.Errorf("the identity provider answered %s", re.ErrorCode)
	case re.Response != nil:
		return fmt.Errorf("the identity provider answered %s", re.Response.Status)
	}
	return errors.New("the identity provider refused the request")
}
