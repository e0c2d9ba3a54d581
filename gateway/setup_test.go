package gateway_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestSettings_Setup is AgentTier's configure flow: upload a requirements
// file, set a setup command, and invoke many times. The setup runs once
// before the first turn (its output as output events of stream "setup"),
// not again while nothing was written, again after a file upload, and a
// failing setup fails the turn with the reason until it is fixed.
func TestSettings_Setup(t *testing.T) {
	e := newFilesEnv(t, nil)
	s := e.create("alice", "setup")
	path := "/v1/sessions/" + string(s.ID)
	patch := func(setup string) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"settings": map[string]any{"setup": setup}})
		if code, body := e.call("PATCH", path, "alice", string(b)); code != http.StatusOK {
			t.Fatalf("PATCH setup: %d %s", code, body)
		}
	}
	if code, body := e.put(s.ID, "alice", "requirements.txt", []byte("numpy\n")); code != http.StatusNoContent {
		t.Fatalf("put: %d %s", code, body)
	}
	patch("echo installing; cat requirements.txt >> installed.txt")

	finished := func(turn int64) session.TurnFinishedData {
		t.Helper()
		for _, ev := range e.events(s.ID, "alice") {
			var d session.TurnFinishedData
			if ev.Kind == session.KindTurnFinished && json.Unmarshal(ev.Data, &d) == nil && d.Turn == turn {
				return d
			}
		}
		t.Fatalf("no turn_finished of turn %d", turn)
		return session.TurnFinishedData{}
	}
	setupOutput := func(turn int64) string {
		var b strings.Builder
		for _, ev := range e.events(s.ID, "alice") {
			var d session.OutputData
			if ev.Kind == session.KindOutput && json.Unmarshal(ev.Data, &d) == nil && d.Turn == turn && d.Stream == "setup" {
				b.WriteString(d.Text)
			}
		}
		return b.String()
	}

	turn, out := e.prompt(s.ID, "alice", "cat installed.txt")
	if out != "numpy\n" || setupOutput(turn) != "installing\n" {
		t.Fatalf("turn %d: stdout %q, setup output %q", turn, out, setupOutput(turn))
	}
	turn, out = e.prompt(s.ID, "alice", "cat installed.txt")
	if out != "numpy\n" || setupOutput(turn) != "" {
		t.Fatalf("turn %d without new files ran the setup again: stdout %q, setup output %q", turn, out, setupOutput(turn))
	}
	if code, body := e.put(s.ID, "alice", "requirements.txt", []byte("pandas\n")); code != http.StatusNoContent {
		t.Fatalf("put: %d %s", code, body)
	}
	turn, out = e.prompt(s.ID, "alice", "cat installed.txt")
	if out != "numpy\npandas\n" || setupOutput(turn) != "installing\n" {
		t.Fatalf("turn %d after an upload: stdout %q, setup output %q", turn, out, setupOutput(turn))
	}

	patch("echo no such package >&2; exit 3")
	turn, out = e.prompt(s.ID, "alice", "echo ran")
	if d := finished(turn); d.Status != session.TurnFailed || out != "" {
		t.Fatalf("turn %d with a failing setup: %+v, stdout %q", turn, d, out)
	}
	var reason string
	for _, ev := range e.events(s.ID, "alice") {
		var d session.ErrorData
		if ev.Kind == session.KindError && json.Unmarshal(ev.Data, &d) == nil && strings.Contains(d.Message, "settings.setup") {
			reason = d.Message
		}
	}
	if !strings.Contains(reason, "status 3") || !strings.Contains(reason, "no such package") {
		t.Errorf("the failed setup's error event %q: want its exit code and output", reason)
	}
	turn, _ = e.prompt(s.ID, "alice", "echo ran")
	if d := finished(turn); d.Status != session.TurnFailed {
		t.Errorf("turn %d: a setup that failed must run again and fail: %+v", turn, d)
	}
	patch("")
	if turn, out = e.prompt(s.ID, "alice", "echo ran"); out != "ran\n" || finished(turn).Status != session.TurnOK {
		t.Fatalf("turn %d without setup: stdout %q", turn, out)
	}
}
