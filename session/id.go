package session

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
)

// ID identifies a session. IDs are opaque strings that are safe in URLs, file
// names and NATS subject tokens: 1 to 64 characters from [A-Za-z0-9_-].
type ID string

// MaxIDLen is the longest valid ID.
const MaxIDLen = 64

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns a fresh random session ID such as "s_3kq7xq4m2fdh2dnbw5ad".
func NewID() ID {
	return ID("s_" + randomToken(12))
}

// NewEpoch returns a fresh random epoch. An epoch is fixed at session creation
// and changes only if history is ever rebuilt from a lossy source.
func NewEpoch() string {
	return randomToken(8)
}

func randomToken(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("session: read random: %v", err)) // crypto/rand never fails on Linux.
	}
	return idEncoding.EncodeToString(b)
}

// Validate reports whether id is well formed. It returns an error wrapping
// ErrBadRequest that names the problem.
func (id ID) Validate() error {
	if len(id) == 0 || len(id) > MaxIDLen {
		return Errorf(CodeBadRequest, "session id must be 1 to %d characters", MaxIDLen)
	}
	if !validToken(string(id)) {
		return Errorf(CodeBadRequest, "session id %q may contain only letters, digits, '_' and '-'", string(id))
	}
	return nil
}

// ValidUser reports whether user is acceptable as a user name: 1 to 128
// characters, no control characters, no whitespace at either end.
func ValidUser(user string) error {
	if user == "" || len(user) > 128 {
		return Errorf(CodeBadRequest, "user must be 1 to 128 characters")
	}
	if strings.TrimSpace(user) != user {
		return Errorf(CodeBadRequest, "user %q has surrounding whitespace", user)
	}
	for _, r := range user {
		if r < 0x20 || r == 0x7f {
			return Errorf(CodeBadRequest, "user has a control character")
		}
	}
	return nil
}

func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
