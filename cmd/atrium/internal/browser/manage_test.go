package browser

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// hostileText is text that would be markup, a script, a javascript: link or a
// terminal escape if any of the page's new surfaces treated it as anything
// but text.
const hostileText = `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><a href="javascript:window.__pwned=3">click</a>` + " \x1b[31mred\x1b[0m"

// noMarkup is JavaScript that returns "" unless hostileText text became markup
// in root (a selector), or ran.
func noMarkup(root string) string {
	return fmt.Sprintf(`(() => {
		const r = document.querySelector(%s);
		if (!r) return 'no ' + %s;
		if (window.__pwned) return 'hostileText script ran: ' + window.__pwned;
		if (r.querySelector('img[src="x"], script, a[href^="javascript:"]')) return 'hostileText markup became elements: ' + r.innerHTML.slice(0, 300);
		return '';
	})()`, jsString(root), jsString(root))
}

// TestBrowser_Typing: a driver typing a prompt shows as typing on the other
// people's pages ("bob is typing…" above the prompt box, a pen beside bob
// in presence), never on their own page; emptying the box or sending the
// prompt ends it at once (the server's typing TTL is 6 s).
func TestBrowser_Typing(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "typing", "shell")
	st.api("alice", http.StatusOK, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "driver"}, nil)
	st.api("alice", http.StatusOK, "PUT", "/v1/sessions/"+string(s.ID)+"/members/carol", map[string]any{"role": "viewer"}, nil)
	alice := st.open("alice")
	alice.openSession(s.ID)
	bob := st.open("bob")
	bob.openSession(s.ID)
	carol := st.open("carol")
	carol.openSession(s.ID)
	alice.waitJS("bob's presence", `document.querySelector('#presence li[data-user="bob"]')`)

	bob.typeInto("#prompt", "echo hello from bob")
	for _, tb := range []*tab{alice, carol} {
		tb.waitJS("bob typing, above the prompt box", `(() => { const e = document.querySelector('#typing'); return !e.hidden && e.textContent === 'bob is typing…'; })()`)
		tb.waitJS("bob typing, in presence", `document.querySelector('#presence li[data-user="bob"].typing .pen') !== null`)
	}
	dir := screenshotDir(t)
	alice.screenshot(dir, "typing-desktop-light", 1280, 800, "light", false)
	alice.screenshot(dir, "typing-phone-dark", 390, 844, "dark", true)
	alice.resetView()
	if got := eval[string](bob, `document.querySelector('#typing').hidden ? '' : document.querySelector('#typing').textContent`); got != "" {
		t.Fatalf("bob's own page says %q: nobody else is typing", got)
	}
	if eval[bool](carol, `document.querySelector('#prompt') !== null && !document.querySelector('#composer').hidden`) {
		t.Fatal("carol, a viewer, has a prompt box")
	}
	// Emptying the box says he stopped, at once.
	eval[bool](bob, `(() => { const p = document.querySelector('#prompt'); p.value = ''; p.dispatchEvent(new Event('input')); return true; })()`)
	alice.waitJS("bob's typing ended by emptying the box", `document.querySelector('#typing').hidden`)
	// Typing again right after the stop shows again: the page's first
	// frame after a stop is sent at once, and the server takes a start
	// after a stop whenever it comes (its rate limit holds while typing).
	bob.typeInto("#prompt", "echo hello from bob")
	alice.waitJS("bob typing again", `!document.querySelector('#typing').hidden`)
	bob.enter()
	alice.waitJS("bob's typing ended by his prompt", `document.querySelector('#typing').hidden && !document.querySelector('#presence li[data-user="bob"].typing')`)
	alice.waitRow("bob's prompt", "#rows .ev", "echo hello from bob")
}

// TestBrowser_Manage: the owner manages the session from its page: renames
// it, changes a setting (a bad value gets the server's precise error and
// the form keeps it), sets a secret whose value never shows again, creates,
// pauses and deletes a schedule of the session (a bad cron is refused in
// words), and sees that the server lists no repository task of it. Hostile
// text (HTML, scripts, javascript: links, ANSI, a huge line) in titles,
// schedule prompts and secret names stays text; members and delete are one
// click away (the Share dialog). A driver has no Manage button. Screenshots of the dialog at desktop and phone sizes.
func TestBrowser_Manage(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	dir := screenshotDir(t)
	s := st.create("alice", "Nightly report", "shell")
	st.api("alice", http.StatusOK, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "driver"}, nil)
	base := "/v1/sessions/" + string(s.ID)

	bob := st.open("bob")
	bob.openSession(s.ID)
	bob.waitLive()
	if !eval[bool](bob, `document.querySelector('#manage-open').hidden`) {
		t.Fatal("bob, a driver, has the Manage button")
	}

	alice := st.open("alice")
	alice.openSession(s.ID)
	alice.waitLive()
	alice.waitJS("the sandbox in the header", `/^(Sandbox \S+|No sandbox yet$)/.test(document.querySelector('.pill.sandbox').textContent)`)
	alice.click("#manage-open")
	alice.waitJS("the Manage dialog", `document.querySelector('#manage').open`)
	alice.checkA11y("the Manage dialog")

	t.Run("rename, hostileText title stays text", func(t *testing.T) {
		title := "Report " + hostileText
		eval[bool](alice, `(() => { const i = document.querySelector('#manage-title-input'); i.value = `+jsString(title)+`; return true; })()`)
		alice.click("#manage-title button[type=submit]")
		// The escape shows as a symbol (U+241B), not as an invisible control.
		alice.waitJS("the new title in the header", `document.querySelector('#session-title').textContent === `+jsString(strings.ReplaceAll(title, "\x1b", "␛")))
		if msg := eval[string](alice, noMarkup("#session-title")); msg != "" {
			t.Fatal(msg)
		}
		var got session.Session
		st.api("alice", http.StatusOK, "GET", base, nil, &got)
		if got.Title != title {
			t.Fatalf("server has title %q, want %q", got.Title, title)
		}
		// Too long: refused before it is sent, the field keeps it.
		long := strings.Repeat("x", 300)
		eval[bool](alice, `(() => { document.querySelector('#manage-title-input').value = `+jsString(long)+`; return true; })()`)
		alice.click("#manage-title button[type=submit]")
		alice.waitJS("the title's error", `document.querySelector('#manage-title-error').textContent.includes('256 bytes')`)
		if v := eval[string](alice, `document.querySelector('#manage-title-input').value`); v != long {
			t.Fatalf("the title field lost what was typed: %d characters left", len(v))
		}
	})

	t.Run("settings: bad value refused in words, good value saved", func(t *testing.T) {
		if !eval[bool](alice, `!!document.querySelector('#manage-settings-fields [data-key="turn_timeout"]') && !!document.querySelector('#manage-settings-fields [data-key="permission_mode"]')`) {
			t.Fatal("the settings form lacks turn_timeout or permission_mode")
		}
		set := `(() => { const i = document.querySelector('#manage-settings-fields [data-key="turn_timeout"]'); i.value = %s; return true; })()`
		eval[bool](alice, fmt.Sprintf(set, jsString("forever")))
		alice.click("#manage-settings button[type=submit]")
		alice.waitJS("the settings error", `(() => { const e = document.querySelector('#manage-settings-error'); return !e.hidden && /turn_timeout/.test(e.textContent); })()`)
		if v := eval[string](alice, `document.querySelector('#manage-settings-fields [data-key="turn_timeout"]').value`); v != "forever" {
			t.Fatalf("the field holds %q after the error, want what was typed", v)
		}
		eval[bool](alice, fmt.Sprintf(set, jsString("2m")))
		alice.click("#manage-settings button[type=submit]")
		alice.waitRow("the saved toast", "#toasts .toast", "Saved turn_timeout")
		// The field shows what the server now reports (a Go duration).
		alice.waitJS("the server's turn_timeout", `document.querySelector('#manage-settings-fields [data-key="turn_timeout"]').value === '2m0s'`)
		if e := eval[string](alice, `document.querySelector('#manage-settings-error').hidden ? '' : document.querySelector('#manage-settings-error').textContent`); e != "" {
			t.Fatalf("settings error after a good value: %s", e)
		}
	})

	t.Run("secrets: names only, value never shown", func(t *testing.T) {
		const value = "s3cr3t-value-never-shown"
		alice.typeInto("#manage-secret-name", "API_KEY")
		alice.typeInto("#manage-secret-value", value)
		alice.click("#manage-secret-add button[type=submit]")
		alice.waitJS("the secret listed", `document.querySelector('#manage-secrets li[data-secret="API_KEY"]') !== null`)
		if eval[bool](alice, `document.documentElement.outerHTML.includes(`+jsString(value)+`) || document.querySelector('#manage-secret-value').value !== ''`) {
			t.Fatal("the secret's value is in the page after it was set")
		}
		var list struct {
			Secrets []struct{ Name string } `json:"secrets"`
		}
		st.api("alice", http.StatusOK, "GET", base+"/secrets", nil, &list)
		if len(list.Secrets) != 1 || list.Secrets[0].Name != "API_KEY" {
			t.Fatalf("server's secrets %+v, want API_KEY", list.Secrets)
		}
		// A hostileText name: the server's refusal is shown as text, the name kept.
		eval[bool](alice, `(() => { document.querySelector('#manage-secret-name').value = `+jsString(hostileText)+`; document.querySelector('#manage-secret-value').value = 'v'; return true; })()`)
		alice.click("#manage-secret-add button[type=submit]")
		alice.waitJS("the secret's error", `!document.querySelector('#manage-secrets-error').hidden && document.querySelector('#manage-secrets-error').textContent !== ''`)
		if msg := eval[string](alice, noMarkup("#manage")); msg != "" {
			t.Fatal(msg)
		}
		if v := eval[string](alice, `document.querySelector('#manage-secret-name').value`); v != hostileText {
			t.Fatalf("the name field holds %q after the error", v)
		}
		alice.click(`#manage-secrets li[data-secret="API_KEY"] button`)
		alice.waitJS("the secret gone", `document.querySelector('#manage-secrets li[data-secret="API_KEY"]') === null`)
		st.api("alice", http.StatusOK, "GET", base+"/secrets", nil, &list)
		if len(list.Secrets) != 0 {
			t.Fatalf("server still has secrets %+v", list.Secrets)
		}
	})

	t.Run("schedules: create, pause, delete; bad cron refused", func(t *testing.T) {
		prompt := hostileText + " " + strings.Repeat("long-line-", 2000)
		alice.typeInto("#manage-cron", "not a cron")
		eval[bool](alice, `(() => { document.querySelector('#manage-tz').value = 'UTC'; document.querySelector('#manage-sched-prompt').value = `+jsString(prompt)+`; return true; })()`)
		alice.click("#manage-schedule-add button[type=submit]")
		alice.waitJS("the cron error", `!document.querySelector('#manage-schedules-error').hidden && /cron/i.test(document.querySelector('#manage-schedules-error').textContent)`)
		if v := eval[string](alice, `document.querySelector('#manage-cron').value`); v != "not a cron" {
			t.Fatalf("the cron field holds %q after the error", v)
		}
		eval[bool](alice, `(() => { document.querySelector('#manage-cron').value = '0 9 * * 1-5'; return true; })()`)
		alice.click("#manage-schedule-add button[type=submit]")
		alice.waitJS("the schedule listed", `document.querySelector('#manage-schedules li[data-schedule]') !== null`)
		if msg := eval[string](alice, noMarkup("#manage-schedules")); msg != "" {
			t.Fatal(msg)
		}
		shown := eval[string](alice, `document.querySelector('#manage-schedules .sched-prompt').textContent`)
		if !strings.HasPrefix(shown, `<img src=x onerror=`) || !strings.Contains(shown, "␛[31mred") || !strings.HasSuffix(shown, "…") {
			t.Fatalf("the schedule's prompt shows as %.200q, want the text with the escape visible, clipped", shown)
		}
		// The phone layout must not scroll sideways for the huge line.
		var list struct {
			Schedules []struct {
				ID      string     `json:"id"`
				Session session.ID `json:"session"`
				Prompt  string     `json:"prompt"`
				Paused  bool       `json:"paused"`
			} `json:"schedules"`
		}
		st.api("alice", http.StatusOK, "GET", "/v1/schedules", nil, &list)
		if len(list.Schedules) != 1 || list.Schedules[0].Session != s.ID || list.Schedules[0].Prompt != prompt {
			t.Fatalf("server's schedules %+v, want one of session %s with the prompt", list.Schedules, s.ID)
		}
		id := list.Schedules[0].ID
		// The light ones show the dialog's top (title, settings), the dark
		// ones its end (secrets, schedules, task).
		scroll := func(top bool) {
			eval[bool](alice, fmt.Sprintf(`(() => { const d = document.querySelector('#manage'); d.scrollTop = %v ? 0 : d.scrollHeight; return true; })()`, top))
		}
		scroll(true)
		alice.screenshot(dir, "manage-desktop-light", 1280, 900, "light", false)
		scroll(false)
		alice.screenshot(dir, "manage-desktop-dark", 1280, 900, "dark", false)
		scroll(true)
		alice.screenshot(dir, "manage-phone-light", 390, 844, "light", true)
		scroll(false)
		if w := eval[int](alice, `document.querySelector('#manage').scrollWidth - document.querySelector('#manage').clientWidth`); w > 1 {
			t.Fatalf("the Manage dialog scrolls sideways by %d px on a phone", w)
		}
		alice.screenshot(dir, "manage-phone-dark", 390, 844, "dark", true)
		alice.resetView()

		alice.click(`#manage-schedules li[data-schedule="` + id + `"] button`)
		alice.waitJS("the schedule paused", `document.querySelector('#manage-schedules li[data-schedule] button').textContent === 'Resume'`)
		st.api("alice", http.StatusOK, "GET", "/v1/schedules", nil, &list)
		if len(list.Schedules) != 1 || !list.Schedules[0].Paused {
			t.Fatalf("server's schedule %+v, want paused", list.Schedules)
		}
		alice.click(`#manage-schedules li[data-schedule="` + id + `"] button.danger`)
		alice.waitJS("the schedule gone", `document.querySelector('#manage-schedules li[data-schedule]') === null`)
		st.api("alice", http.StatusOK, "GET", "/v1/schedules", nil, &list)
		if len(list.Schedules) != 0 {
			t.Fatalf("server still has schedules %+v", list.Schedules)
		}
	})

	t.Run("tasks", func(t *testing.T) {
		alice.waitJS("the tasks note", `document.querySelector('#manage-tasks-note').textContent !== ''`)
	})

	t.Run("members and delete are one click away", func(t *testing.T) {
		alice.click("#manage-members")
		alice.waitJS("the members' dialog instead", `!document.querySelector('#manage').open && document.querySelector('#share').open`)
		alice.waitJS("bob listed", `document.querySelector('#members li[data-user="bob"]') !== null`)
		alice.key("\x1b") // Escape closes the dialog
		alice.waitJS("the dialog closed", `!document.querySelector('#share').open`)
	})
}
