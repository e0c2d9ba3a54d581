package browser

import (
	"net/http"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestBrowser_UsageTotals: the header's usage is the session's, not only
// that of the events the page has read: the Session object's usage totals
// (as of its last_seq) plus the usage events after it. A page that opened
// on the latest page of a long session would otherwise show a lower bound.
// The hello frame is handed to the page through its socket, as a
// reconnect brings it, with totals for history the page never read.
func TestBrowser_UsageTotals(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "usage totals", "shell")
	var info session.Session
	st.api("alice", http.StatusOK, "GET", "/v1/sessions/"+string(s.ID), nil, &info)
	alice := st.open("alice")
	alice.tapWS()
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)
	f := &feeder{tb: alice, seq: int64(info.LastSeq), at: time.Now().UTC().Add(-time.Minute)}

	f.event(session.KindUsage, "system", session.UsageData{Turn: 1, Model: "m", InputTokens: 1000, OutputTokens: 100, CostUSD: 0.01})
	alice.waitRow("the usage of the events read", "#usage-total", "1.0k in · 100 out · $0.01")

	// A reconnect's hello: the session's totals cover its whole history
	// up to last_seq, the usage event above included.
	hello := info
	hello.LastSeq = session.Seq(f.seq)
	hello.Usage = &session.UsageTotals{InputTokens: 50000, OutputTokens: 7000, CostUSD: 1.5}
	f.frame(session.HelloFrame{Type: session.FrameHello, Session: hello, You: session.You{User: "alice", Role: session.RoleOwner}, LastSeq: hello.LastSeq})
	alice.waitRow("the session's totals", "#usage-total", "50k in · 7.0k out · $1.50")

	// A usage event after it adds to them.
	f.event(session.KindUsage, "system", session.UsageData{Turn: 2, Model: "m", InputTokens: 2000, OutputTokens: 200, CostUSD: 0.02})
	alice.waitRow("the totals and the event after them", "#usage-total", "52k in · 7.2k out · $1.52")
	if got := eval[string](alice, `document.querySelector('#usage-total').textContent`); got != "52k in · 7.2k out · $1.52" {
		t.Fatalf("header usage %q", got)
	}
}

// TestBrowser_SandboxInHeader: the header says which sandbox runs the
// session and its state, also on a page opened before the session had a
// sandbox (the Session object reports the sandbox's kind only once there
// is one, so the page reads it again when the sandbox comes up).
func TestBrowser_SandboxInHeader(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "sandbox in the header", "shell")
	alice := st.open("alice")
	alice.openSession(s.ID)
	if got := eval[string](alice, `document.querySelector('.pill.sandbox').textContent`); got != "No sandbox yet" {
		t.Fatalf("a session without a sandbox shows %q", got)
	}
	alice.send("echo hi")
	alice.waitRow("turn 1 finished", ".k-turn_finished", "Turn 1 finished")
	alice.waitRow("the sandbox, where it runs and its state", ".pill.sandbox", "Sandbox ready · local")
	// A page opened now has it from the start.
	bob := st.open("alice")
	bob.openSession(s.ID)
	if got := eval[string](bob, `document.querySelector('.pill.sandbox').textContent`); got != "Sandbox ready · local" {
		t.Fatalf("a new page's header says %q", got)
	}
}
