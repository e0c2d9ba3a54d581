package server

import (
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
)

// sandboxKind says what runs the sandboxes of sb, as Session objects show
// it: bubblewrap on this host, VMs on atrium vmhosts, or machines of the
// operator's hook.
func sandboxKind(sb Sandbox) string {
	switch sb.Provider {
	case ProviderLocal, "":
		return session.SandboxKindLocal
	case ProviderRemote:
		if _, ok := sb.Hook.(*remote.VMHosts); ok {
			return session.SandboxKindVM
		}
		return session.SandboxKindRemote
	}
	return ""
}
