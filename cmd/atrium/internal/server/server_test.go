package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) {
	if egress.IsForwarder(os.Args) {
		// Sandboxes reach the model gateway through this binary.
		os.Exit(egress.RunForwarder(os.Args, os.Stdout, os.Stderr))
	}
	if os.Getenv(agentEnv) != "" {
		// The netns provisioning hook of the remote tests runs this
		// binary as the sandbox agent of its VMs.
		os.Exit(agentMain(os.Args[1:]))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(cleanupNetns))
}

// TestServer_SameEventsEverywhere is the done-when test: two WebSocket
// watchers and a REST driver see byte-identical event sequences — the raw
// event bytes of WS frames equal the items of GET …/events and the SSE data
// lines — for a session that ran turns with stdout, stderr, agent lines and an
// approval.
func TestServer_SameEventsEverywhere(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	alice, bob, carol := s.as("alice"), s.as("bob"), s.as("carol")
	sess := alice.create("same bytes", testHarness)
	alice.setRole(sess.ID, "bob", session.RoleDriver)
	alice.setRole(sess.ID, "carol", session.RoleViewer)

	wa := alice.watch(sess.ID, 0)
	wc := carol.watch(sess.ID, 0)
	if wa.hello.You.Role != session.RoleOwner || wc.hello.You.Role != session.RoleViewer {
		t.Fatalf("hello roles: alice %q carol %q, want owner and viewer", wa.hello.You.Role, wc.hello.You.Role)
	}

	prompts := map[int64]int64{} // turn → seq of its message
	allows := map[int64]bool{1: true, 2: false}
	for n := int64(1); n <= 2; n++ {
		prompts[n] = bob.prompt(sess.ID, "mixed")
		ev := bob.waitEvent(sess.ID, prompts[n], fmt.Sprintf("approval_requested of turn %d", n), func(ev event) bool {
			return ev.Kind == session.KindApprovalRequested && ev.turn() == n
		})
		var ar session.ApprovalRequestedData
		ev.decode(t, &ar)
		if want := fmt.Sprintf("ap%d", n); ar.ID != want || ar.Summary != "may I <rm -rf>?" {
			t.Fatalf("approval_requested %s: want id %s and the harness's summary", ev.raw, want)
		}
		bob.approve(sess.ID, ar.ID, allows[n])
		if fin := bob.waitTurn(sess.ID, n); fin.Status != session.TurnOK || fin.ExitCode != 0 {
			t.Fatalf("turn %d finished %+v, want ok with exit code 0", n, fin)
		}
	}

	rest := bob.events(sess.ID, 0)
	last := rest[len(rest)-1].Seq
	checkContiguous(t, "REST history", rest, 1, last)
	if got := bob.get(sess.ID).LastSeq; got != last {
		t.Fatalf("session last_seq %d, history ends at %d", got, last)
	}

	sameBytes(t, "alice's WS vs REST", wa.eventsUntil(last), rest)
	sameBytes(t, "carol's WS vs REST", wc.eventsUntil(last), rest)
	stream, err := carol.sse(sess.ID, "after=0", "")
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "SSE vs REST", stream.until(t, last), rest)
	// Pages of any size return the same bytes.
	var paged []event
	for after := int64(0); after < last; {
		p := bob.page(sess.ID, after, 3)
		if len(p.Events) == 0 || len(p.Events) > 3 || p.LastSeq != last || p.Epoch != sess.Epoch {
			t.Fatalf("page after %d limit 3: %d events, last_seq %d, epoch %q; want 1..3 events, %d, %q", after, len(p.Events), p.LastSeq, p.Epoch, last, sess.Epoch)
		}
		for _, raw := range p.Events {
			paged = append(paged, parseEvent(t, raw))
		}
		after = paged[len(paged)-1].Seq
	}
	sameBytes(t, "pages of 3 vs REST", paged, rest)

	// What the events say.
	if rest[0].Kind != session.KindSessionCreated || rest[0].By != "alice" {
		t.Fatalf("first event %s, want session_created by alice", rest[0].raw)
	}
	roles := map[string]session.Role{}
	for _, ev := range rest {
		if ev.Epoch != sess.Epoch {
			t.Fatalf("event %s: epoch differs from the session's %q", ev.raw, sess.Epoch)
		}
		if ev.Kind == session.KindMemberChanged {
			var d session.MemberChangedData
			ev.decode(t, &d)
			roles[d.User] = d.Role
		}
	}
	if roles["bob"] != session.RoleDriver || roles["carol"] != session.RoleViewer {
		t.Fatalf("member_changed events give roles %v, want bob driver and carol viewer", roles)
	}
	for n := int64(1); n <= 2; n++ {
		checkMixedTurn(t, rest, n, prompts[n], allows[n])
	}
}

// checkMixedTurn checks the events of a turn of the "mixed" prompt.
func checkMixedTurn(t *testing.T, evs []event, n, promptSeq int64, allow bool) {
	t.Helper()
	var msg, started *event
	kinds := map[session.Kind]int{}
	for i := range evs {
		ev := &evs[i]
		if ev.Seq == promptSeq {
			msg = ev
		}
		if ev.Kind == session.KindTurnStarted && ev.turn() == n {
			started = ev
		}
		if ev.turn() == n {
			kinds[ev.Kind]++
		}
	}
	if msg == nil || msg.Kind != session.KindMessage || msg.By != "bob" || msg.text() != "mixed" {
		t.Fatalf("turn %d: event at the acked seq %d is not bob's message \"mixed\": %+v", n, promptSeq, msg)
	}
	if started == nil {
		t.Fatalf("turn %d: no turn_started", n)
	}
	var ts session.TurnStartedData
	started.decode(t, &ts)
	if ts.PromptSeq != promptSeq || started.Seq <= promptSeq {
		t.Fatalf("turn %d: turn_started %s, want prompt_seq %d after it", n, started.raw, promptSeq)
	}
	for _, k := range []session.Kind{session.KindOutput, session.KindAgent, session.KindApprovalRequested, session.KindApprovalResolved, session.KindTurnFinished} {
		if kinds[k] == 0 {
			t.Errorf("turn %d: no %s event (kinds %v)", n, k, kinds)
		}
	}
	if out := outputOf(evs, n, "stdout"); !strings.Contains(out, "stdout: <b>&amp; ünïcødé \u2028 end\n") {
		t.Errorf("turn %d: stdout %q lacks the harness's first line", n, out)
	}
	if out := outputOf(evs, n, "stderr"); out != "stderr: oops <&>\n" {
		t.Errorf("turn %d: stderr %q, want %q", n, out, "stderr: oops <&>\n")
	}
	for _, ev := range evs {
		switch {
		case ev.Kind == session.KindAgent && ev.turn() == n:
			var d map[string]any
			ev.decode(t, &d)
			if d["type"] != "thinking" || d["text"] != "<hmm> & ü" {
				t.Errorf("turn %d: agent event %s, want the harness object plus turn", n, ev.raw)
			}
		case ev.Kind == session.KindApprovalResolved && ev.turn() == n:
			var d session.ApprovalResolvedData
			ev.decode(t, &d)
			if d.ID != fmt.Sprintf("ap%d", n) || d.Allow != allow || ev.By != "bob" {
				t.Errorf("turn %d: approval_resolved %s, want ap%d allow %v by bob", n, ev.raw, n, allow)
			}
		}
	}
	// The harness echoes the answer line it read on stdin.
	var answer session.ApprovalAnswer
	for _, line := range strings.Split(outputOf(evs, n, "stdout"), "\n") {
		if a, ok := strings.CutPrefix(line, "answer: "); ok {
			if err := json.Unmarshal([]byte(a), &answer); err != nil {
				t.Fatalf("turn %d: the harness got answer line %q, not JSON: %v", n, a, err)
			}
		}
	}
	if answer != (session.ApprovalAnswer{Type: "approval", ID: fmt.Sprintf("ap%d", n), Allow: allow}) {
		t.Errorf("turn %d: the harness read answer %+v on stdin, want approval ap%d allow %v", n, answer, n, allow)
	}
}

// TestServer_Resume: watchers disconnect while a turn streams output and
// resume by cursor (WebSocket after=N, SSE Last-Event-ID) while it still
// runs; the union of what each saw is every seq exactly once, contiguous, in
// order, and byte-identical to the history.
func TestServer_Resume(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	alice := s.as("alice")
	// The harness prints 1500 lines, waits for approval "mid", prints 1500
	// more, waits for approval "end", prints 100 more. The test answers "mid"
	// only after both watchers dropped, so events are certainly produced
	// while they are away, and "end" only after both resumed, so the turn is
	// certainly still running when they come back.
	sess := alice.create("resume", map[string]any{"command": []string{bash, "-c", `
read -r input
for i in $(seq 1 1500); do echo line $i; done
echo '{"type":"approval_request","id":"mid","summary":"continue?"}'
read -r answer
for i in $(seq 1501 3000); do echo line $i; done
echo '{"type":"approval_request","id":"end","summary":"finish?"}'
read -r answer
for i in $(seq 3001 3100); do echo line $i; done
`}})
	ws := alice.watch(sess.ID, 0)
	stream, err := alice.sse(sess.ID, "after=0", "")
	if err != nil {
		t.Fatal(err)
	}
	alice.prompt(sess.ID, "go")

	// readUntil reads one event at a time until stop holds for the events so
	// far.
	readUntil := func(next func() []event, stop func([]event) bool) []event {
		var evs []event
		for !stop(evs) {
			evs = append(evs, next()...)
		}
		return evs
	}
	sawLine700 := func(evs []event) bool { return strings.Contains(outputOf(evs, 1, "stdout"), "line 700\n") }
	sawEnd := func(evs []event) bool {
		return len(evs) > 0 && evs[len(evs)-1].Kind == session.KindApprovalRequested && strings.Contains(string(evs[len(evs)-1].Data), `"id":"end"`)
	}
	finished := func(evs []event) bool {
		return len(evs) > 0 && evs[len(evs)-1].Kind == session.KindTurnFinished
	}
	wsNext := func(w *watcher) func() []event { return func() []event { return w.eventsUntil(0) } }
	sseNext := func(st *sseStream) func() []event { return func() []event { return st.until(t, 0) } }

	wsAll := readUntil(wsNext(ws), sawLine700)
	ws.conn.CloseNow()
	sseAll := readUntil(sseNext(stream), sawLine700)
	stream.close()

	alice.waitEvent(sess.ID, 0, "approval_requested mid", func(ev event) bool { return ev.Kind == session.KindApprovalRequested })
	alice.approve(sess.ID, "mid", true)
	ws2 := alice.watch(sess.ID, wsAll[len(wsAll)-1].Seq)
	if ws2.hello.LastSeq < wsAll[len(wsAll)-1].Seq {
		t.Fatalf("hello last_seq %d is before the resume point %d", ws2.hello.LastSeq, wsAll[len(wsAll)-1].Seq)
	}
	stream2, err := alice.sse(sess.ID, "", strconv.FormatInt(sseAll[len(sseAll)-1].Seq, 10))
	if err != nil {
		t.Fatal(err)
	}
	wsAll = append(wsAll, readUntil(wsNext(ws2), sawEnd)...)
	sseAll = append(sseAll, readUntil(sseNext(stream2), sawEnd)...)
	alice.approve(sess.ID, "end", true)
	wsAll = append(wsAll, readUntil(wsNext(ws2), finished)...)
	sseAll = append(sseAll, readUntil(sseNext(stream2), finished)...)

	rest := alice.events(sess.ID, 0)
	last := rest[len(rest)-1].Seq
	if rest[len(rest)-1].Kind != session.KindTurnFinished {
		t.Fatalf("history ends with %s, want turn_finished", rest[len(rest)-1].raw)
	}
	if got := strings.Count(outputOf(rest, 1, "stdout"), "line "); got != 3100 {
		t.Fatalf("history holds %d output lines, want 3100", got)
	}
	checkContiguous(t, "WS before+after reconnect", wsAll, 1, last)
	sameBytes(t, "WS resumed vs REST", wsAll, rest)
	checkContiguous(t, "SSE before+after reconnect", sseAll, 1, last)
	sameBytes(t, "SSE resumed vs REST", sseAll, rest)

	// A resume from the very end gets nothing old, then live events.
	ws3 := alice.watch(sess.ID, last)
	seq := alice.prompt(sess.ID, "again")
	if seq != last+1 {
		t.Fatalf("next prompt at seq %d, want %d", seq, last+1)
	}
	if got := ws3.eventsUntil(seq); got[0].Seq != last+1 {
		t.Fatalf("resume at the end delivered seq %d first, want %d", got[0].Seq, last+1)
	}
}

// TestServer_BadInput drives bad frames, requests and harnesses through the
// whole stack: each gets a clear error and the session keeps working.
func TestServer_BadInput(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	alice, carol := s.as("alice"), s.as("carol")

	t.Run("ws frames", func(t *testing.T) {
		t.Parallel()
		a := *alice
		a.t = t
		sess := a.create("frames", testHarness)
		w := a.watch(sess.ID, 0)
		for _, bad := range []string{`{"type":"prompt",`, `[1,2]`, `"prompt"`, `{"type":"dance"}`, `{"type":42}`, `{}`} {
			w.sendRaw([]byte(bad))
			f := w.nextNonEvent("error for " + bad)
			if f.Type != session.FrameError || f.Code != session.CodeBadRequest || f.Message == "" {
				t.Fatalf("frame %s got %s, want an error frame with code bad_request and a message", bad, f.raw)
			}
		}
		w.send(map[string]any{"type": "approve", "id": "no-such-approval", "allow": true})
		if f := w.nextNonEvent("error for unknown approval"); f.Type != session.FrameError || f.Code == "" {
			t.Fatalf("approve of an unknown approval got %s, want an error frame", f.raw)
		}
		// The connection survived all that.
		w.send(map[string]any{"type": "prompt", "text": "after bad frames", "client_id": "c-1"})
		f := w.nextNonEvent("ack")
		if f.Type != session.FrameAck || f.ClientID != "c-1" || f.Seq <= 0 {
			t.Fatalf("prompt after bad frames got %s, want ack for c-1 with a seq", f.raw)
		}
		if fin := a.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
			t.Fatalf("turn after bad frames finished %+v, want ok", fin)
		}
	})

	t.Run("ws frame over 1 MiB", func(t *testing.T) {
		t.Parallel()
		a := *alice
		a.t = t
		sess := a.create("big frame", testHarness)
		w := a.watch(sess.ID, 0)
		big := `{"type":"prompt","client_id":"big","text":"` + strings.Repeat("x", session.MaxFrameBytes) + `"}`
		ctx, cancel := contextWithTimeout()
		defer cancel()
		_ = w.conn.Write(ctx, websocket.MessageText, []byte(big)) // The server may close mid-write.
		err := w.closed()
		if st := websocket.CloseStatus(err); st != websocket.StatusMessageTooBig {
			t.Fatalf("after a %d-byte frame the connection ended with %v (status %d), want close 1009", len(big), err, st)
		}
		// The session is unharmed.
		a.prompt(sess.ID, "hi")
		if fin := a.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
			t.Fatalf("turn after the big frame finished %+v, want ok", fin)
		}
	})

	t.Run("viewer", func(t *testing.T) {
		t.Parallel()
		a, c := *alice, *carol
		a.t, c.t = t, t
		sess := a.create("viewer", testHarness)
		a.setRole(sess.ID, "carol", session.RoleViewer)
		w := c.watch(sess.ID, 0)
		w.send(map[string]any{"type": "prompt", "text": "let me", "client_id": "v-1"})
		if f := w.nextNonEvent("error"); f.Type != session.FrameError || f.Code != session.CodeForbidden {
			t.Fatalf("viewer prompt over WS got %s, want error forbidden", f.raw)
		}
		w.send(map[string]any{"type": "cancel"})
		if f := w.nextNonEvent("error"); f.Type != session.FrameError || f.Code != session.CodeForbidden {
			t.Fatalf("viewer cancel over WS got %s, want error forbidden", f.raw)
		}
		p := "/v1/sessions/" + string(sess.ID)
		c.mustError(http.StatusForbidden, session.CodeForbidden, "POST", p+"/messages", map[string]any{"text": "let me"})
		c.mustError(http.StatusForbidden, session.CodeForbidden, "POST", p+"/cancel", nil)
		c.mustError(http.StatusForbidden, session.CodeForbidden, "POST", p+"/approvals/x", map[string]any{"allow": true})
		c.mustError(http.StatusForbidden, session.CodeForbidden, "PUT", p+"/members/dave", map[string]any{"role": "owner"})
		c.mustError(http.StatusForbidden, session.CodeForbidden, "DELETE", p, nil)
		// Nothing the viewer did reached the log.
		for _, ev := range a.events(sess.ID, 0) {
			if ev.By == "carol" {
				t.Fatalf("the viewer caused event %s", ev.raw)
			}
		}
		if got := c.get(sess.ID).Role; got != session.RoleViewer {
			t.Fatalf("carol's role %q, want viewer", got)
		}
	})

	t.Run("unknown session and strangers", func(t *testing.T) {
		t.Parallel()
		a := *alice
		a.t = t
		sess := a.create("private", testHarness)
		for _, p := range []string{"/v1/sessions/s_nosuchsession", "/v1/sessions/s_nosuchsession/events"} {
			a.mustError(http.StatusNotFound, session.CodeNotFound, "GET", p, nil)
		}
		a.mustError(http.StatusNotFound, session.CodeNotFound, "POST", "/v1/sessions/s_nosuchsession/messages", map[string]any{"text": "hi"})
		if _, resp, err := a.dial("s_nosuchsession", "after=0"); err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("ws to an unknown session: err %v response %s, want a 404", err, respStatus(resp))
		}
		// A session you may not see does not exist for you.
		d := client{t: t, base: a.base, user: "dave"}
		d.mustError(http.StatusNotFound, session.CodeNotFound, "GET", "/v1/sessions/"+string(sess.ID), nil)
		d.mustError(http.StatusNotFound, session.CodeNotFound, "POST", "/v1/sessions/"+string(sess.ID)+"/messages", map[string]any{"text": "hi"})
		var list struct{ Sessions []session.Session }
		d.must(http.StatusOK, "GET", "/v1/sessions", nil, &list)
		for _, ls := range list.Sessions {
			if ls.ID == sess.ID {
				t.Fatalf("dave's list shows alice's private session %s", sess.ID)
			}
		}
		anon := client{t: t, base: a.base}
		anon.mustError(http.StatusUnauthorized, session.CodeUnauthenticated, "GET", "/v1/sessions", nil)
		bogus := client{t: t, base: a.base, user: " "}
		if st, b := bogus.request("GET", "/v1/sessions", nil); st != http.StatusUnauthorized && st != http.StatusBadRequest {
			t.Fatalf("user %q: status %d %s, want 401 or 400", " ", st, b)
		}
	})

	t.Run("after beyond last_seq", func(t *testing.T) {
		t.Parallel()
		a := *alice
		a.t = t
		sess := a.create("cursor", testHarness)
		last := a.get(sess.ID).LastSeq
		p := "/v1/sessions/" + string(sess.ID) + "/events?after="
		for _, after := range []string{strconv.FormatInt(last+100, 10), "-1", "abc"} {
			a.mustError(http.StatusBadRequest, session.CodeBadRequest, "GET", p+after, nil)
		}
		if _, err := a.sse(sess.ID, "after="+strconv.FormatInt(last+100, 10), ""); err == nil || !strings.Contains(err.Error(), "status 400") {
			t.Fatalf("sse after beyond last_seq: %v, want a 400", err)
		}
		conn, resp, err := a.dial(sess.ID, "after="+strconv.FormatInt(last+100, 10))
		if err != nil {
			if resp == nil || resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("ws after beyond last_seq: %v (%s), want a 400 or an error frame bad_request", err, respStatus(resp))
			}
		} else {
			w := startWatcher(t, conn)
			f := w.nextNonEvent("error")
			if f.Type == session.FrameHello {
				f = w.nextNonEvent("error")
			}
			if f.Type != session.FrameError || f.Code != session.CodeBadRequest {
				t.Fatalf("ws after beyond last_seq got %s, want error bad_request", f.raw)
			}
		}
	})

	t.Run("bad REST bodies", func(t *testing.T) {
		t.Parallel()
		a := *alice
		a.t = t
		a.mustError(http.StatusBadRequest, session.CodeBadRequest, "POST", "/v1/sessions", `{"title":`)
		a.mustError(http.StatusBadRequest, session.CodeBadRequest, "POST", "/v1/sessions", map[string]any{"harness": map[string]any{"command": []string{}}})
		a.mustError(http.StatusBadRequest, session.CodeBadRequest, "POST", "/v1/sessions", map[string]any{"title": strings.Repeat("t", session.MaxTitleBytes+1)})
		sess := a.create("bodies", testHarness)
		p := "/v1/sessions/" + string(sess.ID)
		a.mustError(http.StatusBadRequest, session.CodeBadRequest, "POST", p+"/messages", `{"text":`)
		a.mustError(http.StatusBadRequest, session.CodeBadRequest, "PUT", p+"/members/bob", map[string]any{"role": "king"})
		a.mustError(http.StatusRequestEntityTooLarge, session.CodePayloadTooLarge, "POST", p+"/messages",
			`{"text":"`+strings.Repeat("x", session.MaxFrameBytes)+`"}`)
		// None of it reached the log.
		for _, ev := range a.events(sess.ID, 0) {
			if ev.Kind == session.KindMessage || ev.Kind == session.KindMemberChanged {
				t.Fatalf("a bad request left event %s", ev.raw)
			}
		}
	})

	// Harnesses that misbehave: each turn ends with a clear turn_finished
	// (and error event where the harness gave no reason), and the next prompt
	// runs a new turn.
	harnessCase := func(name string, harness any, prompt string, check func(t *testing.T, fin session.TurnFinishedData, evs []event), next session.TurnStatus) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := *alice
			a.t = t
			sess := a.create(name, harness)
			a.prompt(sess.ID, prompt)
			fin := a.waitTurn(sess.ID, 1)
			check(t, fin, a.events(sess.ID, 0))
			seq := a.prompt(sess.ID, "next")
			fin2 := a.waitTurn(sess.ID, 2)
			if fin2.Status != next {
				t.Fatalf("the prompt after %s (seq %d) ran turn 2 with %+v, want status %s", name, seq, fin2, next)
			}
		})
	}
	harnessCase("harness not executable", map[string]any{"command": []string{"/etc/passwd"}}, "x",
		func(t *testing.T, fin session.TurnFinishedData, evs []event) {
			if fin.Status != session.TurnFailed {
				t.Fatalf("turn_finished %+v, want failed", fin)
			}
			if reason(evs, 1) == "" {
				t.Fatalf("no error event or stderr says why the harness did not run; events:\n%s", dump(evs))
			}
		}, session.TurnFailed)
	harnessCase("harness exits non-zero", testHarness, "exit3",
		func(t *testing.T, fin session.TurnFinishedData, evs []event) {
			if fin.Status != session.TurnFailed || fin.ExitCode != 3 {
				t.Fatalf("turn_finished %+v, want failed with exit code 3", fin)
			}
			if out := outputOf(evs, 1, "stdout"); out != "about to fail\n" {
				t.Fatalf("stdout %q, want the harness's line", out)
			}
		}, session.TurnOK)
	harnessCase("harness never reads stdin", map[string]any{"command": []string{bash, "-c", "exec 0<&-; echo not reading"}},
		strings.Repeat("p", session.MaxTextBytes-1024), // more than a pipe buffer
		func(t *testing.T, fin session.TurnFinishedData, evs []event) {
			if fin.Status != session.TurnOK {
				t.Fatalf("turn_finished %+v, want ok: the harness exited 0", fin)
			}
			if out := outputOf(evs, 1, "stdout"); out != "not reading\n" {
				t.Fatalf("stdout %q, want the harness's line", out)
			}
		}, session.TurnOK)
	harnessCase("harness prints binary garbage", testHarness, "garbage",
		func(t *testing.T, fin session.TurnFinishedData, evs []event) {
			if fin.Status != session.TurnOK {
				t.Fatalf("turn_finished %+v, want ok", fin)
			}
			if out := outputOf(evs, 1, "stdout"); !strings.Contains(out, "after garbage\n") {
				t.Fatalf("stdout lacks the line after the garbage")
			}
			for _, ev := range evs {
				if ev.Kind == session.KindOutput && len(ev.text()) > session.MaxOutputEventBytes {
					t.Fatalf("output event %d carries %d bytes of text, over the %d limit", ev.Seq, len(ev.text()), session.MaxOutputEventBytes)
				}
			}
		}, session.TurnOK)
	t.Run("harness prints 100 MB", func(t *testing.T) {
		t.Parallel()
		a := *alice
		a.t = t
		sess := a.create("flood", testHarness)
		a.prompt(sess.ID, "flood")
		// Reading and discarding 100 MB takes a while under -race on a busy
		// machine; this deadline only detects a hang.
		fin, tail := waitTurnTail(&a, sess.ID, 1, 3*waitLong)
		if fin.Status != session.TurnOK && reason(tail, 1) == "" {
			t.Fatalf("flood turn finished %+v with no error event saying why; last events:\n%s", fin, dump(tail))
		}
		info := a.get(sess.ID)
		t.Logf("flood turn: %+v; the history holds %d events", fin, info.LastSeq)
		seq := a.prompt(sess.ID, "next")
		if seq != info.LastSeq+1 {
			t.Fatalf("prompt after the flood at seq %d, want %d", seq, info.LastSeq+1)
		}
		if fin2, _ := waitTurnTail(&a, sess.ID, 2, waitLong); fin2.Status != session.TurnOK {
			t.Fatalf("turn after the flood finished %+v, want ok", fin2)
		}
	})
}

// reason returns the message of an error event after turn n started, or the
// stderr of turn n.
func reason(evs []event, n int64) string {
	started := false
	for _, ev := range evs {
		if ev.Kind == session.KindTurnStarted && ev.turn() == n {
			started = true
		}
		if started && ev.Kind == session.KindError {
			var d session.ErrorData
			if json.Unmarshal(ev.Data, &d) == nil && d.Message != "" && d.Code != "" {
				return d.Message
			}
		}
	}
	return outputOf(evs, n, "stderr")
}

func dump(evs []event) string {
	var b strings.Builder
	for _, ev := range evs {
		raw := ev.raw
		if len(raw) > 300 {
			raw = append(raw[:300:300], "…"...)
		}
		fmt.Fprintf(&b, "  %s\n", raw)
	}
	return b.String()
}

// waitTurnTail waits for turn_finished of turn n looking only at the newest
// events, for sessions too long to page through, and returns the tail too.
func waitTurnTail(c *client, id session.ID, n int64, wait time.Duration) (session.TurnFinishedData, []event) {
	c.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		last := c.get(id).LastSeq
		tail := c.events(id, max(0, last-200))
		for _, ev := range tail {
			if ev.Kind == session.KindTurnFinished && ev.turn() == n {
				var d session.TurnFinishedData
				ev.decode(c.t, &d)
				return d, tail
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("session %s: turn %d not finished within %v; last_seq %d", id, n, wait, last)
		}
		time.Sleep(50 * time.Millisecond) // Polling interval.
	}
}

// TestServer_Hibernate: an idle session hibernates; reading its metadata and
// listing do not wake it; a prompt wakes it, and a watcher that stayed
// connected sees the new events continue the sequence.
func TestServer_Hibernate(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *server.Config) { c.HibernateAfter = 200 * time.Millisecond })
	alice := s.as("alice")
	sess := alice.create("sleepy", nil)
	w := alice.watch(sess.ID, 0)
	alice.prompt(sess.ID, "echo before")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn 1 %+v, want ok", fin)
	}

	// Poll less often than HibernateAfter: a read of an active session is a
	// command to its actor and restarts the idle timer (DESIGN §3).
	var hib session.Session
	deadline := time.Now().Add(waitLong)
	for hib = alice.get(sess.ID); hib.State != session.StateHibernated; hib = alice.get(sess.ID) {
		if hib.State != session.StateActive {
			t.Fatalf("state %q, want active or hibernated", hib.State)
		}
		if time.Now().After(deadline) {
			t.Fatalf("session still %q %v after its last turn (HibernateAfter 200ms)", hib.State, waitLong)
		}
		time.Sleep(400 * time.Millisecond) // Polling interval, twice HibernateAfter.
	}
	if hib.LastSeq == 0 || hib.Sandbox.State == "" || hib.Role != session.RoleOwner {
		t.Fatalf("hibernated session %+v lacks last_seq, sandbox state or role", hib)
	}
	// Reading does not wake it: a woken session would stay active for 200ms.
	for i := 0; i < 5; i++ {
		if got := alice.get(sess.ID); got.State != session.StateHibernated || got.LastSeq != hib.LastSeq {
			t.Fatalf("GET %d woke the session or changed it: %+v", i, got)
		}
		var list struct{ Sessions []session.Session }
		alice.must(http.StatusOK, "GET", "/v1/sessions", nil, &list)
		if len(list.Sessions) != 1 || list.Sessions[0].ID != sess.ID || list.Sessions[0].State != session.StateHibernated {
			t.Fatalf("listing %d: %+v, want just the hibernated session", i, list.Sessions)
		}
	}

	seq := alice.prompt(sess.ID, "echo after")
	if seq != hib.LastSeq+1 {
		t.Fatalf("the waking prompt is at seq %d, want %d", seq, hib.LastSeq+1)
	}
	if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
		t.Fatalf("turn 2 after waking %+v, want ok", fin)
	}
	rest := alice.events(sess.ID, 0)
	checkContiguous(t, "history across hibernation", rest, 1, rest[len(rest)-1].Seq)
	if out := outputOf(rest, 2, "stdout"); out != "after\n" {
		t.Fatalf("turn 2 stdout %q, want %q", out, "after\n")
	}
	sameBytes(t, "watcher across hibernation vs REST", w.eventsUntil(rest[len(rest)-1].Seq), rest)
}

// TestServer_Multiplayer: prompts from two drivers queue and run in order; a
// driver approves over REST and the harness reads the answer; the second user
// cancels the first one's long turn; presence lists both watchers.
func TestServer_Multiplayer(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	alice, bob := s.as("alice"), s.as("bob")
	sess := alice.create("together", testHarness)
	alice.setRole(sess.ID, "bob", session.RoleDriver)
	wa := alice.watch(sess.ID, 0)
	wb := bob.watch(sess.ID, 0)

	wb.waitPresence("alice", "bob")

	// Turn 1 holds the queue waiting for an approval while both queue more.
	p1 := alice.prompt(sess.ID, "hold")
	alice.waitEvent(sess.ID, p1, "approval_requested", func(ev event) bool { return ev.Kind == session.KindApprovalRequested })
	p2 := bob.prompt(sess.ID, "from bob")
	wa.send(map[string]any{"type": "prompt", "text": "from alice", "client_id": "a-3"})
	ack := wa.nextNonEvent("ack")
	if ack.Type != session.FrameAck || ack.ClientID != "a-3" || ack.Seq != p2+1 {
		t.Fatalf("alice's WS prompt got %s, want ack a-3 at seq %d", ack.raw, p2+1)
	}
	p3 := ack.Seq
	bob.approve(sess.ID, "hold1", true)
	for n := int64(1); n <= 3; n++ {
		if fin := bob.waitTurn(sess.ID, n); fin.Status != session.TurnOK {
			t.Fatalf("turn %d %+v, want ok", n, fin)
		}
	}
	evs := alice.events(sess.ID, 0)
	wantOrder := map[int64]int64{1: p1, 2: p2, 3: p3}
	var lastStart int64
	for _, ev := range evs {
		if ev.Kind != session.KindTurnStarted {
			continue
		}
		var d session.TurnStartedData
		ev.decode(t, &d)
		if d.PromptSeq != wantOrder[d.Turn] || ev.Seq < lastStart {
			t.Fatalf("turn_started %s: want turns 1,2,3 started in order for prompts %v", ev.raw, wantOrder)
		}
		lastStart = ev.Seq
	}
	var answer session.ApprovalAnswer
	if a, ok := strings.CutPrefix(strings.TrimSpace(outputOf(evs, 1, "stdout")), "answer: "); !ok || json.Unmarshal([]byte(a), &answer) != nil ||
		answer != (session.ApprovalAnswer{Type: "approval", ID: "hold1", Allow: true}) {
		t.Fatalf("turn 1 stdout %q: the harness did not read bob's approval", outputOf(evs, 1, "stdout"))
	}
	if out := outputOf(evs, 2, "stdout"); !strings.Contains(out, `"prompt":"from bob"`) || !strings.Contains(out, `"by":"bob"`) || !strings.Contains(out, "turn=2 ") {
		t.Fatalf("turn 2 stdout %q: want bob's prompt as the harness input of turn 2", out)
	}
	if out := outputOf(evs, 3, "stdout"); !strings.Contains(out, `"prompt":"from alice"`) || !strings.Contains(out, `"by":"alice"`) {
		t.Fatalf("turn 3 stdout %q: want alice's prompt", out)
	}

	// Bob cancels alice's long turn.
	p4 := alice.prompt(sess.ID, "long")
	alice.waitEvent(sess.ID, p4, "the long turn's output", func(ev event) bool { return ev.Kind == session.KindOutput && ev.turn() == 4 })
	wb.send(map[string]any{"type": "cancel"})
	if fin := alice.waitTurn(sess.ID, 4); fin.Status != session.TurnCancelled {
		t.Fatalf("turn 4 after bob's cancel: %+v, want cancelled", fin)
	}
	alice.prompt(sess.ID, "after cancel")
	if fin := alice.waitTurn(sess.ID, 5); fin.Status != session.TurnOK {
		t.Fatalf("turn 5 after the cancel: %+v, want ok", fin)
	}
	evs = alice.events(sess.ID, 0)
	last := evs[len(evs)-1].Seq
	sameBytes(t, "alice's WS vs REST", wa.eventsUntil(last), evs)
	sameBytes(t, "bob's WS vs REST", wb.eventsUntil(last), evs)
}
