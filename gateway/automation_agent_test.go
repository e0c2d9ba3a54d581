package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/gateway/schedule"
	"github.com/atriumhq/atrium/session"
)

// TestAutomation_AgentSession: a schedule drives an agent session like any
// other (its run ends ok with the agent's turn); under a retry policy an
// agent's failed turn (the scripted agent crashes) is tried again in the
// same session until the policy's attempts run out, then it is a dead letter
// that is not permanent; each run is one audit entry.
func TestAutomation_AgentSession(t *testing.T) {
	ns := startNATS(t)
	startAgentNode(t, ns)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns, func(c *gateway.Config) { c.Auth = auth.Chain(identities{}, &auth.Dev{}) }, fastRetries)
	ann, ada := as("ann", "acme"), admin("ada", "acme")
	var s session.Session
	e.must(http.StatusCreated, "POST", "/v1/sessions", ann, map[string]any{"title": "scheduled agent", "agent": "fake"}, &s)

	var ok schedule.Schedule
	e.must(http.StatusCreated, "POST", "/v1/schedules", ann, map[string]any{"cron": "@daily", "session": s.ID, "prompt": "tool"}, &ok)
	e.must(http.StatusAccepted, "POST", "/v1/schedules/"+ok.ID+"/run", ann, nil, nil)
	if run := e.lastRun(ann, ok.ID); run.Status != "ok" || run.Turn != 1 || run.Attempts != 1 {
		t.Fatalf("run of an agent session %+v, want ok, turn 1, one attempt", run)
	}

	var flaky schedule.Schedule
	e.must(http.StatusCreated, "POST", "/v1/schedules", ann, map[string]any{"cron": "@daily", "session": s.ID, "prompt": "crash",
		"retry": map[string]any{"attempts": 2, "backoff": "10ms"}}, &flaky)
	e.must(http.StatusAccepted, "POST", "/v1/schedules/"+flaky.ID+"/run", ann, nil, nil)
	run := e.lastRun(ann, flaky.ID)
	if run.Status != schedule.StatusDeadLetter || run.Attempts != 2 || run.Turn != 3 || !strings.Contains(run.Error, "ended failed") {
		t.Fatalf("run %+v, want a dead letter after 2 attempts (turns 2 and 3 failed)", run)
	}
	var dls []struct {
		ID        string
		Permanent bool
		Attempts  int
	}
	code, body := e.req("GET", "/v1/dlq", ann, nil)
	var page struct {
		DeadLetters json.RawMessage `json:"dead_letters"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &page) != nil || json.Unmarshal(page.DeadLetters, &dls) != nil ||
		len(dls) != 1 || dls[0].ID != run.DeadLetter || dls[0].Permanent || dls[0].Attempts != 2 {
		t.Fatalf("dead letters %d %s, want one not permanent after 2 attempts", code, body)
	}
	var finished int
	e.findAudit(ada, "action="+schedule.ActRun+"&actor=ann", func(en audit.Entry) bool { return en.Target == flaky.ID })
	for _, en := range e.auditOf(ada, "action="+schedule.ActRun+"&actor=ann") {
		if en.Via != "schedule" || en.Session != string(s.ID) {
			t.Errorf("audit entry %+v", en)
		}
		switch en.Target {
		case ok.ID:
			finished++
			if en.Outcome != audit.OK || !strings.Contains(en.Detail, "ok after 1 attempt(s), turn 1") {
				t.Errorf("ok run's entry %+v", en)
			}
		case flaky.ID:
			finished++
			if en.Outcome != audit.Failed || !strings.Contains(en.Detail, "dead_letter after 2 attempt(s)") || !strings.Contains(en.Detail, run.DeadLetter) {
				t.Errorf("failed run's entry %+v", en)
			}
		}
	}
	if finished != 2 {
		t.Errorf("%d run entries, want one per run", finished)
	}
}
