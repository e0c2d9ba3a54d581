package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestDev_CrashSafety kills `atrium dev` with SIGKILL while a turn streams
// output, restarts it on the same data dir and checks: every acknowledged
// prompt and every event a watcher received is there with the same bytes; the
// interrupted turn is closed as failed with an error event saying why; no
// process of the killed run's sandbox is left; the session keeps working.
func TestDev_CrashSafety(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := uniqueSleep(1)

	p := startDev(t, dir)
	a := api{t: t, base: p.url, user: "alice"}
	sess := a.create("crash")
	acked := map[int64]string{}
	for n, text := range []string{"echo one", `echo two >&2; echo '{"type":"note","n":2}'`} {
		acked[a.prompt(sess.ID, text)] = text
		if fin := a.waitTurn(sess.ID, int64(n+1)); fin.field("status") != string(session.TurnOK) {
			t.Fatalf("turn %d: %s, want ok", n+1, fin.raw)
		}
	}
	rec := a.record(sess.ID)
	long := "echo long-start; sleep " + marker + " & for i in $(seq 1 100000); do echo tick $i; done; wait"
	acked[a.prompt(sess.ID, long)] = long
	rec.waitFor(t, "tick 300 of turn 3", func(ev e2eEvent) bool {
		return ev.Kind == session.KindOutput && strings.Contains(ev.field("text"), "tick 300\n")
	})
	if len(processesWith(t, marker)) == 0 {
		t.Fatalf("the long turn's sleep %s is not running; cannot check it is cleaned up", marker)
	}
	before := a.events(sess.ID)

	p.signal(syscall.SIGKILL)
	if code := p.wait(); code != -1 {
		t.Fatalf("killed atrium dev exited with %d", code)
	}
	seen, bad := rec.snapshot()
	if bad != "" {
		t.Fatalf("ws watcher before the crash: %s", bad)
	}
	<-rec.done

	p2 := startDev(t, dir)
	a2 := api{t: t, base: p2.url, user: "alice"}
	fin := a2.waitTurn(sess.ID, 3)
	if fin.field("status") != string(session.TurnFailed) {
		t.Fatalf("the interrupted turn closed with %s, want status failed", fin.raw)
	}
	after := a2.events(sess.ID)
	for _, want := range [][]e2eEvent{before, seen} {
		for _, ev := range want {
			if ev.Seq > int64(len(after)) || !bytes.Equal(after[ev.Seq-1].raw, ev.raw) {
				t.Fatalf("event %d seen before the crash is lost or changed:\n  before: %s\n  after: %s", ev.Seq, ev.raw, rawAt(after, ev.Seq))
			}
		}
	}
	for seq, text := range acked {
		if ev := after[seq-1]; ev.Kind != session.KindMessage || ev.field("text") != text || ev.By != "alice" {
			t.Fatalf("acknowledged prompt at seq %d is %s, want alice's message %q", seq, ev.raw, text)
		}
	}
	var why string
	started3 := a2.waitFor(sess.ID, "turn_started of turn 3", func(ev e2eEvent) bool {
		return ev.Kind == session.KindTurnStarted && ev.turn() == 3
	})
	for _, ev := range after {
		if ev.Kind == session.KindError && ev.Seq > started3.Seq && ev.Seq <= fin.Seq+1 && ev.field("code") != "" {
			why = ev.field("message")
		}
	}
	if why == "" {
		t.Fatalf("no error event says why turn 3 failed; events after the crash:\n%s", rawsFrom(after, int64(len(seen))))
	}
	t.Logf("the watcher saw %d events before the crash, all kept; after the restart turn 3 closed at seq %d: %q", len(seen), fin.Seq, why)

	waitNoProcessWith(t, marker)

	seq := a2.prompt(sess.ID, "echo after-crash")
	fin4 := a2.waitTurn(sess.ID, 4)
	if fin4.field("status") != string(session.TurnOK) {
		t.Fatalf("turn 4 after the crash: %s, want ok", fin4.raw)
	}
	evs := a2.events(sess.ID)
	for _, ev := range evs {
		var d session.TurnStartedData
		if ev.Kind == session.KindTurnStarted && ev.turn() == 4 && (json.Unmarshal(ev.Data, &d) != nil || d.PromptSeq != seq) {
			t.Fatalf("turn 4 started for %s, want prompt_seq %d", ev.raw, seq)
		}
	}
	if out := stdoutOf(evs, 4); out != "after-crash\n" {
		t.Fatalf("turn 4 stdout %q, want %q", out, "after-crash\n")
	}

	p2.signal(syscall.SIGINT)
	if code := p2.wait(); code != 0 {
		t.Fatalf("atrium dev exited %d on SIGINT, want 0", code)
	}
}

// TestDev_Interrupt: Ctrl-C on `atrium dev` with a running turn exits 0; the
// turn is recorded as cancelled, its sandbox processes are gone and the
// history is intact after a restart.
func TestDev_Interrupt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := uniqueSleep(2)

	p := startDev(t, dir)
	a := api{t: t, base: p.url, user: "alice"}
	sess := a.create("interrupt")
	a.prompt(sess.ID, "echo first")
	if fin := a.waitTurn(sess.ID, 1); fin.field("status") != string(session.TurnOK) {
		t.Fatalf("turn 1: %s, want ok", fin.raw)
	}
	a.prompt(sess.ID, "echo long-start; exec sleep "+marker)
	a.waitFor(sess.ID, "output of turn 2", func(ev e2eEvent) bool {
		return ev.Kind == session.KindOutput && ev.turn() == 2
	})
	before := a.events(sess.ID)

	p.signal(syscall.SIGINT)
	if code := p.wait(); code != 0 {
		t.Fatalf("atrium dev exited %d on SIGINT, want 0", code)
	}
	waitNoProcessWith(t, marker)

	p2 := startDev(t, dir)
	a2 := api{t: t, base: p2.url, user: "alice"}
	fin := a2.waitTurn(sess.ID, 2)
	if fin.field("status") != string(session.TurnCancelled) {
		t.Fatalf("the turn running at Ctrl-C closed with %s, want status cancelled", fin.raw)
	}
	after := a2.events(sess.ID)
	for _, ev := range before {
		if ev.Seq > int64(len(after)) || !bytes.Equal(after[ev.Seq-1].raw, ev.raw) {
			t.Fatalf("event %d changed or lost over a clean shutdown:\n  before: %s\n  after: %s", ev.Seq, ev.raw, rawAt(after, ev.Seq))
		}
	}
	a2.prompt(sess.ID, "echo again")
	if fin := a2.waitTurn(sess.ID, 3); fin.field("status") != string(session.TurnOK) {
		t.Fatalf("turn 3 after the restart: %s, want ok", fin.raw)
	}
	p2.signal(syscall.SIGTERM)
	if code := p2.wait(); code != 0 {
		t.Fatalf("atrium dev exited %d on SIGTERM, want 0", code)
	}
}

func rawAt(evs []e2eEvent, seq int64) string {
	if seq < 1 || seq > int64(len(evs)) {
		return "(missing)"
	}
	return string(evs[seq-1].raw)
}

// rawsFrom lists the events after seq, skipping output events.
func rawsFrom(evs []e2eEvent, seq int64) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Seq > seq && ev.Kind != session.KindOutput {
			b.WriteString("  " + string(ev.raw) + "\n")
		}
	}
	return b.String()
}
