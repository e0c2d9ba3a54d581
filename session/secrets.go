package session

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
)

// Limits of a session's secrets (DESIGN §6: injected into the harness
// environment of every turn, never logged, never in events).
const (
	// MaxSecretBytes bounds one secret's value.
	MaxSecretBytes = 64 << 10
	// MaxSecretsBytes bounds the values of all of a session's secrets
	// together (Linux limits a command's whole environment to a few MiB).
	MaxSecretsBytes = 256 << 10
	// MaxSecrets bounds how many secrets a session has.
	MaxSecrets = 100
	// MaxSecretNameBytes bounds a secret's name.
	MaxSecretNameBytes = 128
	// MaxEgressEntries bounds a session's own egress allowlist.
	MaxEgressEntries = 64
)

// Secret is one of a session's secrets as its node stores it, in the
// session's history metadata. Its value never leaves the node except into
// the harness environment: it formats and logs as "[redacted]".
//
// A node with a secrets keyring stores only Sealed: the value encrypted
// (SecretKeyring.Seal), so that the metadata carries ciphertext wherever it
// is written or captured (the history database, the JetStream capture,
// checkpoints). Value is the plaintext of a secret stored before secrets were
// encrypted; it is sealed at its next change.
type Secret struct {
	Sealed    string `json:"sealed,omitempty"`
	Value     string `json:"value,omitempty"`
	UpdatedAt Time   `json:"updated_at"`
	UpdatedBy string `json:"updated_by"`
}

// String hides the value from fmt.
func (Secret) String() string { return "[redacted]" }

// GoString hides the value from %#v.
func (Secret) GoString() string { return "[redacted]" }

// LogValue hides the value from log/slog.
func (Secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// SecretInfo is what the API says about a secret: never its value.
type SecretInfo struct {
	Name      string `json:"name"`
	UpdatedAt Time   `json:"updated_at"`
	UpdatedBy string `json:"updated_by"`
}

// reservedEnv are variables a secret may not replace: the harness contract's
// own and those the sandbox's environment depends on.
var reservedEnv = map[string]bool{
	"PATH": true, "HOME": true, "USER": true, "LOGNAME": true, "SHELL": true, "PWD": true, "OLDPWD": true,
	"TMPDIR": true, "TERM": true, "LANG": true, "HOSTNAME": true, "IFS": true, "ENV": true, "BASH_ENV": true,
	"LD_PRELOAD": true, "LD_LIBRARY_PATH": true, "LD_AUDIT": true,
	"HTTP_PROXY": true, "HTTPS_PROXY": true, "NO_PROXY": true, "ALL_PROXY": true,
	"http_proxy": true, "https_proxy": true, "no_proxy": true, "all_proxy": true,
}

// ValidSecretName checks that name can be a secret: an environment variable
// name (a letter or underscore, then letters, digits or underscores) that
// does not start with ATRIUM_ and is not one the sandbox relies on (PATH,
// HOME, the proxy variables…). Its error is bad_request.
func ValidSecretName(name string) error {
	switch {
	case name == "":
		return Errorf(CodeBadRequest, "a secret needs a name")
	case len(name) > MaxSecretNameBytes:
		return Errorf(CodeBadRequest, "secret name is longer than %d bytes", MaxSecretNameBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return Errorf(CodeBadRequest, "secret name %q is not an environment variable name: use letters, digits and _, not starting with a digit (e.g. GITHUB_TOKEN)", name)
		}
	}
	switch {
	case strings.HasPrefix(strings.ToUpper(name), "ATRIUM_"):
		return Errorf(CodeBadRequest, "secret name %q is reserved: names starting with ATRIUM_ belong to the harness contract", name)
	case reservedEnv[name]:
		return Errorf(CodeBadRequest, "secret name %q is reserved: the sandbox sets it", name)
	}
	return nil
}

// SecretKeyring encrypts secrets at rest: AES-256-GCM keys by id, one of
// them current. Seal uses the current key; Open any key of the ring, so that
// keys can be rotated: add a new key as the current one, keep the old ones
// until every secret was set again, then drop them.
type SecretKeyring struct {
	current string
	aeads   map[string]cipher.AEAD
}

// MaxSecretKeyIDBytes bounds a key id of a SecretKeyring.
const MaxSecretKeyIDBytes = 32

// ParseSecretKeyring reads a keyring: one key a line, "<id>:<base64 of 32
// random bytes>"; the first is the current key, the others only decrypt.
// Blank lines and lines starting with # are ignored. An id is letters,
// digits, '-' and '_'. Errors name the line, never a key.
func ParseSecretKeyring(text string) (*SecretKeyring, error) {
	k := &SecretKeyring{aeads: map[string]cipher.AEAD{}}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, b64, ok := strings.Cut(line, ":")
		if !ok || !validKeyID(id) {
			return nil, fmt.Errorf("secrets keyring line %d: want <id>:<base64 key>, the id of letters, digits, - and _ (at most %d bytes)", i+1, MaxSecretKeyIDBytes)
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("secrets keyring line %d (key %s): the key must be 32 bytes, base64-encoded (openssl rand -base64 32)", i+1, id)
		}
		if _, dup := k.aeads[id]; dup {
			return nil, fmt.Errorf("secrets keyring line %d: key id %s appears twice", i+1, id)
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("secrets keyring line %d: %w", i+1, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("secrets keyring line %d: %w", i+1, err)
		}
		k.aeads[id] = aead
		if k.current == "" {
			k.current = id
		}
	}
	if k.current == "" {
		return nil, fmt.Errorf("secrets keyring has no key: want lines <id>:<base64 of 32 random bytes>")
	}
	return k, nil
}

// NewSecretKeyLine returns a fresh keyring line with key id id.
func NewSecretKeyLine(id string) string {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand never fails on Linux.
	return id + ":" + base64.StdEncoding.EncodeToString(key)
}

func validKeyID(id string) bool {
	if id == "" || len(id) > MaxSecretKeyIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// Current returns the id of the key Seal uses.
func (k *SecretKeyring) Current() string { return k.current }

// Seal encrypts the value of secret name with the current key:
// "<key id>:<base64 of nonce and ciphertext>". The name is authenticated
// too: a sealed value moved to another name does not open.
func (k *SecretKeyring) Seal(name, value string) string {
	aead := k.aeads[k.current]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(value)+aead.Overhead())
	_, _ = rand.Read(nonce)
	return k.current + ":" + base64.StdEncoding.EncodeToString(aead.Seal(nonce, nonce, []byte(value), []byte(name)))
}

// Open returns the value of secret name: Value if it was stored in clear,
// else Sealed decrypted with its key. k may be nil for secrets in clear.
func (k *SecretKeyring) Open(name string, s Secret) (string, error) {
	if s.Sealed == "" {
		return s.Value, nil
	}
	id, b64, _ := strings.Cut(s.Sealed, ":")
	if k == nil {
		return "", Errorf(CodeUnavailable, "secret %s is encrypted (key %s) and this node has no secrets keyring", name, id)
	}
	aead, ok := k.aeads[id]
	if !ok {
		return "", Errorf(CodeUnavailable, "secret %s is encrypted with key %s, which this node's secrets keyring does not have", name, id)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) < aead.NonceSize() {
		return "", Errorf(CodeInternal, "secret %s: its sealed value is malformed", name)
	}
	plain, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], []byte(name))
	if err != nil {
		return "", Errorf(CodeInternal, "secret %s does not decrypt with key %s (altered, or another key of that id)", name, id)
	}
	return string(plain), nil
}
