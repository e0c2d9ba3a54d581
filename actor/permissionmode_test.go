package actor

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestAgent_PermissionMode: a session's own permission mode, given at
// creation, is what its agent is launched in; a session without one gets
// the node's ("").
func TestAgent_PermissionMode(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t)}
	e := newEnv(t, withAgents(agents, &fakeModels{}))
	for _, mode := range []string{session.PermissionAuto, ""} {
		id := e.create("alice", session.Harness{Agent: "fake", PermissionMode: mode})
		w := e.watch(id)
		if fin := agentRun(t, e, w, id, 1, "chunks 1"); fin.Status != session.TurnOK {
			t.Fatalf("mode %q: turn %+v", mode, fin)
		}
		if got := agents.lastMode.Load(); got == nil || *got != mode {
			t.Fatalf("launched in mode %v, want %q", got, mode)
		}
	}
	if r := e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: session.NewID(),
		Harness: session.Harness{Agent: "fake", PermissionMode: "yolo"}}); r.Error == nil || r.Error.Code != session.CodeBadRequest {
		t.Fatalf("create with permission_mode yolo: %+v, want bad_request", r)
	}
}
