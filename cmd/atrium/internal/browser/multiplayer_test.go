package browser

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/atriumhq/atrium/session"
)

// TestBrowser_Multiplayer is the done-when scenario in three browser
// contexts (three users): alice creates a session in the UI and shares it
// (bob drives, carol views); all three see one stream and each other's
// presence; carol has no prompt box and a prompt frame forged from her page
// is refused; prompts typed in one browser appear in the others, with the
// queue of pending prompts; an approval is answered with a click; bob's Esc
// cancels alice's turn once he confirms; and every page's rows are the REST
// history.
func TestBrowser_Multiplayer(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	alice := st.open("alice")
	alice.checkA11y("the sessions page")

	// Alice creates a session from the sessions page.
	alice.typeInto("#new-title", "pairing on the build")
	alice.click("#create")
	alice.waitLive()
	id := alice.sessionID()
	alice.waitJS("the prompt box", `!document.querySelector('#composer').hidden && document.activeElement !== null`)
	if got := eval[string](alice, `document.querySelector('#session-title').textContent`); got != "pairing on the build" {
		t.Fatalf("session title %q", got)
	}

	// She shares it: bob drives, carol views. Esc closes the dialog and
	// cancels nothing.
	alice.click("#share-open")
	alice.waitJS("the share dialog", `document.querySelector('#share').open`)
	alice.typeInto("#share-user", "bob")
	alice.enter()
	alice.waitRow("bob in the member list", "#members li", "bob")
	alice.typeInto("#share-user", "carol")
	alice.do(chromedp.SetValue(chromedp.CSS("#share-role"), "viewer"))
	alice.do(chromedp.Focus(chromedp.CSS("#share-user")))
	alice.enter()
	alice.waitJS("carol as a viewer", `document.querySelector('#members li[data-user="carol"] select')?.value === 'viewer'`)
	if got := eval[string](alice, `document.querySelector('#members li[data-user="bob"] select').value`); got != "driver" {
		t.Fatalf("bob's role in the dialog %q, want driver", got)
	}
	alice.checkA11y("the share dialog")
	alice.key(kb.Escape)
	alice.waitJS("the dialog closed", `!document.querySelector('#share').open`)
	alice.waitRow("the member_changed rows", ".k-member_changed", "made carol a viewer")

	bob := st.open("bob")
	bob.openSession(id)
	carol := st.open("carol")
	carol.openSession(id)

	// Presence, live, everywhere.
	for _, tb := range []*tab{alice, bob, carol} {
		tb.waitJS("everyone's presence", `['alice','bob','carol'].every((u) => document.querySelector('#presence li[data-user="' + u + '"]'))`)
	}

	// Carol is a viewer: no prompt box, and the server refuses a prompt
	// frame forged from her page.
	if eval[bool](carol, `!document.querySelector('#composer').hidden || document.querySelector('#composer').offsetParent !== null`) {
		t.Fatal("the viewer has a visible prompt box")
	}
	carol.waitJS("the viewer note", `!document.querySelector('#viewer-note').hidden`)
	forged := eval[map[string]any](carol, fmt.Sprintf(`new Promise((resolve, reject) => {
		const ws = new WebSocket('ws://' + location.host + '/v1/sessions/%s/ws?after=0', 'atrium.v1');
		setTimeout(() => reject(new Error('no answer to the forged frame')), 10000);
		ws.onmessage = (m) => {
			const f = JSON.parse(m.data);
			if (f.type === 'hello') ws.send(JSON.stringify({type: 'prompt', text: 'echo forged', client_id: 'forged-1'}));
			if (f.type === 'error' && f.client_id === 'forged-1') { ws.close(); resolve(f); }
		};
	})`, id))
	if forged["code"] != "forbidden" {
		t.Fatalf("forged prompt from the viewer's page got %v, want error forbidden", forged)
	}

	// Alice types a prompt; Shift+Enter adds a line, Enter sends.
	alice.typeInto("#prompt", "echo hello from alice")
	alice.shiftEnter()
	alice.do(chromedp.SendKeys(chromedp.CSS("#prompt"), "echo second line"))
	if got := eval[string](alice, `document.querySelector('#prompt').value`); got != "echo hello from alice\necho second line" {
		t.Fatalf("after Shift+Enter the prompt box holds %q", got)
	}
	alice.enter()
	alice.waitJS("an empty prompt box", `document.querySelector('#prompt').value === ''`)
	for _, tb := range []*tab{alice, bob, carol} {
		tb.waitRow("alice's prompt", ".k-message", "echo hello from alice")
		tb.waitRow("the turn's output", ".k-output", "hello from alice\nsecond line")
		tb.waitRow("turn 1 finished", ".k-turn_finished", "Turn 1 finished")
	}
	if who := eval[string](bob, `document.querySelector('.k-message .who').textContent`); who != "alice" {
		t.Fatalf("bob sees the prompt's author as %q", who)
	}

	// Bob's prompt asks for approval; while it waits, alice queues another.
	bob.send(`echo '{"type":"approval_request","id":"deploy","summary":"Deploy to staging?"}'; read -r answer; echo "answer: $answer"`)
	for _, tb := range []*tab{alice, bob, carol} {
		tb.waitRow("the approval card", ".k-approval_requested", "Deploy to staging?")
		tb.waitRow("the turn state", "#turn-state", "waiting for approval")
	}
	if eval[bool](carol, `document.querySelector('.k-approval_requested button') !== null`) {
		t.Fatal("the viewer has approval buttons")
	}
	alice.send("echo queued by alice")
	for _, tb := range []*tab{alice, bob, carol} {
		tb.waitRow("alice's queued prompt", "#queue li", "echo queued by alice")
	}
	alice.waitRow("the queued badge", ".k-message .badge", "queued")

	// Alice answers bob's approval with a click.
	alice.click(`.k-approval_requested button[data-approve="allow"]`)
	for _, tb := range []*tab{alice, bob, carol} {
		tb.waitRow("the answer in the output", ".k-output", `"allow":true`)
		tb.waitRow("the resolved card", ".k-approval_requested .outcome", "Allowed by alice")
		tb.waitRow("the queued prompt's output", ".k-output", "queued by alice")
		tb.waitJS("an empty queue", `document.querySelector('#queue').hidden`)
	}

	// Alice starts a long turn; bob presses Esc and it stops.
	alice.send("echo started long; sleep 600")
	bob.waitRow("the long turn's output", ".k-output", "started long")
	bob.waitJS("bob's cancel button", `!document.querySelector('#cancel-turn').hidden`)
	bob.do(chromedp.Focus(chromedp.CSS("#timeline")))
	bob.key(kb.Escape)
	// It is alice's turn: bob's page asks first.
	bob.waitJS("the cancel confirmation", `document.querySelector('#confirm-cancel').open`)
	bob.click("#confirm-cancel-yes")
	for _, tb := range []*tab{alice, bob, carol} {
		tb.waitRow("the cancelled turn", ".k-turn_finished", "Turn 4 was cancelled")
		tb.waitJS("an idle session", `document.querySelector('#turn-state').dataset.state === 'cancelled'`)
	}

	alice.checkA11y("the owner's session page")
	carol.checkA11y("the viewer's session page")

	// Every page shows exactly the REST history, in order.
	want := seqsOf(st.history("alice", id, 0))
	for _, tb := range []*tab{alice, bob, carol} {
		tb.waitJS("the last event", fmt.Sprintf(`document.querySelector('#rows > .ev[data-seq="%d"]')`, want[len(want)-1]))
		checkSeqs(t, tb.user+"'s rows vs REST", tb.seqs(), want)
	}
	hist := st.history("alice", id, 0)
	for _, ev := range hist {
		if ev.Kind == session.KindMessage && strings.Contains(string(ev.Data), "forged") {
			t.Fatalf("the forged prompt is in the history: %s", ev.Data)
		}
	}
	// The cancel came from bob.
	cancelled := false
	for _, ev := range hist {
		if ev.Kind == session.KindTurnFinished && ev.field("status") == "cancelled" {
			cancelled = true
		}
	}
	if !cancelled {
		t.Fatal("no cancelled turn in the history")
	}
}
