package actor

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestSessionActor_IdleAndQuiet checks how the actor combines its
// components' state into idle (hibernate after hibernate_after) and quiet
// (a closing host may hibernate it), without NATS or a history.
func TestSessionActor_IdleAndQuiet(t *testing.T) {
	tests := map[string]struct {
		set         func(s *sessionActor)
		idle, quiet bool
	}{
		"nothing":               {func(*sessionActor) {}, true, true},
		"a turn runs":           {func(s *sessionActor) { s.queue.runner = &runner{} }, false, false},
		"a prompt is queued":    {func(s *sessionActor) { s.queue.turns.Enqueue(session.Prompt{Seq: 3}) }, false, true},
		"a sandbox op runs":     {func(s *sessionActor) { s.sandbox.startOp(func() {}) }, false, false},
		"a sleep timer is due":  {func(s *sessionActor) { s.sandbox.sleepFired(2, phaseActive) }, false, true},
		"an event is numbered":  {func(s *sessionActor) { s.events.emit(session.KindOutput, "x", []byte(`{}`), nil) }, false, false},
		"a batch is committing": {func(s *sessionActor) { s.events.emit(session.KindOutput, "x", []byte(`{}`), nil); s.events.takeBatch() }, false, false},
		"metadata changed":      {func(s *sessionActor) { s.events.metaDirty = true }, false, false},
		"a place request waits": {func(s *sessionActor) { s.act.waiting = append(s.act.waiting, &placeMsg{}) }, false, true},
		"a file write waits":    {func(s *sessionActor) { s.files.staging++ }, false, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := &sessionActor{}
			s.events.resume(session.Meta{Epoch: "e"}, 1, nil, 1<<20)
			s.act.phase = phaseActive
			tc.set(s)
			if got := s.idle(); got != tc.idle {
				t.Errorf("idle() = %v, want %v", got, tc.idle)
			}
			if got := s.quiet(); got != tc.quiet {
				t.Errorf("quiet() = %v, want %v", got, tc.quiet)
			}
		})
	}
}
