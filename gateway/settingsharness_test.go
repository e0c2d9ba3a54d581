package gateway_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestPatchSession_HarnessReadBack: settings.harness is shown back to the
// owner under "settings" like every other setting (a command with its stdin
// form, or a template other than the default), and to no other member; back
// to the default template, the session has no settings of its own again.
func TestPatchSession_HarnessReadBack(t *testing.T) {
	ns := startNATS(t)
	startAgentNode(t, ns)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	code, b := e.call("POST", "/v1/sessions", "alice", map[string]any{"title": "harness"})
	var s session.Session
	if code != http.StatusCreated || json.Unmarshal(b, &s) != nil {
		t.Fatalf("create: %d %s", code, b)
	}
	path := "/v1/sessions/" + string(s.ID)
	e.member(s.ID, "alice", "carol", session.RoleViewer)

	code, b = e.call("PATCH", path, "alice", `{"settings":{"harness":{"command":["bash","-c","cat"],"stdin":"text"}}}`)
	var got session.Session
	if code != http.StatusOK || json.Unmarshal(b, &got) != nil || got.Settings == nil || got.Settings.Harness == nil ||
		!slices.Equal(got.Settings.Harness.Command, []string{"bash", "-c", "cat"}) || got.Settings.Harness.Stdin != session.HarnessStdinText {
		t.Fatalf("patch harness: %d %s", code, b)
	}
	if code, b := e.call("GET", path, "alice", nil); code != http.StatusOK ||
		!strings.Contains(string(b), `"settings":{"harness":{"command":["bash","-c","cat"],"stdin":"text"}}`) {
		t.Errorf("get as the owner: %d %s", code, b)
	}
	if code, b := e.call("GET", path, "carol", nil); code != http.StatusOK || strings.Contains(string(b), `"settings"`) {
		t.Errorf("get as a viewer: %d %s, want no harness (no settings)", code, b)
	}
	code, b = e.call("PATCH", path, "alice", `{"settings":{"harness":"shell"}}`)
	if code != http.StatusOK || strings.Contains(string(b), `"settings"`) {
		t.Errorf("back to the default template: %d %s, want no settings of its own", code, b)
	}
}
