package server_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestServer_SandboxKind: the Session object's sandbox says what runs it
// ("kind":"local" on a node with local sandboxes) once it has one, from the
// owner while active and from the catalog (GET /v1/sessions, and GET of a
// hibernated session); a session that never had a sandbox shows
// {"state":"none"} as before.
func TestServer_SandboxKind(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *server.Config) { c.HibernateAfter = 300 * time.Millisecond })
	alice := s.as("alice")
	sess := alice.create("kind", nil)
	sandboxOf := func(method, path string) json.RawMessage {
		t.Helper()
		code, body := alice.request(method, path, nil)
		if code != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, code, body)
		}
		var got struct {
			Sandbox  json.RawMessage
			Sessions []struct{ Sandbox json.RawMessage }
		}
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		if got.Sessions != nil {
			return got.Sessions[0].Sandbox
		}
		return got.Sandbox
	}
	path := "/v1/sessions/" + string(sess.ID)
	if got := string(sandboxOf("GET", path)); got != `{"state":"none"}` {
		t.Fatalf("before any turn: sandbox %s, want {\"state\":\"none\"}", got)
	}
	alice.prompt(sess.ID, "echo hi")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn 1 %+v, want ok", fin)
	}
	check := func(when string, sb json.RawMessage) {
		t.Helper()
		var info session.SandboxInfo
		if err := json.Unmarshal(sb, &info); err != nil || info.Kind != session.SandboxKindLocal || info.State == session.SandboxNone {
			t.Errorf("%s: sandbox %s, want kind local and a state", when, sb)
		}
	}
	check("active", sandboxOf("GET", path))
	check("listed", sandboxOf("GET", "/v1/sessions"))
	deadline := time.Now().Add(waitLong)
	for alice.get(sess.ID).State != session.StateHibernated {
		if time.Now().After(deadline) {
			t.Fatal("the session did not hibernate")
		}
		time.Sleep(500 * time.Millisecond) // Slower than HibernateAfter: reads restart the idle timer.
	}
	check("hibernated", sandboxOf("GET", path))
}
