package browser

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/session"
)

// wsURLs records the address of every WebSocket the page opens.
const wsURLs = `(() => {
	const Native = window.WebSocket;
	window.__wsURLs = [];
	window.WebSocket = class extends Native {
		constructor(...args) { super(...args); window.__wsURLs.push(String(args[0])); }
	};
})();`

// TestBrowser_ResumeFarBehind: a page that was away while 50,000 events
// were written (the network cut by the test's proxy) comes back at the
// live end without catching up event by event: its hello says it is far
// behind (session.js FAR_BEHIND), so it starts again from the latest page,
// as when opening. The test logs how long the latest event took to be in
// view after the network came back (never asserted), and checks the rows
// are the tail of the REST history with no gap, and scrolling up still
// reads older events.
func TestBrowser_ResumeFarBehind(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	px := startProxy(t, strings.TrimPrefix(st.srv.URL(), "http://"))
	st.base = px.url()
	s := st.create("alice", "away for a while", map[string]any{"command": []string{"/bin/bash", "-c",
		`read -r input; case "$input" in *many*) yes '{"type":"step","text":"agent step"}' | head -n 50000;; *) echo hi;; esac`}})
	st.prompt("alice", s.ID, "hello")
	first := st.waitLast("alice", s.ID, session.KindTurnFinished)

	alice := st.open("alice")
	alice.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: wsURLs})
		return err
	}))
	alice.openSession(s.ID)
	alice.waitLive()
	alice.waitJS("the first turn", fmt.Sprintf(`document.querySelector('#rows > .ev[data-seq="%d"]') !== null`, first))

	px.cut()
	alice.waitJS("the page noticing the drop", `document.querySelector('.conn').dataset.state !== 'live'`)
	st.prompt("alice", s.ID, "many")
	last := st.waitLast("alice", s.ID, session.KindTurnFinished)
	if last-first < 50000 {
		t.Fatalf("the turn wrote %d events, want 50,000", last-first)
	}
	sockets := eval[int](alice, `window.__wsURLs.length`)
	latest := fmt.Sprintf(`(() => {
		const r = document.querySelector('#rows > .ev[data-seq="%d"]');
		if (!r) return false;
		const a = r.getBoundingClientRect(), b = document.querySelector('#timeline').getBoundingClientRect();
		return a.top < b.bottom && a.bottom > b.top;
	})()`, last)
	back := time.Now()
	px.resume("")
	// "Retry now" skips what is left of the reconnect backoff, which is
	// not the figure logged here.
	eval[bool](alice, `(() => { const b = [...document.querySelectorAll('.sbar-status button')].find((b) => b.textContent === 'Retry now' && !b.hidden); if (b) b.click(); return true; })()`)
	alice.waitJS("the latest event in view", latest)
	t.Logf("the latest of %d events in view %v after the network came back and the page retried (%d events behind)", last, time.Since(back).Round(time.Millisecond), last-first)

	// The page started again at the end: its last socket asked for the
	// latest page only, after one that resumed from where it was.
	urls := eval[[]string](alice, `window.__wsURLs`)
	if len(urls) < sockets+2 {
		t.Fatalf("sockets %v: want a resume from seq %d and then one from the end", urls, first)
	}
	u, err := url.Parse(urls[len(urls)-1])
	if err != nil {
		t.Fatal(err)
	}
	after, _ := strconv.ParseInt(u.Query().Get("after"), 10, 64)
	if after < last-1000 {
		t.Fatalf("the last socket resumed after seq %d, want near the end %d", after, last)
	}
	rows := alice.seqs()
	if len(rows) > maxRows || rows[len(rows)-1] != last {
		t.Fatalf("%d rows ending at seq %d, want at most %d ending at %d", len(rows), rows[len(rows)-1], maxRows, last)
	}
	checkContiguous(t, "rows after coming back", rows)
	// Older events are still there for the reader who scrolls up.
	target := rows[0] - 300
	deadline := time.Now().Add(waitLong)
	for rows[0] > target {
		if time.Now().After(deadline) {
			t.Fatalf("scrolling up: rows still start at seq %d, want %d", rows[0], target)
		}
		eval[bool](alice, `(() => { const t = document.querySelector('#timeline'); t.scrollTop = 0; t.dispatchEvent(new Event('scroll')); return true })()`)
		time.Sleep(30 * time.Millisecond) // let the page read and render; polling interval
		rows = alice.seqs()
		checkContiguous(t, "rows while scrolling up", rows)
	}
}
