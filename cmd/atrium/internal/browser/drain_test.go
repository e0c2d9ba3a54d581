package browser

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// drainLines is how many lines drainHarness prints: one every 16 ms (more
// than the node's output flush delay, so each is an output event of its
// own), most of them while the server drains. More than MAX_ROWS and a
// history page, so the page catches up with a burst bigger than its window.
const drainLines = 800

var drainHarness = map[string]any{"command": []string{"/bin/bash", "-c", fmt.Sprintf(`
read -r input
for i in $(seq 1 %d); do echo "line $i"; sleep 0.016; done
`, drainLines)}}

// TestBrowser_ResumeAfterDrain stops the server while a turn prints lines
// fast (a SIGTERM drain: the gateway closes the page's WebSocket with 1012
// "reconnect" and the node lets the turn stream on, here to its end, within
// a long DrainGrace), restarts it on the same data dir and checks that the
// page, once live again, shows every event committed meanwhile: it follows
// the live end (the last event in view, no "new events" button), and
// scrolling up through the timeline shows each seq from 1 to the last once
// and each line once, in order.
//
// This is the regression test of a page that caught up ~1,500 events in
// one burst after a drain and then stopped following the live end: a
// scroll event that came while the store was more than MAX_ROWS ahead of
// the rendered rows was taken for a reader stepping back from far up.
func TestBrowser_ResumeAfterDrain(t *testing.T) {
	t.Parallel()
	st := startStack(t, func(c *server.Config) { c.DrainGrace = 2 * time.Minute })
	px := startProxy(t, strings.TrimPrefix(st.srv.URL(), "http://"))
	st.base = px.url()
	s := st.create("alice", "drain", drainHarness)
	alice := st.open("alice")
	alice.openSession(s.ID)

	st.prompt("alice", s.ID, "lines")
	alice.waitRow("the first lines", ".k-output", "line 20\n")
	px.block()
	stopped := time.Now()
	addr := st.restart() // drains: the turn runs to its end meanwhile
	t.Logf("the drain and restart took %v", time.Since(stopped).Round(time.Millisecond))
	end := st.waitEvent("alice", s.ID, "the end of the turn", func(ev event) bool {
		return ev.Kind == session.KindTurnFinished
	})
	if got := end.field("status"); got != "ok" {
		t.Fatalf("the turn ended %v, want ok: it must finish within the drain", got)
	}
	last := st.history("alice", s.ID, end.Seq-1)
	lastSeq := last[len(last)-1].Seq
	saw := slices.Max(append(alice.seqs(), 0))
	if lastSeq-saw <= maxRows {
		t.Fatalf("the page saw up to seq %d of %d before the restart: too few events were left for a burst bigger than its window", saw, lastSeq)
	}
	t.Logf("the page resumes after seq %d of %d", saw, lastSeq)

	back := time.Now()
	px.resume(addr)
	alice.waitLive()
	t.Logf("reconnected %v after the restarted server was reachable", time.Since(back).Round(time.Millisecond))
	alice.waitJS("the last event in view, following the live end", fmt.Sprintf(`(() => {
		const r = document.querySelector('#rows > .ev[data-seq="%d"]');
		if (!r || !document.querySelector('.jump').hidden) return false;
		const a = r.getBoundingClientRect(), b = document.querySelector('#timeline').getBoundingClientRect();
		return a.top < b.bottom && a.bottom > b.top;
	})()`, lastSeq))
	if state := eval[string](alice, `document.querySelector('.conn').dataset.state`); state != "live" {
		t.Fatalf("connection state %q after catching up, want live", state)
	}
	rows := alice.seqs()
	if len(rows) > maxRows {
		t.Fatalf("%d rows in the document, want at most %d", len(rows), maxRows)
	}
	checkContiguous(t, "rows at the live end", rows)

	// Every event is in the timeline: scroll up through all of it.
	scrolled := time.Now()
	seqs, text := alice.scrollToStart()
	t.Logf("scrolled up through %d rows in %v", len(seqs), time.Since(scrolled).Round(time.Millisecond))
	want := make([]int64, lastSeq)
	for i := range want {
		want[i] = int64(i + 1)
	}
	checkSeqs(t, "rows seen scrolling up from the live end", seqs, want)
	re := regexp.MustCompile(`(?m)^(line|hidden) (\d+)$`)
	next := 1
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		got, _ := strconv.Atoi(m[2])
		if m[1] == "hidden" { // lines of a collapsed output row, before its tail
			next += got
			continue
		}
		if got != next {
			t.Fatalf("the page's output has %q where line %d should be (a line lost or repeated)", m[0], next)
		}
		next++
	}
	if next-1 != drainLines {
		t.Fatalf("the page's output has line 1..%d, want 1..%d", next-1, drainLines)
	}
}

// scrollToStart scrolls the timeline up to the session's first event and
// returns the seq of every row it showed on the way, in order, and the text
// of their output, in order.
func (tb *tab) scrollToStart() ([]int64, string) {
	tb.t.Helper()
	type row struct {
		Seq  int64  `json:"seq"`
		Text string `json:"text"`
	}
	seen := map[int64]string{}
	deadline := time.Now().Add(waitLong)
	for {
		rows := eval[[]row](tb, `[...document.querySelectorAll('#rows > .ev')].map((e) => ({
			seq: Number(e.dataset.seq),
			// An output event of more than 24 lines shows its tail behind
			// "Show N earlier lines" (under load the node reads several
			// lines at once): say how many are hidden.
			text: e.classList.contains('k-output') ? (() => {
				const more = e.querySelector('button.more[data-more]');
				const hidden = more ? 'hidden ' + more.textContent.replace(/[^0-9]/g, '') + '\n' : '';
				return hidden + [...e.querySelectorAll('pre')].map((p) => p.textContent).join('');
			})() : '',
		}))`)
		for _, r := range rows {
			seen[r.Seq] = r.Text
		}
		if len(rows) > maxRows {
			tb.t.Fatalf("%d rows in the document while scrolling up, want at most %d", len(rows), maxRows)
		}
		if len(rows) > 0 && rows[0].Seq == 1 {
			break
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("scrolling up: rows still start at seq %v after %v", rows, waitLong)
		}
		eval[bool](tb, `(() => { const t = document.querySelector('#timeline'); t.scrollTop = 0; t.dispatchEvent(new Event('scroll')); return true })()`)
		time.Sleep(30 * time.Millisecond) // let the page render; polling interval
	}
	seqs := make([]int64, 0, len(seen))
	for seq := range seen {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	var text strings.Builder
	for _, seq := range seqs {
		text.WriteString(seen[seq])
	}
	return seqs, text.String()
}
