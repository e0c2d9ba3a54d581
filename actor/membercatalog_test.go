package actor

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestHost_MemberReplyAfterCatalog: gateways authorize from the catalog, so
// a role change is answered only once the catalog entry carries it: read
// right after the reply, with no waiting, the bucket has the new role (a
// gateway that refreshes its cache from the bucket after the reply judges
// the next request by it). Repeated, as the write used to race the reply.
func TestHost_MemberReplyAfterCatalog(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	for i, role := range []session.Role{session.RoleDriver, session.RoleViewer, session.RoleDriver, session.RoleNone,
		session.RoleOwner, session.RoleViewer, session.RoleDriver, session.RoleNone} {
		if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: role}); rep.Error != nil {
			t.Fatalf("change %d: %v", i, rep.Error)
		}
		c, ok := e.catalog(id)
		if !ok {
			t.Fatalf("change %d: no catalog entry", i)
		}
		got, in := c.Members["bob"]
		if role == session.RoleNone && in || role != session.RoleNone && got != role {
			t.Fatalf("change %d to %q: the catalog, read right after the reply, has bob as %q", i, role, got)
		}
	}
}
