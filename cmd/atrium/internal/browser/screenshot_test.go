package browser

import (
	"fmt"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestBrowser_Screenshots takes the README's screenshots: the sessions page
// and a busy session page (two people present, coloured terminal output,
// agent events, a pending approval and a queued prompt), at desktop and
// phone widths, in the light and the dark theme. They are written to
// $ATRIUM_SCREENSHOTS if set.
func TestBrowser_Screenshots(t *testing.T) {
	t.Parallel()
	st := startStack(t, func(c *server.Config) { c.HibernateAfter = time.Second })
	dir := screenshotDir(t)

	// Two quiet sessions hibernate; the busy one is kept awake by its
	// pending approval.
	st.create("alice", "Release notes for v1.2", "shell")
	other := st.create("bob", "Refactor the config loader", "shell")
	st.api("bob", 200, "PUT", "/v1/sessions/"+string(other.ID)+"/members/alice", map[string]any{"role": "viewer"}, nil)
	s := st.create("alice", "Fix the flaky upload test", "shell")
	st.api("alice", 200, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "driver"}, nil)
	waitTurn := func(n float64) {
		st.waitEvent("alice", s.ID, fmt.Sprintf("turn %v", n), func(ev event) bool {
			return ev.Kind == session.KindTurnFinished && ev.field("turn") == n
		})
	}
	st.prompt("alice", s.ID, `go test ./upload/... 2>&1 | tail -3 # (simulated)
printf '\033[1;32mok\033[0m   example.com/upload/chunk  0.412s\n'
printf '\033[1;31m--- FAIL:\033[0m TestUpload_Resume (2.31s)\n    upload_test.go:88: got 3 parts, want 4\n'
printf '\033[33mFAIL\033[0m  example.com/upload  2.904s\n' >&2
exit 1`)
	waitTurn(1)
	st.prompt("bob", s.ID, `echo '{"type":"thinking","text":"The resume path races with the part uploader: the last part is sent before the manifest is read."}'
echo '{"type":"tool_use","name":"edit","text":"upload/resume.go: wait for the manifest before sending parts"}'
printf 'patched upload/resume.go\n\033[1;32mPASS\033[0m\n'`)
	waitTurn(2)
	st.prompt("bob", s.ID, `echo '{"type":"approval_request","id":"push","summary":"Push branch fix-upload-resume and open a pull request?"}'; read -r answer; echo "$answer"`)
	st.waitEvent("alice", s.ID, "the approval request", func(ev event) bool { return ev.Kind == session.KindApprovalRequested })
	st.prompt("alice", s.ID, "go test -count=20 ./upload/...")

	bob := st.open("bob")
	bob.openSession(s.ID)
	alice := st.open("alice")
	alice.waitJS("hibernated sessions", `document.querySelectorAll('.pill.state-hibernated').length >= 2`)
	for _, theme := range []string{"light", "dark"} {
		alice.goTo("/")
		alice.waitJS("the sessions list", `document.querySelectorAll('#sessions li').length === 3`)
		alice.screenshot(dir, "sessions-desktop-"+theme, 1280, 800, theme, false)
		alice.screenshot(dir, "sessions-phone-"+theme, 390, 844, theme, true)
		alice.resetView()
		alice.openSession(s.ID)
		alice.waitJS("bob's presence", `document.querySelector('#presence li[data-user="bob"]')`)
		alice.waitRow("the approval card", ".k-approval_requested", "Push branch")
		alice.waitRow("the queue", "#queue li", "go test -count=20")
		alice.screenshot(dir, "session-desktop-"+theme, 1280, 800, theme, false)
		alice.screenshot(dir, "session-phone-"+theme, 390, 844, theme, true)
		alice.resetView()
	}
}
