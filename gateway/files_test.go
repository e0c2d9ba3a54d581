package gateway_test

// End-to-end tests of the workspace routes: a real node (SQLite histories,
// bubblewrap sandboxes, workspaces saved to a directory object store)
// behind the gateway.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/nats-io/nats-server/v2/server"
)

// filesEnv is a real node with a workspace store, and a gateway.
type filesEnv struct {
	*env
	store blob.Store
}

func newFilesEnv(t *testing.T, tune func(*actor.Config)) filesEnv {
	t.Helper()
	ns := startNATS(t)
	store := &blob.Dir{Path: t.TempDir()}
	startFilesNode(t, ns, store, tune)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	return filesEnv{env: e, store: store}
}

func startFilesNode(t testing.TB, ns *server.Server, store blob.Store, tune func(*actor.Config)) *actor.Host {
	t.Helper()
	return startNodeWith(t, ns, func(c *actor.Config) {
		c.SecretKeys = nil
		c.Store = store
		c.WorkspaceOf = func(sb compute.Sandbox) (mount.Workspace, error) {
			d := sb.(*local.Sandbox).Workspace()
			d.Blob = store
			return d, nil
		}
		c.Files = actor.FilesConfig{TempDir: t.TempDir()}
		if tune != nil {
			tune(c)
		}
	})
}

func filesPath(id session.ID, p string) string { return "/v1/sessions/" + string(id) + "/files/" + p }

// events returns all of id's events, decoded.
func (e filesEnv) events(id session.ID, user string) []session.Event {
	e.t.Helper()
	code, body := e.call("GET", "/v1/sessions/"+string(id)+"/events?limit=1000", user, nil)
	var page struct{ Events []session.Event }
	if code != 200 || json.Unmarshal(body, &page) != nil {
		e.t.Fatalf("events: %d %s", code, body)
	}
	return page.Events
}

// prompt sends text and waits for its turn to finish; it returns the turn
// number and its stdout.
func (e filesEnv) prompt(id session.ID, user, text string) (int64, string) {
	e.t.Helper()
	code, body := e.call("POST", "/v1/sessions/"+string(id)+"/messages", user, map[string]string{"text": text})
	if code != http.StatusAccepted {
		e.t.Fatalf("prompt: %d %s", code, body)
	}
	var ack struct{ Seq session.Seq }
	json.Unmarshal(body, &ack)
	return e.waitTurn(id, user, ack.Seq)
}

// waitTurn waits for the turn of the prompt at seq to finish.
func (e filesEnv) waitTurn(id session.ID, user string, seq session.Seq) (int64, string) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var turn int64
		var out strings.Builder
		for _, ev := range e.events(id, user) {
			switch ev.Kind {
			case session.KindTurnStarted:
				var d session.TurnStartedData
				json.Unmarshal(ev.Data, &d)
				if d.PromptSeq == seq {
					turn = d.Turn
				}
			case session.KindOutput:
				var d session.OutputData
				json.Unmarshal(ev.Data, &d)
				if d.Turn == turn && turn > 0 && d.Stream == "stdout" {
					out.WriteString(d.Text)
				}
			case session.KindTurnFinished:
				var d session.TurnFinishedData
				json.Unmarshal(ev.Data, &d)
				if turn > 0 && d.Turn == turn {
					return turn, out.String()
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("turn of prompt %d did not finish", seq)
	return 0, ""
}

func (e filesEnv) put(id session.ID, user, p string, body []byte) (int, []byte) {
	e.t.Helper()
	return e.call("PUT", filesPath(id, p), user, body)
}

func (e filesEnv) get(id session.ID, user, p string) (int, []byte) {
	e.t.Helper()
	return e.call("GET", filesPath(id, p), user, nil)
}

func (e filesEnv) mustGet(id session.ID, user, p, want string) {
	e.t.Helper()
	code, body := e.get(id, user, p)
	if code != 200 || string(body) != want {
		e.t.Fatalf("GET %s: %d %q, want %q", p, code, body, want)
	}
}

func (e filesEnv) list(id session.ID, user, dir string, recursive bool) []session.FileEntry {
	e.t.Helper()
	q := "?path=" + url.QueryEscape(dir)
	if recursive {
		q += "&recursive=1"
	}
	code, body := e.call("GET", "/v1/sessions/"+string(id)+"/files"+q, user, nil)
	var l session.FileListing
	if code != 200 || json.Unmarshal(body, &l) != nil {
		e.t.Fatalf("list %q: %d %s", dir, code, body)
	}
	return l.Entries
}

func (e filesEnv) changes(id session.ID, user string, turn int64) []session.FileChange {
	e.t.Helper()
	code, body := e.call("GET", "/v1/sessions/"+string(id)+"/turns/"+strconv.FormatInt(turn, 10)+"/changes", user, nil)
	var c session.TurnChanges
	if code != 200 || json.Unmarshal(body, &c) != nil {
		e.t.Fatalf("changes of turn %d: %d %s", turn, code, body)
	}
	return c.Files
}

func wantCode(t *testing.T, what string, code int, body []byte, status int, c session.Code) {
	t.Helper()
	if code != status {
		t.Fatalf("%s: %d %s, want %d", what, code, body, status)
	}
	if got := errCode(t, body); got != c {
		t.Fatalf("%s: code %s, want %s (%s)", what, got, c, body)
	}
}

func TestFiles_WriteReadTurnChangesFork(t *testing.T) {
	e := newFilesEnv(t, func(c *actor.Config) { c.Files.MaxFileBytes, c.Files.Quota = 1<<20, 1572864 })
	s := e.create("alice", "files")
	e.member(s.ID, "alice", "bob", session.RoleViewer)

	// A write before any sandbox exists goes to the saved workspace.
	if code, body := e.put(s.ID, "alice", "docs/hello.txt", []byte("hello\n")); code != http.StatusNoContent {
		t.Fatalf("put: %d %s", code, body)
	}
	e.mustGet(s.ID, "bob", "docs/hello.txt", "hello\n")
	if ls := e.list(s.ID, "bob", "", false); len(ls) != 1 || ls[0].Path != "docs" || ls[0].Type != "dir" {
		t.Fatalf("list root: %+v", ls)
	}
	if ls := e.list(s.ID, "bob", "docs", false); len(ls) != 1 || ls[0].Path != "docs/hello.txt" || ls[0].Size != 6 || ls[0].Mode != "0644" {
		t.Fatalf("list docs: %+v", ls)
	}
	var changed *session.FilesChangedData
	var writeSeq session.Seq
	for _, ev := range e.events(s.ID, "bob") {
		if ev.Kind == session.KindFilesChanged {
			changed = new(session.FilesChangedData)
			json.Unmarshal(ev.Data, changed)
			writeSeq = ev.Seq
		}
	}
	if changed == nil || changed.By != "alice" || len(changed.Paths) != 1 || changed.Paths[0] != "docs/hello.txt" {
		t.Fatalf("files_changed: %+v", changed)
	}

	// The turn sees the file; its changes come from the manifests.
	turn, out := e.prompt(s.ID, "alice", "cat docs/hello.txt > copy.txt; echo more >> docs/hello.txt; ln -s /etc out; echo done")
	if out != "done\n" {
		t.Fatalf("turn 1 output %q", out)
	}
	e.mustGet(s.ID, "bob", "copy.txt", "hello\n")
	ch := e.changes(s.ID, "bob", turn)
	byPath := map[string]session.FileChange{}
	for _, c := range ch {
		byPath[c.Path] = c
	}
	if len(ch) != 3 || byPath["copy.txt"].Status != "added" || byPath["docs/hello.txt"].Status != "modified" || byPath["out"].Status != "added" {
		t.Fatalf("changes: %+v", ch)
	}
	if d := byPath["docs/hello.txt"].Diff; !strings.Contains(d, "+more\n") || !strings.Contains(d, " hello\n") {
		t.Fatalf("diff: %q", d)
	}
	if code, body := e.call("GET", "/v1/sessions/"+string(s.ID)+"/turns/9/changes", "bob", nil); code != 404 {
		t.Fatalf("changes of a turn that never ran: %d %s", code, body)
	}

	// A write while the sandbox is awake goes into it; the next turn sees it.
	if code, body := e.put(s.ID, "alice", "live.txt", []byte("live\n")); code != http.StatusNoContent {
		t.Fatalf("put live: %d %s", code, body)
	}
	turn2, out := e.prompt(s.ID, "alice", "cat live.txt")
	if out != "live\n" {
		t.Fatalf("turn 2 output %q", out)
	}
	if ch := e.changes(s.ID, "bob", turn2); len(ch) != 0 {
		t.Fatalf("turn 2 changed nothing, got %+v", ch)
	}

	// Bad input.
	big := bytes.Repeat([]byte("x"), 2<<20)
	for name, c := range map[string]struct {
		method, path, user string
		body               []byte
		status             int
		code               session.Code
	}{
		"dotdot":         {"PUT", "a%2F..%2F..%2Fx", "alice", []byte("x"), 400, session.CodeBadRequest},
		"absolute":       {"PUT", "%2Fetc%2Fpasswd", "alice", []byte("x"), 400, session.CodeBadRequest},
		"through link":   {"PUT", "out/x", "alice", []byte("x"), 400, session.CodeBadRequest},
		"read link out":  {"GET", "out/passwd", "bob", nil, 400, session.CodeBadRequest},
		"viewer writes":  {"PUT", "v.txt", "bob", []byte("x"), 403, session.CodeForbidden},
		"viewer deletes": {"DELETE", "copy.txt", "bob", nil, 403, session.CodeForbidden},
		"missing":        {"GET", "nope.txt", "bob", nil, 404, session.CodeNotFound},
		"over the limit": {"PUT", "big.bin", "alice", big, 413, session.CodePayloadTooLarge},
	} {
		t.Run(name, func(t *testing.T) {
			var body any
			if c.body != nil {
				body = c.body
			}
			code, rb := e.call(c.method, filesPath(s.ID, c.path), c.user, body)
			wantCode(t, name, code, rb, c.status, c.code)
		})
	}
	// The quota (1.5 MiB): the second 900 KB file does not fit.
	if code, body := e.put(s.ID, "alice", "a.bin", bytes.Repeat([]byte("a"), 900<<10)); code != 204 {
		t.Fatalf("put a.bin: %d %s", code, body)
	}
	code, body := e.put(s.ID, "alice", "b.bin", bytes.Repeat([]byte("b"), 900<<10))
	wantCode(t, "quota", code, body, http.StatusInsufficientStorage, session.CodeInsufficientStorage)
	if !strings.Contains(string(body), "quota of 1572864 bytes") {
		t.Fatalf("quota error does not name the quota: %s", body)
	}

	// An interrupted upload leaves the old file.
	interruptedPut(t, e.srv.URL, filesPath(s.ID, "copy.txt"), "alice")
	e.mustGet(s.ID, "bob", "copy.txt", "hello\n")

	// Delete.
	if code, body := e.call("DELETE", filesPath(s.ID, "a.bin"), "alice", nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, _ := e.get(s.ID, "bob", "a.bin"); code != 404 {
		t.Fatalf("deleted file still read: %d", code)
	}

	// Archives out and in.
	code, body = e.call("GET", "/v1/sessions/"+string(s.ID)+"/archive?path=docs", "bob", nil)
	if code != 200 {
		t.Fatalf("archive: %d %s", code, body)
	}
	if files := untar(t, body); files["hello.txt"] != "hello\nmore\n" || len(files) != 1 {
		t.Fatalf("archive of docs: %v", files)
	}
	arc := tarGz(t, map[string]string{"agent/main.py": "print('hi')\n", "agent/req.txt": "requests\n"})
	if code, body := e.call("POST", "/v1/sessions/"+string(s.ID)+"/archive?path=up", "alice", arc); code != 204 {
		t.Fatalf("post archive: %d %s", code, body)
	}
	e.mustGet(s.ID, "bob", "up/agent/main.py", "print('hi')\n")
	evil := tarGz(t, map[string]string{"../escape.txt": "x"})
	code, body = e.call("POST", "/v1/sessions/"+string(s.ID)+"/archive?path=up", "alice", evil)
	wantCode(t, "archive leaving its folder", code, body, 400, session.CodeBadRequest)

	// Forks: at the last seq by a viewer, who owns it; at the first
	// write's seq, with the workspace as of then.
	code, body = e.call("POST", "/v1/sessions/"+string(s.ID)+"/fork", "bob", map[string]any{"title": "bob's fork"})
	if code != 201 {
		t.Fatalf("fork: %d %s", code, body)
	}
	var fork session.Session
	json.Unmarshal(body, &fork)
	if fork.Owner != "bob" || fork.Title != "bob's fork" || fork.ID == s.ID {
		t.Fatalf("fork: %+v", fork)
	}
	parentEvs, forkEvs := e.events(s.ID, "alice"), e.events(fork.ID, "bob")
	var first session.SessionCreatedData
	json.Unmarshal(forkEvs[0].Data, &first)
	if first.ForkedFrom == nil || first.ForkedFrom.Session != s.ID || first.ForkedFrom.Seq != parentEvs[len(parentEvs)-1].Seq {
		t.Fatalf("fork's first event: %s", forkEvs[0].Data)
	}
	if len(forkEvs) != len(parentEvs) || forkEvs[3].Kind != parentEvs[3].Kind {
		t.Fatalf("fork has %d events, parent %d", len(forkEvs), len(parentEvs))
	}
	e.mustGet(fork.ID, "bob", "up/agent/main.py", "print('hi')\n")
	_, out = e.prompt(fork.ID, "bob", "cat docs/hello.txt; echo forked > docs/hello.txt")
	if out != "hello\nmore\n" {
		t.Fatalf("fork's turn read %q", out)
	}
	e.mustGet(s.ID, "bob", "docs/hello.txt", "hello\nmore\n") // The parent is untouched.

	code, body = e.call("POST", "/v1/sessions/"+string(s.ID)+"/fork", "alice", map[string]any{"at_seq": writeSeq})
	if code != 201 {
		t.Fatalf("fork at %d: %d %s", writeSeq, code, body)
	}
	var early session.Session
	json.Unmarshal(body, &early)
	e.mustGet(early.ID, "alice", "docs/hello.txt", "hello\n")
	if code, _ := e.get(early.ID, "alice", "copy.txt"); code != 404 {
		t.Fatalf("fork at seq %d has a file made later: %d", writeSeq, code)
	}
	code, body = e.call("POST", "/v1/sessions/"+string(s.ID)+"/fork", "alice", map[string]any{"at_seq": 99999})
	wantCode(t, "fork of a seq that does not exist", code, body, 400, session.CodeBadRequest)
}

func TestFiles_WriteWaitsForTheRunningTurn(t *testing.T) {
	e := newFilesEnv(t, nil)
	s := e.create("alice", "ordering")
	code, body := e.call("POST", "/v1/sessions/"+string(s.ID)+"/messages", "alice",
		map[string]string{"text": "sleep 1; cat later.txt 2>/dev/null || echo missing"})
	if code != 202 {
		t.Fatalf("prompt: %d %s", code, body)
	}
	var ack struct{ Seq session.Seq }
	json.Unmarshal(body, &ack)
	// Wait until the turn runs, then write.
	deadline := time.Now().Add(30 * time.Second)
	for running := false; !running; {
		if time.Now().After(deadline) {
			t.Fatal("turn did not start")
		}
		for _, ev := range e.events(s.ID, "alice") {
			running = running || (ev.Kind == session.KindSandbox && strings.Contains(string(ev.Data), `"ready"`))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := e.put(s.ID, "alice", "later.txt", []byte("now\n")); code != 204 {
		t.Fatalf("put: %d %s", code, body)
	}
	var finished, written session.Seq
	for _, ev := range e.events(s.ID, "alice") {
		switch ev.Kind {
		case session.KindTurnFinished:
			finished = ev.Seq
		case session.KindFilesChanged:
			written = ev.Seq
		}
	}
	if finished == 0 || written < finished {
		t.Fatalf("the write (seq %d) did not wait for the turn (finished at seq %d)", written, finished)
	}
	if _, out := e.waitTurn(s.ID, "alice", ack.Seq); out != "missing\n" {
		t.Fatalf("the running turn saw the write: %q", out)
	}
	e.mustGet(s.ID, "alice", "later.txt", "now\n")
}

func TestFiles_ReadOfASleepingSandboxWakesNothing(t *testing.T) {
	e := newFilesEnv(t, func(c *actor.Config) { c.SandboxSleepAfter = 300 * time.Millisecond })
	s := e.create("alice", "asleep")
	e.prompt(s.ID, "alice", "head -c 3000000 /dev/zero > big.bin; echo ok")
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := e.events(s.ID, "alice")
		last := evs[len(evs)-1]
		if last.Kind == session.KindSandbox && strings.Contains(string(last.Data), `"sleeping"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox did not sleep")
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := len(e.events(s.ID, "alice"))
	code, body := e.get(s.ID, "alice", "big.bin")
	if code != 200 || len(body) != 3000000 {
		t.Fatalf("read: %d, %d bytes", code, len(body))
	}
	if ls := e.list(s.ID, "alice", "", true); len(ls) != 1 {
		t.Fatalf("list: %+v", ls)
	}
	if after := e.events(s.ID, "alice"); len(after) != before {
		t.Fatalf("reading logged events (woke the sandbox?): %+v", after[before:])
	}
}

// interruptedPut sends a PUT whose body ends before its Content-Length and
// closes the connection.
func interruptedPut(t *testing.T, base, path, user string) {
	t.Helper()
	u, _ := url.Parse(base)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer dev:%s\r\nContent-Length: 1000000\r\n\r\n", path, u.Host, user)
	c.Write(bytes.Repeat([]byte("z"), 300000))
	c.Close()
}

func tarGz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			data, _ := io.ReadAll(tr)
			out[h.Name] = string(data)
		}
	}
}
