package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
)

// TestInvoke_SessionCap: a session's own settings.invoke_concurrency, within
// the gateway's quotas.invokes_per_session (403 beyond it, naming it), caps
// its invokes running at once on a real node: a second invoke while the
// first runs is refused with 429 naming the session's cap.
func TestInvoke_SessionCap(t *testing.T) {
	ns := startNATS(t)
	startNode(t, ns, time.Minute)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns, func(c *gateway.Config) {
		c.Quotas = gateway.Quotas{InvokesPerSession: 3, RetryAfter: 5 * time.Second}
	})
	s := e.create("alice", "capped")
	path := "/v1/sessions/" + string(s.ID)
	if code, body := e.call("PATCH", path, "alice", `{"settings":{"invoke_concurrency":5}}`); code != http.StatusForbidden ||
		!strings.Contains(string(body), "beyond this server's limit of 3 (quotas.invokes_per_session)") {
		t.Fatalf("beyond the gateway's cap: %d %s", code, body)
	}
	code, body := e.call("PATCH", path, "alice", `{"settings":{"invoke_concurrency":1}}`)
	var got session.Session
	if code != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Settings == nil || got.Settings.InvokeConcurrency != 1 {
		t.Fatalf("patch: %d %s", code, body)
	}
	first := mustInvoke(t, e.srv.URL, s.ID, "alice", "sleep 30")
	_, code, body, hdr := startInvoke(t, e.srv.URL, s.ID, "alice", "echo second")
	refused(t, code, body, hdr, "invokes", "session", 1)
	first.close()
}
