package browser

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestBrowser_StateFromOlderEvents opens a session whose current state
// depends on events older than the first page the UI reads: the running
// turn started, and two prompts were queued behind it, 800 events before the
// approval it now waits for. The page reads back until it knows, then shows
// the running turn, the approval with its buttons and the queue, and keeps
// them right as the session goes on.
func TestBrowser_StateFromOlderEvents(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "deep state", map[string]any{"command": []string{"/bin/bash", "-c", `
read -r input
case "$input" in
*'"prompt":"flood'*)
  echo '{"type":"approval_request","id":"start","summary":"Start?"}'
  read -r answer
  yes '{"type":"step","text":"working"}' | head -n 800
  echo '{"type":"approval_request","id":"ship","summary":"Ship it?"}'
  read -r answer
  ;;
*) echo "ran turn $ATRIUM_TURN" ;;
esac
`}})
	st.prompt("alice", s.ID, "flood")
	st.waitEvent("alice", s.ID, "the first approval", func(ev event) bool { return ev.Kind == session.KindApprovalRequested })
	st.prompt("alice", s.ID, "queued one")
	st.prompt("alice", s.ID, "queued two")
	st.api("alice", 202, "POST", "/v1/sessions/"+string(s.ID)+"/approvals/start", map[string]any{"allow": true}, nil)
	last := st.waitLast("alice", s.ID, session.KindApprovalRequested)
	if last < 800 {
		t.Fatalf("last seq %d: the flood did not happen", last)
	}

	alice := st.open("alice")
	alice.openSession(s.ID)
	alice.waitJS("the first page only", `(() => { const r = document.querySelector('#rows > .ev'); return r && Number(r.dataset.seq) > 500 })()`)
	alice.waitRow("the queue, from before the first page", "#queue li", "queued two")
	alice.waitRow("the running turn, from before the first page", "#turn-state", "Turn 1 waiting for approval")
	alice.click(`.k-approval_requested button[data-approve="allow"]`)
	alice.waitRow("turn 3's output", ".k-output", "ran turn 3")
	alice.waitJS("an empty queue", `document.querySelector('#queue').hidden`)
	alice.waitRow("an idle session", "#turn-state", "Idle · turn 3 ok")
}
