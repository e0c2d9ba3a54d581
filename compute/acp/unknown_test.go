package acp

import (
	"fmt"
	"strings"
	"testing"
)

// TestClient_UnknownUpdateKind: updates of a kind the client does not know
// are ignored and said once a turn per kind (an error event, bounded), and
// the prompt goes on; the kinds known to carry nothing for Atrium's log say
// nothing.
func TestClient_UnknownUpdateKind(t *testing.T) {
	s := newScript(t, Config{})
	s.open(false)
	rec := newRecorder()
	ch, r := s.prompt(1, "x", rec)
	for range 3 {
		s.update(map[string]any{"sessionUpdate": "hologram_update", "content": map[string]any{"type": "text", "text": "secret"}})
	}
	s.update(map[string]any{"sessionUpdate": "available_commands_update", "availableCommands": []any{}})
	s.update(map[string]any{"sessionUpdate": strings.Repeat("k", 500)})
	s.update(chunk("agent_message_chunk", "still here"))
	s.answer(r, map[string]any{"stopReason": "end_turn"})
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	if k := rec.kinds(); fmt.Sprint(k) != "[agent_message]" {
		t.Errorf("events = %v, want the message alone", k)
	}
	if len(rec.problems) != 2 || !strings.Contains(rec.problems[0], `"hologram_update"`) {
		t.Fatalf("problems = %q, want one for each unknown kind", rec.problems)
	}
	for _, p := range rec.problems {
		if strings.Contains(p, "secret") || len(p) > 300 {
			t.Errorf("problem %q quotes the update or is unbounded", p)
		}
	}
}
