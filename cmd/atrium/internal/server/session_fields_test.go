package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestServer_SessionExtensions: the Session object tells owners who the
// members are and everyone when the session was last active, from the
// owner while it is active and from the catalog once it hibernates.
func TestServer_SessionExtensions(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *server.Config) { c.HibernateAfter = 200 * time.Millisecond })
	alice, bob := s.as("alice"), s.as("bob")
	sess := alice.create("extensions", nil)
	alice.setRole(sess.ID, "bob", session.RoleViewer)
	before := time.Now().Add(-time.Second)
	alice.prompt(sess.ID, "echo hi")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn 1 %+v, want ok", fin)
	}
	check := func(when string) {
		t.Helper()
		got := alice.get(sess.ID)
		if got.LastActivity == nil || got.LastActivity.Before(before) {
			t.Fatalf("%s: owner sees last_activity %v, want a time after the prompt", when, got.LastActivity)
		}
		if got.Members["bob"] != session.RoleViewer {
			t.Fatalf("%s: owner sees members %v, want bob as viewer", when, got.Members)
		}
		v := bob.get(sess.ID)
		if v.Members != nil || v.LastActivity == nil || v.Role != session.RoleViewer {
			t.Fatalf("%s: viewer sees members %v, last_activity %v, role %q; want no members", when, v.Members, v.LastActivity, v.Role)
		}
		var list struct{ Sessions []session.Session }
		bob.must(http.StatusOK, "GET", "/v1/sessions", nil, &list)
		if len(list.Sessions) != 1 || list.Sessions[0].Members != nil || list.Sessions[0].LastActivity == nil {
			t.Fatalf("%s: viewer's listing %+v", when, list.Sessions)
		}
	}
	check("after the turn")
	deadline := time.Now().Add(waitLong)
	for alice.get(sess.ID).State != session.StateHibernated {
		if time.Now().After(deadline) {
			t.Fatal("the session did not hibernate")
		}
		time.Sleep(400 * time.Millisecond) // Slower than HibernateAfter: reads restart the idle timer.
	}
	check("hibernated")
}
