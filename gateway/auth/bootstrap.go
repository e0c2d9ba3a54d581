package auth

import (
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// The bootstrap key lets whoever can read the server's data directory create
// the first API tokens of a server that accepts nothing else (auth.mode
// tokens): `atrium token create --bootstrap` on the server's machine reads the
// key and sends it as "Authorization: Bearer atrboot_<key>_<user>[_<tenant>]".
const (
	// BootstrapKeyFile is the key's file in the data directory, mode 0600.
	BootstrapKeyFile = "bootstrap.key"
	// BootstrapPrefix starts a bootstrap bearer.
	BootstrapPrefix = "atrboot_"
	// ViaBootstrap is Principal.Via of a bootstrap credential.
	ViaBootstrap      = "bootstrap"
	bootstrapKeyBytes = 32 // 256 bits
)

// EnsureBootstrapKey returns the bootstrap key of the data directory dir,
// creating it (256 random bits, mode 0600) when there is none. A key file
// that others than its owner may read is refused: it is the install's root
// credential.
func EnsureBootstrapKey(dir string) (string, error) {
	k, err := ReadBootstrapKey(dir)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("bootstrap key: %w", err)
	}
	k = tokenRandom(bootstrapKeyBytes)
	path := filepath.Join(dir, BootstrapKeyFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return ReadBootstrapKey(dir) // another process made it first
	}
	if err != nil {
		return "", fmt.Errorf("bootstrap key: %w", err)
	}
	_, err = f.WriteString(k + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return "", fmt.Errorf("write bootstrap key %s: %w", path, err)
	}
	return k, nil
}

// ReadBootstrapKey reads the bootstrap key of the data directory dir. The
// error matches fs.ErrNotExist when there is none.
func ReadBootstrapKey(dir string) (string, error) {
	path := filepath.Join(dir, BootstrapKeyFile)
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("bootstrap key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("bootstrap key %s is readable by others (mode %v): run chmod 600 %s", path, st.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("bootstrap key: %w", err)
	}
	k := strings.TrimSpace(string(b))
	if len(k) != tokenEncoding.EncodedLen(bootstrapKeyBytes) || !tokenChars(k) {
		return "", fmt.Errorf("bootstrap key %s is malformed: delete it and restart the server to make a new one", path)
	}
	return k, nil
}

// BootstrapToken is the bearer that acts, with key, as user of tenant (empty:
// the default tenant) to create an API token.
func BootstrapToken(key, user, tenant string) string {
	t := BootstrapPrefix + key + "_" + base64.RawURLEncoding.EncodeToString([]byte(user))
	if tenant != "" {
		t += "_" + base64.RawURLEncoding.EncodeToString([]byte(tenant))
	}
	return t
}

// Bootstrap authenticates bootstrap bearers (BootstrapToken) made with Key.
// A bootstrap principal is the user it names, an admin of its tenant and an
// operator, and it may only create API tokens (POST /v1/tokens): it is how an
// operator with access to the server's data directory gets the first token.
type Bootstrap struct {
	Key string
}

var _ Authenticator = (*Bootstrap)(nil)

var errBootstrapInvalid = session.Errorf(session.CodeUnauthenticated,
	"invalid bootstrap key: run `atrium token create --bootstrap` on the server's machine, with --data its data directory")

// Authenticate implements Authenticator.
func (b *Bootstrap) Authenticate(r *http.Request) (session.Principal, error) {
	tok, ok := bearer(r)
	if !ok || !strings.HasPrefix(tok, BootstrapPrefix) {
		return session.Principal{}, ErrNoCredentials
	}
	parts := strings.Split(strings.TrimPrefix(tok, BootstrapPrefix), "_")
	if b.Key == "" || len(parts) < 2 || len(parts) > 3 ||
		subtle.ConstantTimeCompare([]byte(parts[0]), []byte(b.Key)) != 1 {
		return session.Principal{}, errBootstrapInvalid
	}
	user, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || session.ValidUser(string(user)) != nil {
		return session.Principal{}, session.Errorf(session.CodeUnauthenticated, "bootstrap credential names no valid user")
	}
	var tenant []byte
	if len(parts) == 3 {
		if tenant, err = base64.RawURLEncoding.DecodeString(parts[2]); err != nil {
			return session.Principal{}, session.Errorf(session.CodeUnauthenticated, "bootstrap credential names no valid tenant")
		}
	}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/tokens" {
		return session.Principal{}, session.Errorf(session.CodeUnauthenticated,
			"the bootstrap key only creates API tokens: use the token `atrium token create --bootstrap` printed")
	}
	return session.Principal{User: string(user), Tenant: string(tenant), Admin: true, Operator: true, Via: ViaBootstrap}, nil
}
