package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestE2E_Secrets: owners set, list and delete secrets over REST; the
// harness sees them; values never come back in a response or an event.
func TestE2E_Secrets(t *testing.T) {
	e := newE2E(t, 0)
	const value = "gw-s3cr3t-9a8b7c"
	// The harness compares a digest: the owner sees the command back, and
	// the value must not be in it for the checks below to mean anything.
	sum := sha256.Sum256([]byte(value))
	code, body := e.call("POST", "/v1/sessions", "alice", `{"harness":{"command":["bash","-c","read -r _; [ \"$(printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1)\" = `+hex.EncodeToString(sum[:])+` ] && echo token-ok || echo token-missing"]}}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var s session.Session
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	path := "/v1/sessions/" + string(s.ID)
	e.member(s.ID, "alice", "bob", session.RoleDriver)

	if code, body := e.call("PUT", path+"/secrets/TOKEN", "bob", `{"value":"x"}`); code != http.StatusForbidden {
		t.Errorf("driver sets: %d %s", code, body)
	}
	if code, body := e.call("GET", path+"/secrets", "bob", nil); code != http.StatusForbidden {
		t.Errorf("driver lists: %d %s", code, body)
	}
	if code, body := e.call("PUT", path+"/secrets/ATRIUM_X", "alice", `{"value":"x"}`); code != http.StatusBadRequest || errCode(t, body) != session.CodeBadRequest {
		t.Errorf("reserved name: %d %s", code, body)
	}
	if code, body := e.call("PUT", path+"/secrets/TOKEN", "alice", `{}`); code != http.StatusBadRequest {
		t.Errorf("no value: %d %s", code, body)
	}
	if code, body := e.call("GET", path+"/secrets", "alice", nil); code != 200 || string(body) != "{\"secrets\":[]}\n" {
		t.Errorf("empty list: %d %q", code, body)
	}
	if code, body := e.call("PUT", path+"/secrets/TOKEN", "alice", `{"value":"`+value+`"}`); code != http.StatusNoContent {
		t.Fatalf("set: %d %s", code, body)
	}
	code, body = e.call("GET", path+"/secrets", "alice", nil)
	if code != 200 || !strings.Contains(string(body), `"name":"TOKEN"`) || !strings.Contains(string(body), `"updated_by":"alice"`) || strings.Contains(string(body), value) {
		t.Errorf("list: %d %s", code, body)
	}
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	if code, body := e.call("POST", path+"/messages", "bob", `{"text":"go"}`); code != http.StatusAccepted {
		t.Fatalf("prompt: %d %s", code, body)
	}
	evs := untilTurnEnds(t, c)
	all := ""
	for _, ev := range evs {
		all += string(ev)
	}
	if !strings.Contains(all, "token-ok") {
		t.Errorf("the harness did not see the secret: %s", all)
	}
	for _, p := range []string{path, path + "/events", "/v1/sessions", path + "/secrets"} {
		if _, body := e.call("GET", p, "alice", nil); strings.Contains(string(body), value) {
			t.Errorf("GET %s shows the value: %s", p, body)
		}
	}
	if code, body := e.call("DELETE", path+"/secrets/TOKEN", "alice", nil); code != http.StatusNoContent {
		t.Errorf("delete: %d %s", code, body)
	}
	if code, body := e.call("DELETE", path+"/secrets/TOKEN", "alice", nil); code != http.StatusNotFound {
		t.Errorf("delete again: %d %s", code, body)
	}
	// Egress: this node permits nothing, so any entry is refused with the reason.
	code, body = e.call("POST", "/v1/sessions", "alice", `{"egress":["github.com"]}`)
	if code != http.StatusForbidden || !strings.Contains(string(body), "egress to github.com is not permitted on this server (sandbox.egress_permit)") {
		t.Errorf("create with egress: %d %s", code, body)
	}
	if code, body := e.call("PUT", path+"/egress", "alice", `{"allow":["github.com"]}`); code != http.StatusForbidden || !strings.Contains(string(body), "sandbox.egress_permit") {
		t.Errorf("put egress: %d %s", code, body)
	}
	if code, body := e.call("PUT", path+"/egress", "bob", `{"allow":[]}`); code != http.StatusForbidden {
		t.Errorf("driver puts egress: %d %s", code, body)
	}
	if code, body := e.call("PUT", path+"/egress", "alice", `{"allow":[]}`); code != http.StatusOK || !strings.Contains(string(body), `"id":"`+string(s.ID)) {
		t.Errorf("clear egress: %d %s", code, body)
	}
}
