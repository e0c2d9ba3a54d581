package browser

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

// TestBrowser_DevSignInSuggestsCLIUser is issue 23's "the CLI and the
// browser are the same dev user by default": a browser that never signed in
// is offered the user `atrium dev` was told the CLI acts as, so what that
// CLI makes is in its list.
func TestBrowser_DevSignInSuggestsCLIUser(t *testing.T) {
	t.Parallel()
	st := startStack(t, func(c *server.Config) { c.DevUser = "carol" })
	st.create("carol", "made with the CLI", "shell")

	tb := &tab{t: t, user: "carol", base: st.base}
	ctx, cancel := chromedp.NewContext(chrome(t), chromedp.WithNewBrowserContext(), chromedp.WithListener(tb.listen))
	t.Cleanup(cancel)
	tb.ctx = ctx
	tb.attach()

	tb.goTo("/")
	tb.waitJS("the sign-in form, suggesting carol", `document.querySelector('#user')?.value === 'carol'`)
	tb.click("#login button[type=submit]")
	tb.waitJS("carol's session in the list", `!!document.body && document.body.textContent.includes('made with the CLI')`)
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, p := range tb.problems {
		t.Errorf("page: %s", p)
	}
}
