package browser

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestBrowser_WorkspaceAsleep: the workspace panel works while the session
// is hibernated and its sandbox asleep — the tree, a file's text and its
// download come from the workspace's saved copy, and reading them wakes no
// sandbox.
func TestBrowser_WorkspaceAsleep(t *testing.T) {
	t.Parallel()
	st := startStack(t, func(c *server.Config) {
		// The sandbox sleeps first (its sleeping event is written while the
		// session is awake), then the session hibernates.
		c.Sandbox.SleepAfter = 300 * time.Millisecond
		c.HibernateAfter = 3 * time.Second
	})
	s := st.create("alice", "Asleep", "shell")
	st.prompt("alice", s.ID, `mkdir -p notes && printf 'kept while asleep\n' > notes/a.txt`)
	slept := st.waitEvent("alice", s.ID, "the sandbox asleep", func(ev event) bool {
		return ev.Kind == session.KindSandbox && (ev.field("state") == "sleeping" || ev.field("state") == "stopped")
	})
	deadline := time.Now().Add(waitLong)
	for {
		var info session.Session
		st.api("alice", http.StatusOK, "GET", "/v1/sessions/"+string(s.ID), nil, &info)
		if info.State == session.StateHibernated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session is %s after %v, want hibernated", info.State, waitLong)
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}

	alice := st.open("alice")
	alice.openSession(s.ID)
	alice.click("#files-open")
	alice.waitJS("the file tree", `document.querySelector('#ws-files li[data-path="notes"]')`)
	alice.click(`#ws-files li[data-path="notes"] .fname`)
	alice.waitJS("the notes folder", `document.querySelector('#ws-files li[data-path="notes/a.txt"]')`)
	alice.click(`#ws-files li[data-path="notes/a.txt"] .fname`)
	alice.waitRow("the file's text", "#ws-file", "kept while asleep")
	if got := eval[string](alice, `fetch(document.querySelector('#ws-download').href).then((r) => r.text())`); got != "kept while asleep\n" {
		t.Fatalf("downloaded %q", got)
	}
	for _, ev := range st.history("alice", s.ID, slept.Seq) {
		if ev.Kind == session.KindSandbox && !strings.Contains(string(ev.Data), "sleeping") && !strings.Contains(string(ev.Data), "stopped") {
			t.Fatalf("reading the workspace woke the sandbox: event %d %s", ev.Seq, ev.Data)
		}
	}
}
