package auth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// LoginCookie is the name of the browser login cookie set by /auth/callback.
const LoginCookie = "atrium_login"

// stateCookie carries a login in progress (state, nonce, PKCE verifier) from
// /auth/login to /auth/callback.
const stateCookie = "atrium_login_state"

// maxCookieValue is the largest cookie value browsers reliably keep (4096
// bytes for name, value and attributes together).
const maxCookieValue = 3800

// sealer encrypts and authenticates cookie values with AES-256-GCM, so that
// their contents (a refresh token, say) cannot be read and any change is
// detected. The cookie's name is authenticated too, so one cookie cannot
// stand in for another.
type sealer struct {
	aead cipher.AEAD
}

func newSealer(key []byte) (*sealer, error) {
	// Derive the AES key rather than using the configured bytes directly, so
	// a key of any length at least 32 bytes gives a 256-bit AES key.
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("atrium cookie seal v1"))
	block, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("cookie cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("cookie cipher: %w", err)
	}
	return &sealer{aead: aead}, nil
}

// seal returns the cookie value carrying v: base64url(nonce || ciphertext).
func (s *sealer) seal(name string, v any) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %s cookie: %w", name, err)
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("seal %s cookie: %w", name, err)
	}
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, []byte(name))), nil
}

// errBadCookie means a cookie value was not sealed with this key: it was
// altered, made up, or sealed with a key that has since changed.
var errBadCookie = errors.New("cookie does not verify")

// open decodes a value made by seal into v.
func (s *sealer) open(name, value string, v any) error {
	raw, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(raw) < s.aead.NonceSize() {
		return errBadCookie
	}
	plain, err := s.aead.Open(nil, raw[:s.aead.NonceSize()], raw[s.aead.NonceSize():], []byte(name))
	if err != nil {
		return errBadCookie
	}
	if err := json.Unmarshal(plain, v); err != nil {
		return errBadCookie
	}
	return nil
}

// login is the content of the login cookie. Field names are short: the
// cookie travels with every request.
type login struct {
	User   string `json:"u"`
	Tenant string `json:"t,omitempty"`
	Admin  bool   `json:"a,omitempty"`
	// Operator: a member of the operator group at login.
	Operator bool   `json:"o,omitempty"`
	Subject  string `json:"s"` // the issuer's sub, which a refreshed ID token must repeat
	// Expires ends the login (login time + CookieTTL); refreshing does not
	// extend it.
	Expires int64 `json:"e"`
	// Fresh is the expiry of the ID token the identity comes from. Past it,
	// the identity is renewed with Refresh, if there is one.
	Fresh   int64  `json:"f"`
	Refresh string `json:"r,omitempty"` // the provider's refresh token
}

// pending is the content of the state cookie: a login in progress.
type pending struct {
	State    string `json:"s"`
	Nonce    string `json:"n"`
	Verifier string `json:"v"` // PKCE code verifier
	Next     string `json:"x"`
	Expires  int64  `json:"e"`
}

// cookie returns a cookie with the attributes every Atrium login cookie has.
func cookie(name, value, path string, maxAge time.Duration, secure bool) *http.Cookie {
	c := &http.Cookie{
		Name:     name,
		Value:    value,
		Path:     path,
		HttpOnly: true,
		Secure:   secure,
		SameSite: http.SameSiteLaxMode,
	}
	if maxAge > 0 {
		c.MaxAge = int((maxAge + time.Second - 1) / time.Second)
	} else {
		c.MaxAge = -1
	}
	return c
}
