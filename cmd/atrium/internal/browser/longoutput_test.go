package browser

import (
	"testing"
)

// TestBrowser_LongOutput: a turn that prints 5,000 lines shows the end of
// its output on the page (the last line in view), and every line of it is
// reachable there — each "Show N earlier lines" expanded, lines 1 … 5,000
// in order, none lost or repeated (the issue: such an output showed its
// first 24 lines).
func TestBrowser_LongOutput(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "Five thousand lines", "shell")
	st.prompt("alice", s.ID, `seq -f 'line %g' 1 5000`)
	alice := st.open("alice")
	alice.openSession(s.ID)
	alice.waitRow("turn 1 finished", ".k-turn_finished", "Turn 1 finished")
	alice.waitJS("the last line in view", `(() => {
		const pre = [...document.querySelectorAll('#rows > .k-output pre')].pop();
		if (!pre || !pre.textContent.endsWith('line 5000\n')) return false;
		const r = pre.getBoundingClientRect(), tl = document.querySelector('#timeline').getBoundingClientRect();
		return r.bottom > tl.top && r.bottom <= tl.bottom + 1;
	})()`)
	if n := checkLines(t, alice, "line", 5000); n != 5000 {
		t.Fatalf("%d lines reachable, want 5,000", n)
	}
}
