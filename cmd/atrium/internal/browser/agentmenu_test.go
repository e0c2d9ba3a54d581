package browser

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

// TestBrowser_AgentMenu: the new-session form lists the agents installed
// on the node (GET /v1/agents) besides the shell harness, which stays the
// default, and creating a session with one posts {"agent":NAME}: after the
// agent is removed from the node, the node's refusal naming `atrium agents
// install claude` is shown.
func TestBrowser_AgentMenu(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// An installed claude is its program in <dir>/claude/<version>.
	bin := filepath.Join(dir, "claude", "0.23.1", "node_modules", ".bin", "claude-agent-acp")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	st := startStack(t, func(c *server.Config) { c.AgentsDir = dir })
	alice := st.open("alice")
	alice.waitJS("claude in the harness menu", `document.querySelector('#new-harness option[value="agent:claude"]')?.textContent === 'claude 0.23.1'`)
	if got := eval[string](alice, `document.querySelector('#new-harness').value`); got != "shell" {
		t.Fatalf("default harness %q, want shell", got)
	}
	alice.checkA11y("the sessions page with agents")

	// Picking the agent shows its permission mode; the session is created
	// with both.
	if !eval[bool](alice, `document.querySelector('#new-permission').closest('.field').hidden`) {
		t.Fatal("the permission mode shows for the shell harness")
	}
	eval[bool](alice, `(() => { const f = window.fetch; window.posted = []; window.fetch = (u, o) => { if (o && o.method === 'POST') window.posted.push(o.body); return f(u, o); }; return true; })()`)
	alice.do(chromedp.SetValue(chromedp.CSS("#new-harness"), "agent:claude"))
	eval[bool](alice, `document.querySelector('#new-harness').dispatchEvent(new Event('change'))`)
	alice.waitJS("the permission mode", `!document.querySelector('#new-permission').closest('.field').hidden`)
	alice.do(chromedp.SetValue(chromedp.CSS("#new-permission"), "auto"))
	alice.typeInto("#new-title", "claude on auto")
	alice.click("#create")
	alice.waitLive()
	if got := eval[string](alice, `window.posted ? window.posted.join() : ''`); got != `{"title":"claude on auto","agent":"claude","settings":{"permission_mode":"auto"}}` {
		t.Fatalf("POST body %s", got)
	}
	alice.goTo("/")
	alice.waitJS("the agent menu again", `!!document.querySelector('#new-harness option[value="agent:claude"]')`)

	if err := os.RemoveAll(filepath.Join(dir, "claude")); err != nil {
		t.Fatal(err)
	}
	alice.typeInto("#new-title", "with claude")
	alice.do(chromedp.SetValue(chromedp.CSS("#new-harness"), "agent:claude"))
	alice.click("#create")
	alice.waitJS("the refusal", `document.querySelector('#create-error').textContent.includes('atrium agents install claude')`)
	if got := eval[string](alice, `location.pathname`); strings.HasPrefix(got, "/s/") {
		t.Fatalf("navigated to %s although the agent is not installed", got)
	}
}
