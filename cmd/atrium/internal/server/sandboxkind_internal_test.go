package server

import (
	"testing"

	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
)

func TestSandboxKind(t *testing.T) {
	for name, c := range map[string]struct {
		sb   Sandbox
		want string
	}{
		"local":        {Sandbox{Provider: ProviderLocal}, session.SandboxKindLocal},
		"vm hosts":     {Sandbox{Provider: ProviderRemote, Hook: &remote.VMHosts{}}, session.SandboxKindVM},
		"http hook":    {Sandbox{Provider: ProviderRemote, Hook: &remote.HTTPHook{URL: "http://127.0.0.1:1"}}, session.SandboxKindRemote},
		"command hook": {Sandbox{Provider: ProviderRemote, Hook: &remote.CommandHook{}}, session.SandboxKindRemote},
		"unknown":      {Sandbox{Provider: "moon"}, ""},
	} {
		if got := sandboxKind(c.sb); got != c.want {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}
}
