package browser

import (
	"crypto/rand"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/auth"
)

// TestBrowser_OIDCLogin signs in through a real OIDC provider (mockoidc,
// which approves at once): the sign-in page offers the provider, the code
// flow runs in the browser and lands on the deep link it started from, the
// page works as the provider's user (creating a session through the UI),
// and signing out returns to the sign-in page.
func TestBrowser_OIDCLogin(t *testing.T) {
	t.Parallel()
	m, err := mockoidc.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ln, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	key := make([]byte, 32)
	rand.Read(key)
	st := startStack(t, func(c *server.Config) {
		c.AuthMode = server.AuthOIDC
		c.OIDC = auth.OIDCConfig{Issuer: m.Issuer(), ClientID: m.ClientID, ClientSecret: m.ClientSecret,
			Scopes: []string{"openid", "email", "profile"}, DefaultTenant: "acme", CookieKey: key}
	})
	m.QueueUser(&mockoidc.MockUser{Subject: "u-olga", Email: "olga@example.com", EmailVerified: true})

	tb := &tab{t: t, user: "olga", base: st.base}
	ctx, cancel := chromedp.NewContext(chrome(t), chromedp.WithNewBrowserContext(), chromedp.WithListener(tb.listen))
	t.Cleanup(cancel)
	tb.ctx = ctx
	tb.attach()

	tb.goTo("/?q=deep")
	tb.waitJS("the sign-in button", `document.querySelector('#signin') !== null`)
	issuer, _ := url.Parse(m.Issuer())
	if got := eval[string](tb, `document.querySelector('#signin').textContent`); !strings.Contains(got, issuer.Host) {
		t.Fatalf("sign-in button says %q, want the provider %s", got, issuer.Host)
	}
	tb.click("#signin")
	tb.waitJS("the sessions page after the code flow", `document.querySelector('#sessions-h') !== null`)
	if got := eval[string](tb, `location.pathname + location.search`); got != "/?q=deep" {
		t.Fatalf("landed on %q, want the page the login started from", got)
	}
	tb.waitJS("the user's name in the header", `document.querySelector('#account').textContent.includes('olga@example.com')`)

	tb.typeInto("#new-title", "made after an OIDC login")
	tb.click("#create")
	tb.waitJS("the new session's page", `location.pathname.startsWith('/s/')`)
	tb.waitJS("the session's title", `document.querySelector('#session-title')?.textContent === 'made after an OIDC login'`)

	tb.click(".signout")
	tb.waitJS("the sign-in page after signing out", `document.querySelector('#signin') !== null`)

	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, p := range tb.problems {
		// The code flow visits the provider: that request is the point.
		if strings.HasPrefix(p, "request to another origin: "+m.Issuer()) {
			continue
		}
		t.Errorf("page: %s", p)
	}
}
