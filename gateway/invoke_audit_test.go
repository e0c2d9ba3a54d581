package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// TestInvoke_Audited: each invoke is one audit entry, written when it ends,
// with its turn's status (failed for a turn that failed, and for a stream
// that ended before its turn).
func TestInvoke_Audited(t *testing.T) {
	ns := startNATS(t)
	startNode(t, ns, time.Minute)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns, func(c *gateway.Config) { c.Auth = auth.Chain(identities{}, &auth.Dev{}) })
	code, body := e.call("POST", "/v1/sessions", "alice", map[string]any{"title": "audited invokes"})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var s session.Session
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	ada := admin("ada", "")
	find := func(id string) audit.Entry {
		t.Helper()
		return e.findAudit(ada, "action="+gateway.ActInvoke+"&actor=alice", func(en audit.Entry) bool { return en.Target == id })
	}

	ok := mustInvoke(t, e.srv.URL, s.ID, "alice", "echo hi")
	ok.untilExit()
	if en := find(ok.id); en.Outcome != audit.OK || en.Session != string(s.ID) || !strings.Contains(en.Detail, "turn 1 ok") ||
		strings.Contains(en.Detail, "echo hi") {
		t.Errorf("entry of an ok invoke %+v", en)
	}

	failed := mustInvoke(t, e.srv.URL, s.ID, "alice", "exit 3")
	failed.untilExit()
	if en := find(failed.id); en.Outcome != audit.Failed || !strings.Contains(en.Detail, "turn 2 failed") {
		t.Errorf("entry of a failed invoke %+v", en)
	}

	left := mustInvoke(t, e.srv.URL, s.ID, "alice", "sleep 30")
	if ev := left.next(); ev.name != "start" {
		t.Fatalf("first event %s", ev.name)
	}
	left.close()
	if en := find(left.id); en.Outcome != audit.Failed || !strings.Contains(en.Detail, "the stream ended before the turn did") {
		t.Errorf("entry of an invoke left early %+v", en)
	}
}
