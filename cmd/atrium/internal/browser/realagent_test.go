package browser

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// agentsCache is where .ci/deps installs the pinned agents (the layout of
// an agents directory), or ATRIUM_AGENTS_CACHE.
func agentsCache() string {
	if d := os.Getenv("ATRIUM_AGENTS_CACHE"); d != "" {
		return d
	}
	return "/var/cache/atrium-agents"
}

// requireCachedAgent skips the test loudly when the pinned agent is not in
// the cache, and fails it in CI, where .ci/deps installs it.
func requireCachedAgent(t *testing.T, name string) {
	t.Helper()
	cat, err := agents.New(agents.Config{Dir: agentsCache()})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := cat.Spec(name)
	if in, err := cat.Lookup(name); err != nil || in.Version != spec.Version {
		msg := "SKIPPING REAL-AGENT TEST: " + name + " " + spec.Version + " is not in the agents cache " + agentsCache() + " (run .ci/deps)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// holdingModel is a proxy in front of the scripted model server that holds
// a streamed answer after the event carrying a marker, until the test
// releases it: a reply the model is still writing, so the page can be
// looked at between two of its text deltas.
type holdingModel struct {
	target string
	tr     *http.Transport

	mu    sync.Mutex
	holds []*hold // guarded by mu
}

type hold struct {
	mark    string
	reached chan struct{} // closed when the stream is held at mark
	release chan struct{} // closed by the test
	used    bool          // guarded by holdingModel.mu
}

func newHoldingModel(t *testing.T, target string) (*holdingModel, string) {
	t.Helper()
	m := &holdingModel{target: target, tr: &http.Transport{}}
	srv := httptest.NewServer(m)
	t.Cleanup(func() {
		m.mu.Lock()
		for _, h := range m.holds {
			select {
			case <-h.release:
			default:
				close(h.release)
			}
		}
		m.mu.Unlock()
		srv.Close()
		m.tr.CloseIdleConnections()
	})
	return m, srv.URL
}

// holdAt makes the first streamed answer whose event data holds mark stop
// after that event until release is closed.
func (m *holdingModel) holdAt(mark string) *hold {
	h := &hold{mark: mark, reached: make(chan struct{}), release: make(chan struct{})}
	m.mu.Lock()
	m.holds = append(m.holds, h)
	m.mu.Unlock()
	return h
}

func (m *holdingModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req, err := http.NewRequestWithContext(r.Context(), r.Method, m.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		io.Copy(w, resp.Body)
		return
	}
	fl, _ := w.(http.Flusher)
	br := bufio.NewReader(resp.Body)
	var pending *hold
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			io.WriteString(w, line)
			if strings.HasPrefix(line, "data:") {
				m.mu.Lock()
				for _, h := range m.holds {
					if !h.used && strings.Contains(line, h.mark) {
						h.used, pending = true, h
						break
					}
				}
				m.mu.Unlock()
			}
			if strings.TrimSpace(line) == "" {
				if fl != nil {
					fl.Flush()
				}
				if pending != nil {
					close(pending.reached)
					select {
					case <-pending.release:
					case <-r.Context().Done():
						return
					}
					pending = nil
				}
			}
		}
		if err != nil {
			if fl != nil {
				fl.Flush()
			}
			return
		}
	}
}

// TestBrowser_RealAgent drives the page with the real Claude Code
// (claude-agent-acp from npm, in a bubblewrap sandbox, permission mode ask)
// whose model is the scripted Anthropic API behind the node's model
// gateway, watched by two people in two browser contexts. The model plans
// (TodoWrite: a plan checklist), writes a file (an approval card with the
// agent's options, answered by bob's click; then a tool-call card with the
// file's diff), updates the plan, and answers in markdown streamed in
// deltas held between them (the text grows on both pages before the
// message is final; then a heading and a code block). Then the header
// names the sandbox (local, ready) and the session's usage, the workspace
// panel lists the file, its download has its bytes, the turn's changes show
// its diff, and a fork from the turn has the file.
func TestBrowser_RealAgent(t *testing.T) {
	t.Parallel()
	requireCachedAgent(t, "claude")
	up := modeltest.New(t)
	up.Match(modeltest.HasTools) // Claude Code's side requests (titles) get the default answer.
	hm, modelURL := newHoldingModel(t, up.URL)
	st := startStack(t, func(c *server.Config) {
		c.AgentsDir, c.AgentMode = agentsCache(), "ask"
		c.Models = modelgw.Config{Providers: []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: modelURL, APIKey: "sk-real-upstream"}}}
	})
	var s session.Session
	st.api("alice", http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": "Greeting fix", "agent": "claude"}, &s)
	st.api("alice", http.StatusOK, "PUT", "/v1/sessions/"+string(s.ID)+"/members/bob", map[string]any{"role": "driver"}, nil)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What the agent did and what the model was asked, to see why.
		for _, ev := range st.history("alice", s.ID, 0) {
			t.Logf("event %d %s %.300s", ev.Seq, ev.Kind, ev.Data)
		}
		for i, r := range up.Requests() {
			t.Logf("model request %d: %s tools=%v scripted=%v %.200s", i, r.Path, r.HasTools, r.Scripted, r.Body[max(0, len(r.Body)-200):])
		}
	})

	const greet = "package greet\n\n// Hello greets name.\nfunc Hello(name string) string {\n\treturn \"Hello, \" + name + \"!\"\n}\n"
	todo := func(a, b string) modeltest.Reply {
		return modeltest.Tool("TodoWrite", map[string]any{"todos": []map[string]string{
			{"content": "Write src/greet.go", "status": a, "activeForm": "Writing src/greet.go"},
			{"content": "Explain the change", "status": b, "activeForm": "Explaining the change"},
		}})
	}
	first := hm.holdAt("STREAM-ONE")
	second := hm.holdAt("STREAM-TWO")
	up.Push(
		todo("in_progress", "pending"),
		modeltest.Tool("Write", map[string]any{"file_path": "/workspace/src/greet.go", "content": greet}),
		todo("completed", "in_progress"),
		modeltest.Reply{Chunks: []string{
			"## What changed\n\nI wrote `src/greet.go` (STREAM-ONE) ",
			"with one function (STREAM-TWO) ",
			"you can call like this:\n\n```go\nfmt.Println(greet.Hello(\"Ada\"))\n```\n",
		}},
	)

	alice := st.open("alice")
	alice.openSession(s.ID)
	bob := st.open("bob")
	bob.openSession(s.ID)
	both := []*tab{alice, bob}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, tb := range both {
			t.Logf("%s's page: %s", tb.user, eval[string](tb, `(() => { const s = document.querySelector('#timeline'), j = document.querySelector('.jump'); return 'visibility ' + document.visibilityState + ', scroll ' + s.scrollTop + '+' + s.clientHeight + ' of ' + s.scrollHeight + ', jump ' + (j.hidden ? 'hidden' : j.textContent); })()`))
		}
	})
	alice.send("Write src/greet.go with a Hello function, then explain it.")

	// The plan, then the agent's question with its options.
	for _, tb := range both {
		tb.waitRow("the plan", ".k-plan .checklist", "Write src/greet.go")
		tb.waitJS("the agent's options", `document.querySelectorAll('.k-approval_requested button[data-option]').length >= 2`)
		tb.waitJS("the tab title", `document.title.startsWith('(!) Approval needed')`)
	}
	opts := eval[string](bob, `[...document.querySelectorAll('.k-approval_requested button[data-option]')].map((b) => b.dataset.option + '=' + b.textContent).join('|')`)
	if !strings.Contains(opts, "allow=Allow") || !strings.Contains(opts, "reject=Reject") {
		t.Fatalf("approval options %q, want claude-agent-acp's Allow and Reject among them", opts)
	}
	bob.click(`.k-approval_requested button[data-option="allow"]`)

	// The write's card with the new file's diff, completed; the plan
	// updated in place.
	for _, tb := range both {
		tb.waitRow("the answer", ".k-approval_requested .outcome", "by bob")
		tb.waitJS("the write's card with its diff", `[...document.querySelectorAll('.k-tool_call .tool')].some((c) => c.querySelector('.diffview .dl.add') && c.querySelector('.diff summary').textContent.includes('greet.go'))`)
		tb.waitRow("the diff's added line", ".k-tool_call .diffview .dl.add", "func Hello(name string) string {")
		tb.waitJS("the plan updated", `document.querySelectorAll('.k-plan .checklist li[data-status="completed"]').length === 1`)
		if got := eval[int](tb, `document.querySelectorAll('.k-plan .checklist').length`); got != 1 {
			t.Fatalf("%s sees %d plan checklists, want 1 (the older one folds)", tb.user, got)
		}
	}

	// The answer streams: held after its first delta, then its second.
	wait := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(waitLong):
			t.Fatalf("the model's stream never reached %s", what)
		}
	}
	wait(first.reached, "its first delta")
	for _, tb := range both {
		tb.waitRow("streaming text", "#live .agent-msg.streaming", "(STREAM-ONE)")
	}
	grown := map[string]int{}
	for _, tb := range both {
		grown[tb.user] = eval[int](tb, `document.querySelector('#live .agent-msg.streaming').textContent.length`)
	}
	close(first.release)
	wait(second.reached, "its second delta")
	for _, tb := range both {
		tb.waitRow("more streaming text", "#live .agent-msg.streaming", "(STREAM-TWO)")
		if n := eval[int](tb, `document.querySelector('#live .agent-msg.streaming').textContent.length`); n <= grown[tb.user] {
			t.Fatalf("%s's streaming text did not grow: %d then %d characters", tb.user, grown[tb.user], n)
		}
		if n := eval[int](tb, `[...document.querySelectorAll('.k-agent_message')].filter((e) => e.textContent.includes('STREAM-ONE')).length`); n != 0 {
			t.Fatalf("%s sees a durable message while it is still streaming", tb.user)
		}
	}
	close(second.release)
	for _, tb := range both {
		tb.waitJS("the final message's heading and code block", `[...document.querySelectorAll('.k-agent_message .md')].some((m) => m.querySelector('h4') && m.querySelector('pre.code code'))`)
		if got := eval[string](tb, `[...document.querySelectorAll('.k-agent_message .md h4')].map((e) => e.textContent).join('|')`); got != "What changed" {
			t.Fatalf("%s: headings %q", tb.user, got)
		}
		if got := eval[string](tb, `document.querySelector('.k-agent_message .md pre.code code').textContent`); strings.TrimSuffix(got, "\n") != `fmt.Println(greet.Hello("Ada"))` {
			t.Fatalf("%s: code block %q", tb.user, got)
		}
		tb.waitJS("the streaming message replaced", `document.querySelectorAll('#live .agent-msg').length === 0`)
		tb.waitRow("turn 1 finished", ".k-turn_finished", "Turn 1 finished")
		tb.waitJS("the title calm again", `!document.title.startsWith('(!)')`)
		// The header: the sandbox and where it runs, the session's usage
		// from the model gateway.
		tb.waitRow("the sandbox in the header", ".pill.sandbox", "Sandbox ready · local")
		tb.waitJS("the session's usage", `!document.querySelector('#usage-total').hidden && /in/.test(document.querySelector('#usage-total').textContent)`)
		tb.waitJS("a usage row", `document.querySelector('.k-usage')`)
	}

	// The workspace: the file in the tree, its bytes downloaded, the turn's
	// changes.
	alice.click("#files-open")
	alice.waitJS("the file tree", `document.querySelector('#ws-files li[data-path="src"]')`)
	alice.click(`#ws-files li[data-path="src"] .fname`)
	alice.waitJS("the src folder", `document.querySelector('#ws-files li[data-path="src/greet.go"]')`)
	alice.click(`#ws-files li[data-path="src/greet.go"] .fname`)
	alice.waitRow("the file's text", "#ws-file", "func Hello(name string) string {")
	if got := eval[string](alice, `fetch(document.querySelector('#ws-download').href).then((r) => r.text())`); got != greet {
		t.Fatalf("downloaded %q, want %q", got, greet)
	}
	alice.click(`#workspace .close`)
	alice.click(`.k-turn_finished button[data-changes="1"]`)
	alice.waitJS("the changes of turn 1", `document.querySelector('#ws-changes .change[data-path="src/greet.go"]')`)
	alice.waitRow("the change's diff", `#ws-changes .change[data-path="src/greet.go"] .ul.add`, "+func Hello(name string) string {")
	alice.click(`#workspace .close`)

	// A fork from turn 1 has the file.
	alice.click(`.k-turn_finished button[data-fork]`)
	alice.waitJS("the fork's page", fmt.Sprintf(`location.pathname !== '/s/%s' && document.querySelector('#session-title').textContent.includes('(fork at turn 1)')`, s.ID))
	fork := alice.sessionID()
	alice.waitLive()
	if b := st.fileBytes("alice", fork, "src/greet.go"); b != greet {
		t.Fatalf("the fork's src/greet.go holds %q", b)
	}
	alice.checkA11y("a real agent's session")
}
