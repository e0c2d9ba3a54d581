package browser

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// resumeHarness prints numbered lines around two approvals ("lines"), or a
// tick every 20 ms for a minute ("ticks"), or echoes its input.
var resumeHarness = map[string]any{"command": []string{"/bin/bash", "-c", `
read -r input
case "$input" in
*'"prompt":"lines'*)
  for i in $(seq 1 300); do echo "line $i"; done
  echo '{"type":"approval_request","id":"mid","summary":"continue?"}'
  read -r answer
  for i in $(seq 301 600); do echo "line $i"; done
  echo '{"type":"approval_request","id":"end","summary":"finish?"}'
  read -r answer
  for i in $(seq 601 700); do echo "line $i"; done
  ;;
*'"prompt":"ticks'*)
  for i in $(seq 1 3000); do echo "tick $i"; sleep 0.02; done
  ;;
*)
  echo "ran turn $ATRIUM_TURN"
  ;;
esac
`}}

// TestBrowser_Resume drops a page's WebSocket twice while events stream and
// checks that the page reconnects by itself and resumes by cursor with no
// line missing or repeated: its rows are exactly the REST history.
//
// The browser reaches the server through a loopback TCP proxy the test
// controls. First the proxy cuts the connection mid-turn (the page sees an
// abnormal close, 1006) and refuses new ones while the turn produces 300 more
// lines; then it lets the page back in. Second, the server itself shuts down
// mid-turn (its gateway closes the WebSocket with 1001 "server shutting down:
// reconnect", the node cancels the turn and records it), a new server starts
// on the same data dir, a prompt runs there while the page is still away, and
// the page resumes on the new server.
func TestBrowser_Resume(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	px := startProxy(t, strings.TrimPrefix(st.srv.URL(), "http://"))
	st.base = px.url()
	s := st.create("alice", "resume", resumeHarness)
	alice := st.open("alice")
	alice.openSession(s.ID)

	// 1. The network drops mid-turn.
	st.prompt("alice", s.ID, "lines")
	alice.waitRow("the first approval", ".k-approval_requested", "continue?")
	px.cut()
	alice.waitJS("the page noticing the drop", `document.querySelector('.conn').dataset.state !== 'live'`)
	st.api("alice", 202, "POST", "/v1/sessions/"+string(s.ID)+"/approvals/mid", map[string]any{"allow": true}, nil)
	st.waitEvent("alice", s.ID, "the second approval", func(ev event) bool {
		return ev.Kind == session.KindApprovalRequested && ev.field("id") == "end"
	})
	alice.waitJS("a retry countdown", `document.querySelector('.conn').dataset.state === 'waiting'`)
	back := time.Now()
	px.resume("")
	alice.waitLive()
	t.Logf("reconnected %v after the network came back", time.Since(back).Round(time.Millisecond))
	alice.waitRow("the second approval", ".k-approval_requested", "finish?")
	alice.click(`.k-approval_requested button[data-approve="allow"]`)
	alice.waitRow("the end of turn 1", ".k-turn_finished", "Turn 1 finished")
	checkPage(t, st, alice, s.ID)
	checkLines(t, alice, "line", 700)

	// 2. The server shuts down mid-turn and comes back.
	st.prompt("alice", s.ID, "ticks")
	alice.waitRow("ticks", ".k-output", "tick 20\n")
	px.block()
	addr := st.restart()
	alice.waitJS("the page noticing the shutdown", `document.querySelector('.conn').dataset.state !== 'live'`)
	st.prompt("alice", s.ID, "after the restart")
	st.waitEvent("alice", s.ID, "turn 3's end", func(ev event) bool {
		return ev.Kind == session.KindTurnFinished && ev.field("turn") == 3.0
	})
	back = time.Now()
	px.resume(addr)
	alice.waitLive()
	t.Logf("reconnected %v after the restarted server was reachable", time.Since(back).Round(time.Millisecond))
	alice.waitRow("turn 3's output", ".k-output", "ran turn 3")
	alice.waitRow("the cancelled ticks", ".k-turn_finished", "Turn 2 was cancelled")
	checkPage(t, st, alice, s.ID)
	ticks := checkLines(t, alice, "tick", -1)
	t.Logf("the ticks turn printed %d lines before the shutdown cancelled it; the page has each once", ticks)

	// The page still drives the session on the new server.
	alice.send("anything")
	alice.waitRow("turn 4's output", ".k-output", "ran turn 4")
	checkPage(t, st, alice, s.ID)
}

// checkPage fails unless the page's rows are exactly the REST history.
func checkPage(t *testing.T, st *stack, tb *tab, id session.ID) {
	t.Helper()
	want := seqsOf(st.history("alice", id, 0))
	tb.waitJS("the last event's row", fmt.Sprintf(`document.querySelector('#rows > .ev[data-seq="%d"]')`, want[len(want)-1]))
	checkSeqs(t, tb.user+"'s rows vs REST", tb.seqs(), want)
}

// checkLines expands every collapsed output, reads the page's output text and fails unless the lines "<word>
// N" are 1, 2, 3 … in order, each once (up to n if n >= 0). It returns how
// many there are.
func checkLines(t *testing.T, tb *tab, word string, n int) int {
	t.Helper()
	// Long output is collapsed: show it all first.
	eval[bool](tb, `(() => { document.querySelectorAll('#rows button[data-more]').forEach((b) => b.click()); return true })()`)
	text := eval[string](tb, `[...document.querySelectorAll('#rows > .k-output pre')].map((e) => e.textContent).join('')`)
	re := regexp.MustCompile(`(?m)^` + word + ` (\d+)$`)
	next := 1
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		got, _ := strconv.Atoi(m[1])
		if got != next {
			t.Fatalf("the page's output has %q where %s %d should be (a line lost or repeated)", m[0], word, next)
		}
		next++
	}
	if n >= 0 && next-1 != n {
		t.Fatalf("the page's output has %s 1..%d, want 1..%d", word, next-1, n)
	}
	// Showing more stopped the timeline following the live end: scroll back
	// down, as a reader would, so that it follows again.
	eval[bool](tb, `(() => { const t = document.querySelector('#timeline'); t.scrollTop = t.scrollHeight; return true })()`)
	tb.waitJS("the timeline following again", `document.querySelector('.jump').hidden`)
	return next - 1
}
