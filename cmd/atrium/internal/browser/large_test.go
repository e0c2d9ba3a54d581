package browser

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/session"
)

// maxRows is web/static/js/timeline.js's MAX_ROWS: the most event rows the
// page keeps in the document.
const maxRows = 400

// TestBrowser_LargeSession opens a session of 50,000 events. The history is
// built through the real server the fastest honest way: one turn whose
// harness prints 50,000 JSON lines, each of which the node turns into an
// agent event. The test logs how long the latest event took to be in view
// (never a pass/fail figure), and checks that the page shows the latest
// events with a bounded number of rows, reads older pages as the reader
// scrolls up, and jumps back to the live end.
func TestBrowser_LargeSession(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "fifty thousand events", map[string]any{"command": []string{"/bin/bash", "-c",
		`read -r _; yes '{"type":"step","text":"agent step"}' | head -n 50000`}})
	built := time.Now()
	st.prompt("alice", s.ID, "go")
	last := st.waitLast("alice", s.ID, session.KindTurnFinished)
	if last < 50000 {
		t.Fatalf("the session has %d events, want at least 50,000", last)
	}
	t.Logf("built %d events through the server in %v", last, time.Since(built).Round(time.Millisecond))

	alice := st.open("alice")
	latest := fmt.Sprintf(`(() => {
		const r = document.querySelector('#rows > .ev[data-seq="%d"]');
		if (!r) return false;
		const a = r.getBoundingClientRect(), b = document.querySelector('#timeline').getBoundingClientRect();
		return a.top < b.bottom && a.bottom > b.top;
	})()`, last)
	for _, visit := range []string{"first visit", "second visit (modules cached)"} {
		start := time.Now()
		alice.do(chromedp.Navigate(alice.base + "/s/" + string(s.ID)))
		alice.waitJS("the latest event in view", latest)
		t.Logf("%s: the latest of %d events was in view %v after navigation started", visit, last,
			time.Since(start).Round(time.Millisecond))
	}
	rows := alice.seqs()
	if len(rows) > maxRows || rows[len(rows)-1] != last {
		t.Fatalf("%d rows ending at seq %d, want at most %d ending at %d", len(rows), rows[len(rows)-1], maxRows, last)
	}
	checkContiguous(t, "rows at the live end", rows)

	// Scrolling up reads older pages over REST; the document stays bounded.
	target := last - 1500
	deadline := time.Now().Add(waitLong)
	for rows[0] > target {
		if time.Now().After(deadline) {
			t.Fatalf("scrolling up: rows still start at seq %d after %v, want %d", rows[0], waitLong, target)
		}
		eval[bool](alice, `(() => { const t = document.querySelector('#timeline'); t.scrollTop = 0; t.dispatchEvent(new Event('scroll')); return true })()`)
		time.Sleep(30 * time.Millisecond) // let the page read and render; polling interval
		rows = alice.seqs()
		if len(rows) > maxRows {
			t.Fatalf("%d rows in the document after scrolling up, want at most %d", len(rows), maxRows)
		}
		checkContiguous(t, "rows while scrolling up", rows)
	}
	if eval[bool](alice, `document.querySelector('.jump').hidden`) {
		t.Fatal("no jump-to-latest button after scrolling far up")
	}
	alice.click(".jump")
	alice.waitJS("the latest event in view after jumping", latest)
	checkContiguous(t, "rows after jumping back", alice.seqs())
}

// waitLast polls until the session's last event is of kind and returns its
// seq.
func (st *stack) waitLast(user string, id session.ID, kind session.Kind) int64 {
	st.t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		var s session.Session
		st.api(user, http.StatusOK, "GET", "/v1/sessions/"+string(id), nil, &s)
		var p struct{ Events []event }
		st.api(user, http.StatusOK, "GET", fmt.Sprintf("/v1/sessions/%s/events?after=%d&limit=1", id, max(0, s.LastSeq-1)), nil, &p)
		if len(p.Events) == 1 && p.Events[0].Kind == kind {
			return p.Events[0].Seq
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("session %s: the last event is not %s after %v", id, kind, waitLong)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
}

// checkContiguous fails unless seqs are consecutive.
func checkContiguous(t *testing.T, what string, seqs []int64) {
	t.Helper()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("%s: seq %d follows %d (a gap or a duplicate)", what, seqs[i], seqs[i-1])
		}
	}
}
