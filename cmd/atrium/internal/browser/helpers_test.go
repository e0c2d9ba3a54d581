package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/input"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

// waitLong bounds how long a test waits for anything: a page to show
// something, a turn to finish. It is a polling deadline, never a timing
// assertion.
const waitLong = 90 * time.Second

// chromiumPath is Debian's Chromium, installed by .ci/deps.
const chromiumPath = "/usr/bin/chromium"

// browser is the Chromium process the package's tests share; each user gets
// a browser context of their own in it (separate cookies and storage).
var browser struct {
	once   sync.Once
	ctx    context.Context // the first tab's context: owns the process
	cancel context.CancelFunc
	err    error
}

// TestMain stops Chromium after the tests, then checks that no goroutine
// of the tests, the servers or chromedp is left behind.
func TestMain(m *testing.M) {
	// Sandboxes with the model gateway (agent sessions) run this test
	// binary as their forwarder, as they run the atrium binary.
	if egress.IsForwarder(os.Args) {
		syscall.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
	}
	code := m.Run()
	if browser.cancel != nil {
		browser.cancel()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needTools fails the test, saying how to install them, unless bubblewrap and
// Chromium are present.
func needTools(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap (bwrap) is missing: the browser tests run real sandboxes; run .ci/deps to install it")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s is missing: the browser tests drive Debian's Chromium; run .ci/deps to install it (%v)", chromiumPath, err)
	}
}

// chrome returns the shared browser's root context, starting Chromium on
// first use: headless, no sandbox (the tests run as root), and no network
// beyond loopback (every other host resolves to nothing and any proxy use
// goes to a closed port).
func chrome(t testing.TB) context.Context {
	t.Helper()
	needTools(t)
	browser.once.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(chromiumPath),
			chromedp.NoSandbox,
			chromedp.DisableGPU,
			chromedp.WindowSize(1280, 800),
			chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"),
			chromedp.Flag("proxy-server", "http://127.0.0.1:9"),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-domain-reliability", true),
			chromedp.Flag("no-pings", true),
			chromedp.Flag("lang", "en-US"),
		)
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancel := chromedp.NewContext(alloc)
		browser.ctx = ctx
		browser.cancel = func() { cancel(); cancelAlloc() }
		browser.err = chromedp.Do(ctx) // starts the process
	})
	if browser.err != nil {
		t.Fatalf("start %s: %v (run .ci/deps if it is missing)", chromiumPath, browser.err)
	}
	return browser.ctx
}

// stack is one in-process Atrium on loopback.
type stack struct {
	t    testing.TB
	cfg  server.Config
	srv  *server.Server
	base string // what browsers and clients use: the server, or a proxy in front of it
}

// startStack starts a server in a fresh data dir. It is closed when the test
// ends.
func startStack(t testing.TB, mods ...func(*server.Config)) *stack {
	t.Helper()
	needTools(t)
	logs := &testWriter{t: t}
	t.Cleanup(logs.stop) // registered first, so it runs after Close
	st := &stack{t: t, cfg: server.Config{
		Listen:         "127.0.0.1:0",
		DataDir:        t.TempDir(),
		HibernateAfter: time.Hour,
		CancelGrace:    time.Second,
		// Stopping a stack drains its node: a running turn gets this long
		// to finish before it is cancelled.
		DrainGrace: time.Second,
		Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}}
	for _, mod := range mods {
		mod(&st.cfg)
	}
	st.start()
	t.Cleanup(st.stop)
	return st
}

func (st *stack) start() {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	srv, err := server.Start(ctx, st.cfg)
	if err != nil {
		st.t.Fatalf("start server: %v", err)
	}
	st.srv = srv
	if st.base == "" {
		st.base = srv.URL()
	}
}

func (st *stack) stop() {
	if st.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := st.srv.Close(ctx); err != nil {
		st.t.Errorf("close server: %v", err)
	}
	st.srv = nil
}

// restart closes the server (WebSockets get 1001 "server shutting down") and
// starts a new one on the same data dir; it returns the new one's address.
func (st *stack) restart() string {
	st.t.Helper()
	st.stop()
	st.start()
	return strings.TrimPrefix(st.srv.URL(), "http://")
}

// testWriter forwards the server's logs to the test log until stop.
type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool // guarded by mu
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Logf("server: %s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// --- REST as a dev user -------------------------------------------------

// api calls the REST API as user, straight to the server (not through a
// proxy), and decodes the answer into out; a status other than want fails the
// test.
func (st *stack) api(user string, want int, method, path string, body, out any) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			st.t.Fatalf("encode: %v", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, st.srv.URL()+path, rd)
	if err != nil {
		st.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer dev:"+user)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		st.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		st.t.Fatalf("%s %s as %s: status %d, want %d: %s", method, path, user, resp.StatusCode, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			st.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}

func (st *stack) create(user, title string, harness any) session.Session {
	st.t.Helper()
	var s session.Session
	st.api(user, http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": title, "harness": harness}, &s)
	return s
}

func (st *stack) prompt(user string, id session.ID, text string) int64 {
	st.t.Helper()
	var r struct{ Seq int64 }
	st.api(user, http.StatusAccepted, "POST", "/v1/sessions/"+string(id)+"/messages", map[string]any{"text": text}, &r)
	return r.Seq
}

// event is a decoded wire event.
type event struct {
	Seq  int64           `json:"seq"`
	Kind session.Kind    `json:"kind"`
	By   string          `json:"by"`
	Data json.RawMessage `json:"data"`
}

func (ev event) field(name string) any {
	var m map[string]any
	_ = json.Unmarshal(ev.Data, &m)
	return m[name]
}

// history returns every event of the session after after, paging.
func (st *stack) history(user string, id session.ID, after int64) []event {
	st.t.Helper()
	var all []event
	for {
		var p struct {
			Events  []event `json:"events"`
			LastSeq int64   `json:"last_seq"`
		}
		st.api(user, http.StatusOK, "GET", fmt.Sprintf("/v1/sessions/%s/events?after=%d&limit=1000", id, after), nil, &p)
		all = append(all, p.Events...)
		if len(p.Events) == 0 || p.Events[len(p.Events)-1].Seq >= p.LastSeq {
			return all
		}
		after = p.Events[len(p.Events)-1].Seq
	}
}

// waitEvent polls the history until an event satisfies pred.
func (st *stack) waitEvent(user string, id session.ID, what string, pred func(event) bool) event {
	st.t.Helper()
	deadline := time.Now().Add(waitLong)
	var after int64
	for {
		for _, ev := range st.history(user, id, after) {
			if pred(ev) {
				return ev
			}
			after = ev.Seq
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("session %s: no %s within %v", id, what, waitLong)
		}
		time.Sleep(25 * time.Millisecond) // polling interval
	}
}

func seqsOf(evs []event) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Seq
	}
	return out
}

// --- a loopback TCP proxy that the test can cut -------------------------

// proxy forwards loopback TCP connections to a target address. cut closes
// every connection it carries and refuses new ones until resume; retarget
// points it at a restarted server.
type proxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu      sync.Mutex
	target  string            // guarded by mu
	blocked bool              // guarded by mu
	conns   map[net.Conn]bool // guarded by mu
	closed  bool              // guarded by mu
	accepts int               // guarded by mu: connections forwarded
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.blocked || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		target := p.target
		p.conns[c] = true
		p.accepts++
		p.mu.Unlock()
		p.wg.Go(func() { p.forward(c, target) })
	}
}

func (p *proxy) forward(c net.Conn, target string) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
	}()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	p.mu.Lock()
	if !p.conns[c] { // cut meanwhile
		p.mu.Unlock()
		up.Close()
		return
	}
	p.conns[up] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, up)
		p.mu.Unlock()
		up.Close()
	}()
	done := make(chan struct{})
	go func() { // owned: forward waits for it below
		defer close(done)
		_, _ = io.Copy(up, c)
		up.Close()
	}()
	_, _ = io.Copy(c, up)
	c.Close()
	<-done
}

// cut drops every connection and refuses new ones until resume.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = true
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// block refuses new connections (existing ones carry on) until resume.
func (p *proxy) block() {
	p.mu.Lock()
	p.blocked = true
	p.mu.Unlock()
}

func (p *proxy) resume(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if target != "" {
		p.target = target
	}
	p.blocked = false
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// --- pages: one browser context per user -------------------------------

// tab is one user's browser tab, in a browser context of its own.
type tab struct {
	t    testing.TB
	ctx  context.Context
	user string
	base string

	mu       sync.Mutex
	problems []string // guarded by mu: exceptions, console errors, CSP violations, foreign requests
}

// open opens a tab for user in a new browser context, signs in with the dev
// login (GET /auth/dev?user=…, which sets the cookie and redirects to /) and
// waits for the sessions page. At the end of the test, anything the page
// logged as an error, any CSP violation and any request that left base fails
// the test.
func (st *stack) open(user string) *tab {
	st.t.Helper()
	tb := &tab{t: st.t, user: user, base: st.base}
	ctx, cancel := chromedp.NewContext(chrome(st.t), chromedp.WithNewBrowserContext(), chromedp.WithListener(tb.listen))
	st.t.Cleanup(func() {
		cancel()
		tb.mu.Lock()
		defer tb.mu.Unlock()
		for _, p := range tb.problems {
			st.t.Errorf("%s's page: %s", user, p)
		}
	})
	tb.ctx = ctx
	tb.attach()
	// Report CSP (and Trusted Types) violations as console errors. Scripts
	// added over DevTools are not subject to the page's policy.
	tb.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: `document.addEventListener('securitypolicyviolation', (e) => console.error('CSP violation: ' + e.violatedDirective + ' blocked ' + e.blockedURI + ' at ' + e.sourceFile + ':' + e.lineNumber));`,
		})
		return err
	}))
	tb.do(chromedp.Navigate(st.base + "/auth/dev?user=" + url.QueryEscape(user)))
	tb.waitJS("the sessions page", `document.querySelector('#sessions-h') !== null`)
	return tb
}

// attach opens the tab. The first action on a chromedp context binds the
// tab's event loop to the context it is given, so it must be one with no
// deadline: tb.ctx itself.
func (tb *tab) attach() {
	tb.t.Helper()
	if err := chromedp.Do(tb.ctx); err != nil {
		tb.t.Fatalf("open a tab for %s: %v", tb.user, err)
	}
}

func (tb *tab) listen(ev any) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			msg = d.Exception.Description
		}
		tb.problems = append(tb.problems, fmt.Sprintf("uncaught exception: %s (%s:%d)", msg, d.URL, d.LineNumber+1))
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var parts []string
			for _, a := range ev.Args {
				if a.Value != nil {
					parts = append(parts, string(a.Value))
				} else {
					parts = append(parts, a.Description)
				}
			}
			tb.problems = append(tb.problems, "console.error: "+strings.Join(parts, " "))
		}
	case *cdplog.EventEntryAdded:
		e := ev.Entry
		if e.Level != cdplog.EntryLevelError {
			return
		}
		if e.Source == cdplog.EntrySourceNetwork {
			return // failed (re)connections: the tests cut them on purpose
		}
		tb.problems = append(tb.problems, fmt.Sprintf("browser log (%s): %s %s", e.Source, e.Text, e.URL))
	case *network.EventRequestWillBeSent:
		tb.checkURL(ev.Request.URL)
	case *network.EventWebSocketCreated:
		tb.checkURL(ev.URL)
	}
}

// checkURL notes a request that goes anywhere but the server under test.
func (tb *tab) checkURL(u string) {
	if strings.HasPrefix(u, "data:") || strings.HasPrefix(u, "about:") {
		return
	}
	p, err := url.Parse(u)
	b, _ := url.Parse(tb.base)
	if err != nil || p.Host != b.Host {
		tb.problems = append(tb.problems, "request to another origin: "+u)
	}
}

// do runs actions in the tab, failing the test on error.
func (tb *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitLong)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.t.Fatalf("%s's tab: %v", tb.user, err)
	}
}

// eval evaluates a JavaScript expression (awaiting a promise) and decodes
// its value into T.
func eval[T any](tb *tab, expr string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitLong)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("%s's tab: evaluate %.200s: %v", tb.user, expr, err)
	}
	return v
}

// waitJS polls until the expression is truthy.
func (tb *tab) waitJS(what, expr string) {
	tb.t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		if eval[bool](tb, "!!("+expr+")") {
			return
		}
		if time.Now().After(deadline) {
			tb.mu.Lock()
			problems := strings.Join(tb.problems, "; ")
			tb.mu.Unlock()
			tb.t.Fatalf("%s's tab: no %s within %v (url %s; status %q; problems: %s; last rows: %s)", tb.user, what, waitLong,
				eval[string](tb, "location.href"), eval[string](tb, `(document.querySelector('.conn') || {}).textContent || ''`), problems,
				eval[string](tb, `[...document.querySelectorAll('#rows > .ev')].slice(-5).map((e) => e.dataset.seq + ' ' + e.className + ': ' + e.textContent.slice(0, 80)).join(' | ')`))
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// goTo navigates the tab to a path of the server.
func (tb *tab) goTo(path string) {
	tb.t.Helper()
	tb.do(chromedp.Navigate(tb.base + path))
}

// openSession navigates to a session's page and waits until it is live.
func (tb *tab) openSession(id session.ID) {
	tb.t.Helper()
	tb.goTo("/s/" + string(id))
	tb.waitLive()
}

func (tb *tab) waitLive() {
	tb.t.Helper()
	tb.waitJS("a live connection", `document.querySelector('.conn[data-state="live"]')`)
}

// seqs returns the seqs of the event rows in the document, in order.
func (tb *tab) seqs() []int64 {
	tb.t.Helper()
	return eval[[]int64](tb, `[...document.querySelectorAll('#rows > .ev')].map((e) => Number(e.dataset.seq))`)
}

// waitRow waits for a row matching a CSS selector whose text contains text.
func (tb *tab) waitRow(what, selector, text string) {
	tb.t.Helper()
	sel, _ := json.Marshal(selector)
	txt, _ := json.Marshal(text)
	tb.waitJS(what, fmt.Sprintf(`[...document.querySelectorAll(%s)].some((e) => e.textContent.includes(%s))`, sel, txt))
}

// typeInto types text into the element (key by key) without pressing Enter.
func (tb *tab) typeInto(selector, text string) {
	tb.t.Helper()
	tb.do(chromedp.Focus(chromedp.CSS(selector)), chromedp.SendKeys(chromedp.CSS(selector), text))
}

// key presses a key (like "\r" for Enter or kb.Escape) on the focused element.
func (tb *tab) key(keys string, mods ...chromedp.Modifier) {
	tb.t.Helper()
	var opts []chromedp.KeyOption
	if len(mods) > 0 {
		opts = append(opts, chromedp.KeyModifiers(mods...))
	}
	tb.do(chromedp.KeyEvent(keys, opts...))
}

// enter presses Enter as a keyboard does: one keydown with the text, whose
// default action (a newline, a form submission) a handler may cancel.
// (chromedp's "\r" also sends the text as a separate char event, which
// inserts a newline even after the keydown was cancelled.)
func (tb *tab) enter() { tb.enterWith(0) }

// shiftEnter presses Shift+Enter.
func (tb *tab) shiftEnter() { tb.enterWith(8) } // Shift

func (tb *tab) enterWith(mod int64) {
	tb.t.Helper()
	tb.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeKeyDown, input.DispatchKeyEventTypeKeyUp} {
			p := input.DispatchKeyEventParams{Type: typ, Modifiers: mod, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13}
			if typ == input.DispatchKeyEventTypeKeyDown {
				p.Text = "\r"
				p.UnmodifiedText = "\r"
			}
			if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, p); err != nil {
				return err
			}
		}
		return nil
	}))
}

// send types text into the prompt box and presses Enter.
func (tb *tab) send(text string) {
	tb.t.Helper()
	tb.typeInto("#prompt", text)
	tb.enter()
	tb.waitJS("an empty prompt box", `document.querySelector('#prompt').value === ''`)
}

func (tb *tab) click(selector string) {
	tb.t.Helper()
	tb.do(chromedp.Click(chromedp.CSS(selector), chromedp.NodeVisible))
}

// sessionID returns the id in the tab's /s/<id> address.
func (tb *tab) sessionID() session.ID {
	tb.t.Helper()
	path := eval[string](tb, "location.pathname")
	id, ok := strings.CutPrefix(path, "/s/")
	if !ok || id == "" {
		tb.t.Fatalf("%s's tab is at %s, not a session page", tb.user, path)
	}
	return session.ID(id)
}

// checkA11y fails the test if a control on the page has no accessible name
// (a label, text or aria-label), or (unless a modal dialog hides the page)
// the page has no main landmark or no h1.
func (tb *tab) checkA11y(where string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitLong)
	defer cancel()
	res, err := chromedp.Call(ctx, accessibility.GetFullAXTree, accessibility.GetFullAXTreeParams{})
	if err != nil {
		tb.t.Fatalf("%s: accessibility tree: %v", where, err)
	}
	str := func(v *accessibility.Value) string {
		if v == nil {
			return ""
		}
		var s string
		_ = json.Unmarshal(v.Value, &s)
		return s
	}
	controls := map[string]bool{"button": true, "textbox": true, "combobox": true, "link": true, "searchbox": true, "checkbox": true, "listbox": true}
	var main, h1 bool
	named := 0
	for _, n := range res.Nodes {
		if n.Ignored {
			continue
		}
		role := str(n.Role)
		switch {
		case role == "main":
			main = true
		case role == "heading":
			for _, p := range n.Properties {
				if p.Name == "level" && string(p.Value.Value) == "1" {
					h1 = true
				}
			}
		case controls[role]:
			if strings.TrimSpace(str(n.Name)) == "" {
				tb.t.Errorf("%s: a %s has no accessible name (DOM node %d)", where, role, n.BackendDOMNodeID)
			}
			named++
		}
	}
	modal := eval[bool](tb, `!!document.querySelector('dialog[open]')`)
	if (!modal && (!main || !h1)) || named == 0 {
		tb.t.Errorf("%s: main landmark %v, h1 %v, %d controls", where, main, h1, named)
	}
}

// screenshot saves a PNG of the viewport at width×height in the colour
// scheme ("light" or "dark") to dir/name.png.
func (tb *tab) screenshot(dir, name string, width, height int64, scheme string, mobile bool) {
	tb.t.Helper()
	var vopts []chromedp.EmulateViewportOption
	if mobile {
		vopts = append(vopts, chromedp.EmulateMobile, chromedp.EmulateScale(2))
	}
	tb.do(
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, page.BringToFront, cdp.Empty{})
			return err
		}),
		chromedp.EmulateViewport(width, height, vopts...),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
			})
			return err
		}),
	)
	// Let layout settle and the timeline scroll to its end.
	settle := `new Promise((r) => setTimeout(() => {
		const t = document.querySelector('#timeline');
		if (t) t.scrollTop = t.scrollHeight;
		setTimeout(() => r(true), 150);
	}, 150))`
	eval[bool](tb, settle)
	ctx, cancel := context.WithTimeout(tb.ctx, waitLong)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		tb.t.Fatalf("screenshot %s: %v", name, err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG")) {
		tb.t.Fatalf("screenshot %s is not a PNG", name)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	tb.t.Logf("screenshot %s (%d KiB)", path, len(png)>>10)
}

// resetView undoes screenshot's emulation.
func (tb *tab) resetView() {
	tb.t.Helper()
	tb.do(chromedp.ResetViewport(), chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{})
		return err
	}))
}

// screenshotDir is $ATRIUM_SCREENSHOTS, created if needed, or a temporary
// directory of the test.
func screenshotDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("ATRIUM_SCREENSHOTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("ATRIUM_SCREENSHOTS: %v", err)
	}
	return dir
}

// checkSeqs fails unless got is exactly want, naming the first difference.
func checkSeqs(t testing.TB, what string, got, want []int64) {
	t.Helper()
	for i := 0; i < len(got) || i < len(want); i++ {
		switch {
		case i >= len(got):
			t.Fatalf("%s: %d rows, want %d: missing seq %d and after", what, len(got), len(want), want[i])
		case i >= len(want):
			t.Fatalf("%s: %d rows, want %d: extra seq %d", what, len(got), len(want), got[i])
		case got[i] != want[i]:
			t.Fatalf("%s: row %d has seq %d, want %d (a duplicate, gap or reordering)", what, i, got[i], want[i])
		}
	}
}

// jsString quotes s for JavaScript.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

var _ = errors.New
var _ = strconv.Itoa
