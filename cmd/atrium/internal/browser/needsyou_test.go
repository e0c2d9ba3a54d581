package browser

import (
	"context"
	"net/http"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/session"
)

// background lets a test say the tab is in the background (headless
// Chromium's tabs are never hidden): document.hidden follows
// window.__hidden, and every notification the page shows is kept in
// window.__notes.
const background = `(() => {
	Object.defineProperty(Document.prototype, 'hidden', { configurable: true, get() { return !!window.__hidden; } });
	const Native = window.Notification;
	window.__notes = [];
	if (Native) window.Notification = class extends Native {
		constructor(title, opts) { super(title, opts); window.__notes.push(title + ': ' + ((opts && opts.body) || '')); }
	};
})();`

// TestBrowser_NeedsYou: with notifications turned on (the browser allowed
// them), a page in the background shows one when an approval waits and when
// a turn finishes, and its tab title says so until the tab is seen again.
func TestBrowser_NeedsYou(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "Needs you", "shell")
	var info session.Session
	st.api("alice", http.StatusOK, "GET", "/v1/sessions/"+string(s.ID), nil, &info)
	alice := st.open("alice")
	alice.tapWS()
	alice.do(chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: background})
		if err != nil {
			return err
		}
		_, err = cdp.Call(ctx, tg, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
			Permission: &cdpbrowser.PermissionDescriptor{Name: "notifications"}, Setting: cdpbrowser.PermissionSettingGranted,
			Origin: st.base, BrowserContextID: chromedp.FromContext(alice.ctx).BrowserContextID,
		})
		return err
	}))
	alice.openSession(s.ID)
	alice.waitJS("the tapped socket", `window.__atriumWS && window.__atriumWS.readyState === 1`)
	alice.click("#notify")
	alice.waitRow("notifications on", "#notify", "Notifications on")

	f := &feeder{tb: alice, seq: info.LastSeq, at: time.Now().UTC()}
	eval[bool](alice, `(() => { window.__hidden = true; return true; })()`)
	prompt := f.event(session.KindMessage, "alice", session.MessageData{Text: "deploy"})
	f.event(session.KindTurnStarted, "alice", session.TurnStartedData{Turn: 1, PromptSeq: prompt})
	f.event(session.KindApprovalRequested, "system", session.ApprovalRequestedData{Turn: 1, ID: "p1", Summary: "Deploy to production?"})
	alice.waitJS("the approval notification", `window.__notes.some((n) => n.startsWith('Approval needed: Deploy to production?'))`)
	alice.waitJS("the tab title", `document.title.startsWith('(!) Approval needed')`)
	f.event(session.KindApprovalResolved, "alice", session.ApprovalResolvedData{Turn: 1, ID: "p1", Allow: true})
	f.event(session.KindTurnFinished, "system", session.TurnFinishedData{Turn: 1, Status: session.TurnOK, DurationMS: 10})
	alice.waitJS("the finished notification", `window.__notes.some((n) => n.startsWith('Turn 1 finished'))`)
	alice.waitJS("the tab title", `document.title.startsWith('✓ Turn 1 done')`)
	// Seen again: the title calms down.
	eval[bool](alice, `(() => { window.__hidden = false; document.dispatchEvent(new Event('visibilitychange')); return true; })()`)
	alice.waitJS("the plain title", `document.title === 'Needs you · Atrium'`)
}
