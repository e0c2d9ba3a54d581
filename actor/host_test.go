package actor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

func TestHost_PromptTurn(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	w := e.watch(id)

	seq := e.prompt(id, "alice", `echo hello; echo oops >&2; echo '{"type":"note","text":"<b>&"}'; echo after`)
	if seq != 2 {
		t.Errorf("prompt seq = %d, want 2 (after session_created)", seq)
	}
	fin := w.until("turn_finished", finished(1))
	if d := data[session.TurnFinishedData](t, fin); d.Status != session.TurnOK || d.ExitCode != 0 {
		t.Errorf("turn_finished = %+v, want ok/0", d)
	}

	// History has every event, seq 1.. without gaps, byte for byte what was
	// published.
	raw := e.history(id, "alice")
	evs := decode(t, raw)
	checkContiguous(t, evs)
	if evs[0].Kind != session.KindSessionCreated || evs[1].Kind != session.KindMessage {
		t.Fatalf("first events: %s", summarize(evs[:2]))
	}
	for i, r := range w.raw {
		seq := w.evs[i].Seq
		if !bytes.Equal(r, raw[seq-1]) {
			t.Errorf("published event %d differs from history:\n%s\n%s", seq, r, raw[seq-1])
		}
	}
	kinds := []session.Kind{}
	for _, ev := range evs {
		kinds = append(kinds, ev.Kind)
	}
	for _, k := range []session.Kind{session.KindTurnStarted, session.KindSandbox, session.KindAgent, session.KindOutput, session.KindTurnFinished} {
		if !slices.Contains(kinds, k) {
			t.Errorf("no %s event in %v", k, kinds)
		}
	}
	if got := outputText(t, evs, 1, "stdout"); got != "hello\nafter\n" {
		t.Errorf("stdout = %q", got)
	}
	if got := outputText(t, evs, 1, "stderr"); got != "oops\n" {
		t.Errorf("stderr = %q", got)
	}
	// The agent event is the harness object plus the turn, and comes between
	// the stdout lines around it.
	var agentAt, afterAt int
	for i, ev := range evs {
		switch {
		case ev.Kind == session.KindAgent:
			agentAt = i
			var obj map[string]any
			json.Unmarshal(ev.Data, &obj)
			if obj["type"] != "note" || obj["text"] != "<b>&" || obj["turn"] != float64(1) {
				t.Errorf("agent data = %s", ev.Data)
			}
		case ev.Kind == session.KindOutput && strings.Contains(string(ev.Data), `"after`):
			afterAt = i
		}
	}
	if agentAt == 0 || afterAt < agentAt {
		t.Errorf("agent event at %d, following output at %d: stdout order lost:%s", agentAt, afterAt, summarize(evs))
	}
	// The harness saw the contract's first stdin line and environment.
	seq = e.prompt(id, "alice", `echo "$_atrium_input"; echo "$ATRIUM_SESSION $ATRIUM_TURN"`)
	w.until("turn 2 finished", finished(2))
	out := outputText(t, w.evs, 2, "stdout")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("stdout of turn 2 = %q", out)
	}
	var in session.HarnessInput
	if err := json.Unmarshal([]byte(lines[0]), &in); err != nil || in.Session != id || in.Turn != 2 || in.By != "alice" ||
		!strings.HasPrefix(in.Prompt, `echo "$_atrium_input"`) {
		t.Errorf("first stdin line = %s (%v)", lines[0], err)
	}
	if lines[1] != fmt.Sprintf("%s 2", id) {
		t.Errorf("env = %q", lines[1])
	}

	info := e.cmd(id, "alice", session.Command{Op: session.OpInfo})
	if info.Session == nil || info.Session.Role != session.RoleOwner || info.Session.State != session.StateActive ||
		info.Session.Sandbox.State != session.SandboxReady || info.Session.LastSeq < seq {
		t.Errorf("info = %+v", info.Session)
	}
}

func TestHost_TwoDriversQueue(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver}); rep.Error != nil {
		t.Fatalf("add bob: %v", rep.Error)
	}
	w := e.watch(id)
	var wg sync.WaitGroup
	seqs := make([]session.Seq, 6)
	for i := range seqs {
		user := []string{"alice", "bob"}[i%2]
		wg.Go(func() { seqs[i] = e.prompt(id, user, fmt.Sprintf("sleep 0.02; echo run-%d", i)) })
	}
	wg.Wait()
	w.until("turn 6 finished", finished(6))

	// Turns ran one at a time, in the order the prompts were committed.
	evs := decode(t, e.history(id, "bob"))
	checkContiguous(t, evs)
	running := int64(0)
	var order []session.Seq
	for _, ev := range evs {
		switch ev.Kind {
		case session.KindTurnStarted:
			d := data[session.TurnStartedData](t, ev)
			if running != 0 {
				t.Fatalf("turn %d started while turn %d runs:%s", d.Turn, running, summarize(evs))
			}
			running = d.Turn
			order = append(order, d.PromptSeq)
		case session.KindTurnFinished:
			running = 0
		}
	}
	sorted := slices.Clone(seqs)
	slices.Sort(sorted)
	if !slices.Equal(order, sorted) {
		t.Errorf("turns ran prompts %v, want %v", order, sorted)
	}
}

func TestHost_Cancel(t *testing.T) {
	e := newEnv(t, withGrace(300*time.Millisecond))
	id := e.create("alice", shell())
	w := e.watch(id)

	if rep := e.cmd(id, "alice", session.Command{Op: session.OpCancel}); rep.Error == nil || rep.Error.Code != session.CodeConflict {
		t.Fatalf("cancel with nothing running = %+v, want conflict", rep)
	}
	for i, tc := range []struct {
		name, script, wantOut string
	}{
		{"traps TERM", `trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done`, "got-term"},
		{"ignores TERM", `trap '' TERM; echo ready; while :; do sleep 0.05; done`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			turn := int64(i + 1)
			e.prompt(id, "alice", tc.script)
			w.until("ready", func(ev session.Event) bool {
				return ev.Kind == session.KindOutput && strings.Contains(string(ev.Data), "ready")
			})
			if rep := e.cmd(id, "alice", session.Command{Op: session.OpCancel}); rep.Error != nil {
				t.Fatalf("cancel: %v", rep.Error)
			}
			fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(turn)))
			if fin.Status != session.TurnCancelled {
				t.Errorf("status = %s, want cancelled", fin.Status)
			}
			if tc.wantOut != "" && !strings.Contains(outputText(t, w.evs, turn, "stdout"), tc.wantOut) {
				t.Errorf("stdout = %q, want %q", outputText(t, w.evs, turn, "stdout"), tc.wantOut)
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		e := newEnv(t, withGrace(100*time.Millisecond), func(c *Config) { c.TurnTimeout = 300 * time.Millisecond })
		id := e.create("alice", shell())
		w := e.watch(id)
		e.prompt(id, "alice", "trap '' TERM; while :; do sleep 0.05; done")
		if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(1))); fin.Status != session.TurnTimeout {
			t.Errorf("status = %s, want timeout", fin.Status)
		}
	})
	// The session keeps working.
	e.prompt(id, "alice", "echo still-here")
	w.until("turn 3", finished(3))
	if got := outputText(t, w.evs, 3, "stdout"); got != "still-here\n" {
		t.Errorf("stdout = %q", got)
	}
}

func TestHost_Approvals(t *testing.T) {
	e := newEnv(t)
	script := `read -r first
echo '{"type":"approval_request","id":"a1","summary":"delete files?"}'
read -r answer
echo "got $answer"`
	id := e.create("alice", command("bash", "-c", script))
	w := e.watch(id)
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "vic", Role: session.RoleViewer}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	e.prompt(id, "alice", "do it")
	req := data[session.ApprovalRequestedData](t, w.until("approval_requested", isKind(session.KindApprovalRequested)))
	if req.ID != "a1" || req.Summary != "delete files?" || req.Turn != 1 {
		t.Errorf("approval_requested = %+v", req)
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpApprove, ApprovalID: "nope", Allow: true}); rep.Error == nil || rep.Error.Code != session.CodeNotFound {
		t.Errorf("approve unknown id = %+v, want not_found", rep)
	}
	if rep := e.cmd(id, "vic", session.Command{Op: session.OpApprove, ApprovalID: "a1", Allow: true}); rep.Error == nil || rep.Error.Code != session.CodeForbidden {
		t.Errorf("viewer approve = %+v, want forbidden", rep)
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpApprove, ApprovalID: "a1", Allow: true}); rep.Error != nil {
		t.Fatalf("approve: %v", rep.Error)
	}
	res := data[session.ApprovalResolvedData](t, w.until("approval_resolved", isKind(session.KindApprovalResolved)))
	if res != (session.ApprovalResolvedData{Turn: 1, ID: "a1", Allow: true}) {
		t.Errorf("approval_resolved = %+v", res)
	}
	w.until("turn_finished", finished(1))
	if got := outputText(t, w.evs, 1, "stdout"); got != `got {"type":"approval","id":"a1","allow":true}`+"\n" {
		t.Errorf("harness got %q", got)
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpApprove, ApprovalID: "a1", Allow: true}); rep.Error == nil || rep.Error.Code != session.CodeNotFound {
		t.Errorf("approve after the turn = %+v, want not_found", rep)
	}
}

func TestHost_Errors(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "vic", Role: session.RoleViewer}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	for _, tc := range []struct {
		name string
		id   session.ID
		user string
		cmd  session.Command
		want session.Code
	}{
		{"viewer prompt", id, "vic", session.Command{Op: session.OpPrompt, Text: "hi"}, session.CodeForbidden},
		{"viewer cancel", id, "vic", session.Command{Op: session.OpCancel}, session.CodeForbidden},
		{"stranger info", id, "mallory", session.Command{Op: session.OpInfo}, session.CodeNotFound},
		{"stranger prompt", id, "mallory", session.Command{Op: session.OpPrompt, Text: "hi"}, session.CodeNotFound},
		{"unknown session", session.NewID(), "alice", session.Command{Op: session.OpInfo}, session.CodeNotFound},
		{"after beyond last", id, "alice", session.Command{Op: session.OpHistory, After: 99}, session.CodeBadRequest},
		{"empty prompt", id, "alice", session.Command{Op: session.OpPrompt, Text: "  "}, session.CodeBadRequest},
		{"long prompt", id, "alice", session.Command{Op: session.OpPrompt, Text: strings.Repeat("x", session.MaxTextBytes+1)}, session.CodePayloadTooLarge},
		{"long client id", id, "alice", session.Command{Op: session.OpPrompt, Text: "x", ClientID: strings.Repeat("c", 129)}, session.CodeBadRequest},
		{"viewer member", id, "vic", session.Command{Op: session.OpMember, User: "x", Role: session.RoleDriver}, session.CodeForbidden},
		{"owner's role", id, "alice", session.Command{Op: session.OpMember, User: "alice", Role: session.RoleViewer}, session.CodeBadRequest},
		{"bad role", id, "alice", session.Command{Op: session.OpMember, User: "x", Role: "king"}, session.CodeBadRequest},
		{"viewer delete", id, "vic", session.Command{Op: session.OpDelete}, session.CodeForbidden},
		{"unknown op", id, "alice", session.Command{Op: "dance"}, session.CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := e.cmd(tc.id, tc.user, tc.cmd)
			if rep.Error == nil || rep.Error.Code != tc.want {
				t.Errorf("reply = %+v, want %s", rep, tc.want)
			}
		})
	}
	t.Run("no user header", func(t *testing.T) {
		resp, err := e.request(e.subj.Cmd(id), "", session.Command{Op: session.OpInfo}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var rep session.Reply
		json.Unmarshal(resp.Data, &rep)
		if rep.Error == nil || rep.Error.Code != session.CodeUnauthenticated {
			t.Errorf("reply = %s", resp.Data)
		}
	})
	t.Run("create", func(t *testing.T) {
		for name, req := range map[string]session.PlaceRequest{
			"long title":       {Op: session.PlaceCreate, Session: session.NewID(), Title: strings.Repeat("t", session.MaxTitleBytes+1)},
			"unknown template": {Op: session.PlaceCreate, Session: session.NewID(), Harness: session.Harness{Template: "nope"}},
			"bad id":           {Op: session.PlaceCreate, Session: "a b"},
			"existing":         {Op: session.PlaceCreate, Session: id},
		} {
			rep := e.place("alice", req)
			if rep.Error == nil {
				t.Errorf("%s: created", name)
			}
		}
	})
	// Nothing above reached the log.
	evs := decode(t, e.history(id, "vic"))
	checkContiguous(t, evs)
	if len(evs) != 2 {
		t.Errorf("events:%s", summarize(evs))
	}
}

func TestHost_PromptDedup(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", command("true"))
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	c := session.Command{Op: session.OpPrompt, Text: "once", ClientID: "c-1"}
	first := e.cmd(id, "alice", c)
	again := e.cmd(id, "alice", c)
	other := e.cmd(id, "bob", c) // another user's client_id is another prompt
	if first.Seq == 0 || again.Seq != first.Seq || other.Seq == first.Seq {
		t.Fatalf("seqs: first %d, retry %d, bob %d", first.Seq, again.Seq, other.Seq)
	}
	n := 0
	for _, ev := range decode(t, e.history(id, "alice")) {
		if ev.Kind == session.KindMessage {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d message events, want 2", n)
	}
}

func TestHost_Members(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	if rep := e.cmd(id, "bob", session.Command{Op: session.OpInfo}); rep.Error == nil {
		t.Fatal("bob sees the session before being added")
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleViewer}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if rep := e.cmd(id, "bob", session.Command{Op: session.OpInfo}); rep.Error != nil || rep.Session.Role != session.RoleViewer {
		t.Fatalf("bob's info = %+v", rep)
	}
	eventually(t, "catalog lists bob", func() bool {
		c, ok := e.catalog(id)
		return ok && c.Members["bob"] == session.RoleViewer && c.Members["alice"] == session.RoleOwner
	})
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleNone}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if rep := e.cmd(id, "bob", session.Command{Op: session.OpInfo}); rep.Error == nil || rep.Error.Code != session.CodeNotFound {
		t.Fatalf("removed bob's info = %+v", rep)
	}
	var changes []session.MemberChangedData
	for _, ev := range decode(t, e.history(id, "alice")) {
		if ev.Kind == session.KindMemberChanged {
			if ev.By != "alice" {
				t.Errorf("member_changed by %q", ev.By)
			}
			changes = append(changes, data[session.MemberChangedData](t, ev))
		}
	}
	want := []session.MemberChangedData{{User: "bob", Role: session.RoleViewer}, {User: "bob", Role: session.RoleNone}}
	if !slices.Equal(changes, want) {
		t.Errorf("member_changed = %+v", changes)
	}
	// Membership survives reopening the history.
	e.host.Close(t.Context())
	e.start()
	if rep := e.cmd(id, "bob", session.Command{Op: session.OpInfo}); rep.Error == nil {
		t.Errorf("bob sees the session after a restart")
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpInfo}); rep.Error != nil || rep.Session.Role != session.RoleOwner {
		t.Errorf("alice after restart = %+v", rep)
	}
}
