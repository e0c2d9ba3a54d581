package config

import (
	"strings"
	"testing"
)

func TestParse_SuggestsNearestKey(t *testing.T) {
	for name, c := range map[string]struct{ yaml, want string }{
		"nested": {"node:\n  hibernate_afer: 1m\n", "line 2: unknown key hibernate_afer in node: did you mean hibernate_after?"},
		"top":    {"listn: 127.0.0.1:1\n", "unknown key listn at the top level: did you mean listen?"},
		"deeper": {"auth:\n  oidc:\n    isuer: https://x\n", "unknown key isuer in auth.oidc: did you mean issuer?"},
		"far":    {"node:\n  zzzzzzzzzzzz: 1\n", "unknown key zzzzzzzzzzzz in node (see docs/configuration.md)"},
	} {
		t.Run(name, func(t *testing.T) {
			err := Parse([]byte(c.yaml), &File{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}
