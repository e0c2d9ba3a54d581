package session

import (
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
type Secret struct {
	Value     string `json:"value"`
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
