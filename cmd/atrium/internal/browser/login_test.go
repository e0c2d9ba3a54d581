package browser

import (
	"context"
	"net/url"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestBrowser_Login: a browser with no login cookie that follows a deep link
// gets the sign-in page; signing in with the dev identity lands on the page
// it asked for. Signing out forgets the cookie.
func TestBrowser_Login(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("erin", "erin's session", "shell")

	tb := &tab{t: t, user: "dora", base: st.base}
	ctx, cancel := chromedp.NewContext(chrome(t), chromedp.WithNewBrowserContext(), chromedp.WithListener(tb.listen))
	t.Cleanup(cancel)
	tb.ctx = ctx
	tb.attach()

	tb.goTo("/s/" + string(s.ID))
	tb.waitJS("the sign-in page", `document.querySelector('#login')`)
	if got := eval[string](tb, `document.title`); got != "Sign in · Atrium" {
		t.Fatalf("title %q on the sign-in page", got)
	}
	tb.checkA11y("the sign-in page")
	if focused := eval[string](tb, `document.activeElement.id`); focused != "user" {
		t.Fatalf("focus is on %q, want the user field", focused)
	}
	tb.typeInto("#user", "dora")
	tb.enter()
	// dora is not a member of erin's session: she lands on it and is told so.
	tb.waitJS("the session page", `location.pathname === `+jsString("/s/"+string(s.ID)))
	tb.waitJS("the no-access banner", `document.querySelector('.banner:not([hidden])')?.textContent.includes('no access')`)

	// Erin shares it; dora reloads and sees it.
	st.api("erin", 200, "PUT", "/v1/sessions/"+string(s.ID)+"/members/dora", map[string]any{"role": "viewer"}, nil)
	tb.do(chromedp.Reload())
	tb.waitLive()
	tb.waitJS("the session's title", `document.querySelector('#session-title').textContent === "erin's session"`)

	// Sign out.
	tb.click(".signout")
	tb.waitJS("the sign-in page after signing out", `document.querySelector('#login')`)
	_ = url.QueryEscape
	_ = context.Background
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, p := range tb.problems {
		t.Errorf("page: %s", p)
	}
}
