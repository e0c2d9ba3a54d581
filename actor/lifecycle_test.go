package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// openFiles returns the open file descriptors of this process whose path
// contains s.
func openFiles(t testing.TB, s string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.Contains(p, s) {
			out = append(out, p)
		}
	}
	return out
}

func TestHost_HibernateAndWake(t *testing.T) {
	e := newEnv(t, withHibernate(50*time.Millisecond))
	// Let the host's own goroutines settle before taking the baseline:
	// one session's life starts those the NATS client and server start on
	// first use (JetStream's async publish, the stream's flusher).
	warm := e.create("alice", shell())
	eventually(t, "warm-up session hibernated", func() bool {
		c, ok := e.catalog(warm)
		return ok && c.State == session.StateHibernated && len(openFiles(t, string(warm))) == 0
	})
	base := goroutinesOutsideSandboxes()

	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo one")
	w.until("turn 1", finished(1))
	if len(openFiles(t, string(id))) == 0 {
		t.Fatal("an active session has no open history file")
	}

	eventually(t, "catalog says hibernated", func() bool {
		c, ok := e.catalog(id)
		return ok && c.State == session.StateHibernated
	})
	c, _ := e.catalog(id)
	last := w.evs[len(w.evs)-1].Seq
	if c.LastSeq != last || c.Owner != "alice" || c.Sandbox != session.SandboxReady {
		t.Errorf("catalog = %+v, want last_seq %d", c, last)
	}
	eventually(t, "no open history file", func() bool { return len(openFiles(t, string(id))) == 0 })
	// The sandbox stays awake while the session hibernates: its goroutines
	// are not counted.
	eventually(t, "goroutines back to baseline", func() bool { return goroutinesOutsideSandboxes() <= base })
	// Nobody serves the Cmd subject of a hibernated session.
	if _, err := e.request(e.subj.Cmd(id), "alice", session.Command{Op: session.OpInfo}, time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("request to a hibernated session: %v, want no responders", err)
	}

	// The next command wakes it; numbering continues.
	seq := e.prompt(id, "alice", "echo two")
	if seq != last+1 {
		t.Errorf("prompt after wake has seq %d, want %d", seq, last+1)
	}
	w.until("turn 2", finished(2))
	if got := outputText(t, w.evs, 2, "stdout"); got != "two\n" {
		t.Errorf("stdout = %q", got)
	}
	checkContiguous(t, decode(t, e.history(id, "alice")))
}

// TestHost_HibernationRaces sends commands from several clients while the
// session hibernates and wakes all the time: every command is answered once,
// and every acknowledged prompt is in the log.
func TestHost_HibernationRaces(t *testing.T) {
	e := newEnv(t, withHibernate(time.Millisecond))
	id := e.create("alice", command("true"))
	const clients, each = 4, 25
	var mu sync.Mutex
	acked := map[session.Seq]string{}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				if i%3 == 0 {
					time.Sleep(time.Duration(i%7) * time.Millisecond) // let it fall asleep
				}
				text := fmt.Sprintf("c%d-%d", c, i)
				rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpPrompt, Text: text, ClientID: text})
				if err != nil || rep.Error != nil || rep.Seq == 0 {
					t.Errorf("prompt %s: %v %+v", text, err, rep.Error)
					return
				}
				if rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpInfo}); err != nil || rep.Error != nil {
					t.Errorf("info: %v %+v", err, rep.Error)
					return
				}
				mu.Lock()
				if prev, dup := acked[rep.Seq]; dup {
					t.Errorf("seq %d acknowledged for %s and %s", rep.Seq, prev, text)
				}
				acked[rep.Seq] = text
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	evs := decode(t, e.history(id, "alice"))
	checkContiguous(t, evs)
	texts := map[string]int{}
	for _, ev := range evs {
		if ev.Kind == session.KindMessage {
			texts[data[session.MessageData](t, ev).Text]++
		}
	}
	if len(acked) != clients*each {
		t.Errorf("%d prompts acknowledged, want %d", len(acked), clients*each)
	}
	for seq, text := range acked {
		if texts[text] != 1 || data[session.MessageData](t, evs[seq-1]).Text != text {
			t.Errorf("prompt %s (seq %d) is in the log %d times", text, seq, texts[text])
		}
	}
}

func TestHost_CrashRecovery(t *testing.T) {
	e := newEnv(t)
	id := session.NewID()
	// A history whose process died during turn 4.
	dir := &sqlite.Dir{Path: e.dir.Path}
	now := time.Now().UTC()
	m := session.Meta{ID: id, Title: "crashed", Owner: "alice", Epoch: "ep", CreatedAt: session.Time{Time: now},
		Members: session.Members{"alice": session.RoleOwner}}
	l, err := dir.Create(t.Context(), m)
	if err != nil {
		t.Fatal(err)
	}
	evs := []session.Stored{
		encodeEvent(1, "ep", now, session.KindSessionCreated, "alice", mustMarshal(session.SessionCreatedData{Title: "crashed"})),
		encodeEvent(2, "ep", now, session.KindMessage, "alice", mustMarshal(session.MessageData{Text: "sleep 100"})),
		encodeEvent(3, "ep", now, session.KindTurnStarted, "alice", mustMarshal(session.TurnStartedData{Turn: 4, PromptSeq: 2})),
		encodeEvent(4, "ep", now, session.KindOutput, session.BySystem, mustMarshal(session.OutputData{Turn: 4, Stream: "stdout", Text: "partial"})),
	}
	if err := l.Append(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	l.Close()

	w := e.watch(id)
	rep := e.cmd(id, "alice", session.Command{Op: session.OpInfo})
	if rep.Error != nil || rep.Session.LastSeq != 6 {
		t.Fatalf("info = %+v", rep)
	}
	got := decode(t, e.history(id, "alice"))
	checkContiguous(t, got)
	if len(got) != 6 || got[4].Kind != session.KindError || got[5].Kind != session.KindTurnFinished {
		t.Fatalf("history:%s", summarize(got))
	}
	if d := data[session.ErrorData](t, got[4]); d.Code != session.CodeUnavailable || d.Message != "turn 4 was interrupted because the server stopped" {
		t.Errorf("error = %+v", d)
	}
	if d := data[session.TurnFinishedData](t, got[5]); d.Turn != 4 || d.Status != session.TurnFailed || d.ExitCode != -1 {
		t.Errorf("turn_finished = %+v", d)
	}
	// Watchers saw them too, and turn numbering continues.
	w.until("recovered turn_finished", finished(4))
	e.prompt(id, "alice", "echo five")
	last := w.until("turn 5", finished(5)).Seq
	// Activating again does not repeat the recovery. (Closing the host
	// put the sandbox to sleep: one sandbox event.)
	e.host.Close(t.Context())
	e.start()
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpInfo}); rep.Session == nil || rep.Session.LastSeq != last+1 {
		t.Errorf("after restart: %+v (events:%s)", rep.Session, summarize(decode(t, e.history(id, "alice"))))
	}
}

func TestHost_PanicRestarts(t *testing.T) {
	e := newEnv(t)
	e.host.beforeCmd = func(id session.ID, c *session.Command) {
		if c.Op == session.OpPrompt && c.Text == "boom" {
			panic("test panic")
		}
	}
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo before")
	w.until("turn 1", finished(1))

	e.prompt(id, "alice", "echo started; sleep 100")
	w.until("turn 2 output", func(ev session.Event) bool {
		return ev.Kind == session.KindOutput && strings.Contains(string(ev.Data), "started")
	})
	rep := e.cmd(id, "alice", session.Command{Op: session.OpPrompt, Text: "boom"})
	if rep.Error == nil || rep.Error.Code != session.CodeInternal {
		t.Fatalf("prompt that panics = %+v, want internal", rep)
	}
	// The actor restarted from its file: the running turn is finished as
	// interrupted, and the session serves again.
	fin := data[session.TurnFinishedData](t, w.until("turn 2 finished", finished(2)))
	if fin.Status != session.TurnFailed || fin.ExitCode != -1 {
		t.Errorf("interrupted turn = %+v", fin)
	}
	e.prompt(id, "alice", "echo after")
	w.until("turn 3", finished(3))
	if got := outputText(t, w.evs, 3, "stdout"); got != "after\n" {
		t.Errorf("stdout = %q", got)
	}
	checkContiguous(t, decode(t, e.history(id, "alice")))
}

func TestHost_Delete(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", shell())
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	w := e.watch(id)
	e.prompt(id, "alice", "echo running; sleep 100")
	w.until("output", isKind(session.KindOutput))
	if rep := e.cmd(id, "bob", session.Command{Op: session.OpDelete}); rep.Error == nil || rep.Error.Code != session.CodeForbidden {
		t.Fatalf("driver delete = %+v", rep)
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpDelete}); rep.Error != nil {
		t.Fatalf("delete: %v", rep.Error)
	}
	// Watchers get the control message.
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, ok := w.next(time.Until(deadline))
		if !ok {
			t.Fatal("no deleted control message")
		}
		if m.Header.Get(session.HeaderControl) == string(session.ControlDeleted) {
			break
		}
	}
	if _, ok := e.catalog(id); ok {
		t.Error("catalog entry still there")
	}
	if e.dir.Exists(id) {
		t.Error("history file still there")
	}
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpInfo}); rep.Error == nil || rep.Error.Code != session.CodeNotFound {
		t.Errorf("info after delete = %+v", rep)
	}
}

func TestHost_CommitError(t *testing.T) {
	e := newEnv(t)
	e.dir.MaxBytes = 64 << 10 // a tiny history fills up quickly
	id := e.create("alice", command("true"))
	var ackd []session.Seq
	var full *session.Error
	for i := range 100 {
		rep := e.cmd(id, "alice", session.Command{Op: session.OpPrompt, Text: fmt.Sprintf("%d %s", i, strings.Repeat("p", 8<<10))})
		if rep.Error != nil {
			full = rep.Error
			break
		}
		ackd = append(ackd, rep.Seq)
	}
	if full == nil || full.Code != session.CodeUnavailable {
		t.Fatalf("prompts into a full history: %+v", full)
	}
	// Reads keep working, the log has no gap, and nothing unacknowledged
	// slipped in with a seq that was reused.
	evs := decode(t, e.history(id, "alice"))
	checkContiguous(t, evs)
	if last := ackd[len(ackd)-1]; evs[last-1].Kind != session.KindMessage {
		t.Errorf("acked seq %d is a %s", last, evs[last-1].Kind)
	}
	// Turns still run and log what fits; the durable seq the session
	// reports is never behind what history returned.
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpInfo}); rep.Error != nil || rep.Session.LastSeq < evs[len(evs)-1].Seq {
		t.Errorf("info = %+v, last event %d", rep.Session, evs[len(evs)-1].Seq)
	}
	checkContiguous(t, decode(t, e.history(id, "alice")))
}

func TestHost_CloseCancelsTurns(t *testing.T) {
	e := newEnv(t, withGrace(200*time.Millisecond))
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "trap '' TERM; echo running; while :; do sleep 0.05; done")
	w.until("output", isKind(session.KindOutput))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.host.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := e.host.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if n := openFiles(t, string(id)); len(n) != 0 {
		t.Errorf("open files after close: %v", n)
	}
	l, err := e.dir.Open(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raw, _, err := l.Range(t.Context(), 0, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	evs := decode(t, raw)
	checkContiguous(t, evs)
	// The turn is cancelled, then the sandbox is put to sleep.
	n := len(evs)
	if n < 3 || evs[n-3].Kind != session.KindError || evs[n-2].Kind != session.KindTurnFinished || evs[n-1].Kind != session.KindSandbox {
		t.Fatalf("log ends:%s", summarize(evs))
	}
	if d := data[session.ErrorData](t, evs[n-3]); !strings.Contains(d.Message, "shutting down") {
		t.Errorf("error = %+v", d)
	}
	if d := data[session.TurnFinishedData](t, evs[n-2]); d.Status != session.TurnCancelled {
		t.Errorf("turn_finished = %+v", d)
	}
	if d := data[session.SandboxData](t, evs[n-1]); d.State != session.SandboxSleeping || !strings.Contains(d.Detail, "shutting down") {
		t.Errorf("sandbox = %+v", d)
	}
	c, _ := e.catalog(id)
	if c.State != session.StateHibernated || c.LastSeq != evs[n-1].Seq {
		t.Errorf("catalog after close = %+v", c)
	}
}

// TestHost_ActivateWhileStopping places a session right when it is going to
// sleep (its catalog entry turns hibernated just before the actor stops):
// the request must wait for the old actor and reach a new one.
func TestHost_ActivateWhileStopping(t *testing.T) {
	e := newEnv(t, withHibernate(time.Millisecond))
	id := e.create("alice", command("true"))
	var rev uint64
	for i := range 30 {
		eventually(t, "hibernated", func() bool {
			ent, err := e.kv.Get(context.Background(), string(id))
			if err != nil || ent.Revision() <= rev {
				return false
			}
			var c session.CatalogEntry
			json.Unmarshal(ent.Value(), &c)
			if c.State == session.StateHibernated {
				rev = ent.Revision()
				return true
			}
			return false
		})
		rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpPrompt, Text: "wake"})
		if err != nil {
			t.Fatalf("activation %d: %v", i, err)
		}
		if rep.Error != nil {
			t.Fatalf("activation %d: %v", i, rep.Error)
		}
	}
}

// goroutinesOutsideSandboxes counts the goroutines whose stacks are not a
// local sandbox's (its zygote process's wait and output copies).
func goroutinesOutsideSandboxes() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "os/exec.") && !strings.Contains(g, "compute/local.") {
			count++
		}
	}
	return count
}
