package browser

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestBrowser_Workspace: the workspace panel of a session page lists the
// files a turn wrote (hostile names as text), opens a file, downloads a
// file's bytes and a folder as tar.gz, shows a turn's changes as a diff,
// takes an upload dropped on it, and forks the session from a turn into a
// new session that has the files. Screenshots of the panel at desktop and
// phone sizes.
func TestBrowser_Workspace(t *testing.T) {
	t.Parallel()
	st := startStack(t)
	s := st.create("alice", "Workspace tour", "shell")
	st.prompt("alice", s.ID, `mkdir -p docs src && printf 'hello\nworld\n' > docs/hello.txt && printf 'package main\n' > src/main.go && printf 'x' > '<img src=x onerror=alert(1)>.txt'`)
	alice := st.open("alice")
	alice.openSession(s.ID)
	alice.waitRow("turn 1 finished", ".k-turn_finished", "Turn 1 finished")

	alice.click("#files-open")
	alice.waitJS("the file tree", `document.querySelector('#ws-files li[data-path="docs"]')`)
	if got := eval[string](alice, `[...document.querySelectorAll('#ws-files .fname')].map((b) => b.textContent).join('|')`); got != "docs/|src/|<img src=x onerror=alert(1)>.txt" {
		t.Fatalf("file tree %q", got)
	}
	if eval[bool](alice, `!!document.querySelector('#workspace img')`) {
		t.Fatal("a file name became markup")
	}
	alice.click(`#ws-files li[data-path="docs"] .fname`)
	alice.waitJS("the docs folder", `document.querySelector('#ws-files li[data-path="docs/hello.txt"]')`)
	alice.click(`#ws-files li[data-path="docs/hello.txt"] .fname`)
	alice.waitRow("the file's text", "#ws-file", "hello\nworld")

	// A download's bytes, and a folder's archive.
	got := eval[string](alice, `fetch(document.querySelector('#ws-download').href).then((r) => r.text())`)
	if got != "hello\nworld\n" {
		t.Fatalf("downloaded %q", got)
	}
	alice.click(`#workspace .crumbs button`) // back to the workspace root
	alice.waitJS("the root listing", `document.querySelector('#ws-files li[data-path="src"]')`)
	magic := eval[[]int](alice, `fetch(document.querySelector('#ws-archive').href).then((r) => r.arrayBuffer()).then((b) => [...new Uint8Array(b).slice(0, 2)])`)
	if len(magic) != 2 || magic[0] != 0x1f || magic[1] != 0x8b {
		t.Fatalf("the folder's download starts with %v, want gzip's 1f 8b", magic)
	}

	// The turn's changes, as diffs.
	alice.click(`.k-turn_finished button[data-changes="1"]`)
	alice.waitJS("the changes of turn 1", `document.querySelector('#ws-changes .change[data-path="docs/hello.txt"]')`)
	if got := eval[string](alice, `document.querySelector('#ws-changes .change[data-path="docs/hello.txt"] .badge').textContent`); got != "added" {
		t.Fatalf("docs/hello.txt is %q, want added", got)
	}
	alice.waitRow("the diff", `#ws-changes .change[data-path="docs/hello.txt"] .ul.add`, "+hello")

	// An upload dropped on the panel.
	alice.click(`#workspace .crumbs button`)
	alice.waitJS("the root listing", `document.querySelector('#ws-files li[data-path="src"]')`)
	eval[bool](alice, `(() => {
		const dt = new DataTransfer();
		dt.items.add(new File(['uploaded bytes'], 'notes.txt', { type: 'text/plain' }));
		document.querySelector('#workspace').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
		return true;
	})()`)
	alice.waitJS("the uploaded file", `document.querySelector('#ws-files li[data-path="notes.txt"]')`)
	if b := st.fileBytes("alice", s.ID, "notes.txt"); b != "uploaded bytes" {
		t.Fatalf("the uploaded file holds %q", b)
	}

	dir := screenshotDir(t)
	for _, theme := range []string{"light", "dark"} {
		alice.screenshot(dir, "workspace-desktop-"+theme, 1280, 800, theme, false)
		alice.screenshot(dir, "workspace-phone-"+theme, 390, 844, theme, true)
		alice.resetView()
	}
	alice.checkA11y("the workspace panel")

	// Fork from turn 1: a new session with the files as of then.
	alice.click(`#workspace .close`)
	alice.click(`.k-turn_finished button[data-fork]`)
	alice.waitJS("the fork's page", fmt.Sprintf(`location.pathname !== '/s/%s' && document.querySelector('#session-title').textContent.includes('(fork at turn 1)')`, s.ID))
	fork := alice.sessionID()
	alice.waitLive()
	alice.click("#files-open")
	alice.waitJS("the fork's files", `document.querySelector('#ws-files li[data-path="docs"]')`)
	if eval[bool](alice, `!!document.querySelector('#ws-files li[data-path="notes.txt"]')`) {
		t.Fatal("the fork at turn 1 has the file uploaded after it")
	}
	if b := st.fileBytes("alice", fork, "docs/hello.txt"); b != "hello\nworld\n" {
		t.Fatalf("the fork's docs/hello.txt holds %q", b)
	}
}

// fileBytes reads a workspace file over REST.
func (st *stack) fileBytes(user string, id any, path string) string {
	st.t.Helper()
	req, err := http.NewRequest("GET", fmt.Sprintf("%s/v1/sessions/%v/files/%s", st.srv.URL(), id, path), nil)
	if err != nil {
		st.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer dev:"+user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		st.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		st.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return string(b)
}
