package browser

import (
	"net/http"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestBrowser_Members: the owner manages members from the page — a
// member's role changed with its menu and a member removed — and the
// member's own open page follows: bob, a driver, loses the prompt box when
// made a viewer, and is told he has no access once removed.
func TestBrowser_Members(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "Members", "shell")
	st.api("alice", http.StatusOK, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "driver"}, nil)
	bob := st.open("bob")
	bob.openSession(s.ID)
	bob.waitJS("bob's prompt box", `!document.querySelector('#prompt').closest('[hidden]')`)

	alice := st.open("alice")
	alice.openSession(s.ID)
	alice.click("#share-open")
	alice.waitJS("bob as a driver", `document.querySelector('#members li[data-user="bob"] select')?.value === 'driver'`)
	eval[bool](alice, `(() => { const s = document.querySelector('#members li[data-user="bob"] select'); s.value = 'viewer'; s.dispatchEvent(new Event('change')); return true; })()`)
	alice.waitRow("the role change", ".k-member_changed", "made bob a viewer")
	var info session.Session
	st.api("alice", http.StatusOK, "GET", "/v1/sessions/"+string(s.ID), nil, &info)
	if info.Members["bob"] != session.RoleViewer {
		t.Fatalf("bob's role on the server %q, want viewer", info.Members["bob"])
	}
	bob.waitJS("bob's page as a viewer", `!!document.querySelector('#prompt').closest('[hidden]') && !document.querySelector('#viewer-note').hidden`)

	alice.click(`#members li[data-user="bob"] button.danger`)
	alice.waitJS("bob gone from the list", `!document.querySelector('#members li[data-user="bob"]')`)
	st.api("bob", http.StatusNotFound, "GET", "/v1/sessions/"+string(s.ID), nil, nil)
	bob.waitJS("bob's page without access", `/access to this session was removed/.test(document.body.textContent)`)
}
