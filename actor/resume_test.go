package actor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// writeHistory creates the history of a new session owned by alice with the
// shell harness and the given events after session_created (seq 2, 3, …),
// as a node that stopped would have left it. Each event is kind + data.
func (e *env) writeHistory(evs ...any) session.ID {
	e.t.Helper()
	id := session.NewID()
	now := time.Now().UTC()
	m := session.Meta{ID: id, Title: "left behind", Owner: "alice", Epoch: "ep", CreatedAt: session.Time{Time: now},
		Members: session.Members{"alice": session.RoleOwner}, Harness: shell()}
	l, err := (&sqlite.Dir{Path: e.dir.Path}).Create(context.Background(), m)
	if err != nil {
		e.t.Fatal(err)
	}
	defer l.Close()
	stored := []session.Stored{encodeEvent(1, "ep", now, session.KindSessionCreated, "alice", mustMarshal(session.SessionCreatedData{Title: m.Title}))}
	for i := 0; i < len(evs); i += 2 {
		seq := session.Seq(len(stored) + 1)
		stored = append(stored, encodeEvent(seq, "ep", now, evs[i].(session.Kind), "alice", mustMarshal(evs[i+1])))
	}
	if err := l.Append(context.Background(), stored); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// putCatalog writes id's catalog entry as its node would have left it.
func (e *env) putCatalog(id session.ID, state session.State, last session.Seq) {
	e.t.Helper()
	b, _ := json.Marshal(session.CatalogEntry{ID: id, Owner: "alice", Members: session.Members{"alice": session.RoleOwner},
		Epoch: "ep", State: state, LastSeq: last, Sandbox: session.SandboxNone})
	if _, err := e.kv.Put(context.Background(), string(id), b); err != nil {
		e.t.Fatal(err)
	}
}

// turnStarts returns the prompt_seq of each turn_started of evs, by turn.
func turnStarts(t testing.TB, evs []session.Event) map[int64]session.Seq {
	out := map[int64]session.Seq{}
	for _, ev := range evs {
		if ev.Kind == session.KindTurnStarted {
			d := data[session.TurnStartedData](t, ev)
			out[d.Turn] = d.PromptSeq
		}
	}
	return out
}

// TestHost_ResumesQueuedPrompts activates histories whose node stopped with
// acknowledged prompts whose turns never started: they run, in order.
func TestHost_ResumesQueuedPrompts(t *testing.T) {
	e := newEnv(t)
	// The node stopped during turn 1, with two prompts queued behind it.
	id := e.writeHistory(
		session.KindMessage, session.MessageData{Text: "echo one"}, // 2
		session.KindTurnStarted, session.TurnStartedData{Turn: 1, PromptSeq: 2}, // 3
		session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "on"}, // 4
		session.KindMessage, session.MessageData{Text: "echo two"}, // 5: queued
		session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "e\n"}, // 6
		session.KindMessage, session.MessageData{Text: "echo three", ClientID: "c3"}, // 7: queued
	)
	// And one that stopped before its first turn started.
	fresh := e.writeHistory(session.KindMessage, session.MessageData{Text: "echo first"})

	w, wf := e.watch(id), e.watch(fresh)
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpInfo}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	// Turn 1 is finished as interrupted (8, 9), then the queue runs.
	if d := data[session.TurnFinishedData](t, w.until("turn 1", finished(1))); d.Status != session.TurnFailed {
		t.Errorf("turn 1 = %+v", d)
	}
	w.until("turn 3", finished(3))
	if got := turnStarts(t, w.evs); got[2] != 5 || got[3] != 7 {
		t.Errorf("turns ran prompts %v, want 2:5 3:7", got)
	}
	if out2, out3 := outputText(t, w.evs, 2, "stdout"), outputText(t, w.evs, 3, "stdout"); out2 != "two\n" || out3 != "three\n" {
		t.Errorf("stdout of turns 2 and 3 = %q, %q", out2, out3)
	}
	checkContiguous(t, decode(t, e.history(id, "alice")))

	e.cmd(fresh, "alice", session.Command{Op: session.OpInfo})
	wf.until("turn 1", finished(1))
	if got := turnStarts(t, wf.evs); got[1] != 2 {
		t.Errorf("turn 1 ran prompt %d, want 2", got[1])
	}
	if out := outputText(t, wf.evs, 1, "stdout"); out != "first\n" {
		t.Errorf("stdout = %q", out)
	}
}

// TestHost_StartResumesActiveSessions restarts a node with nobody connected:
// sessions that were active when it stopped finish their interrupted turn
// and run their queued prompts without any command; Close leaves a session
// with queued prompts active in the catalog so that this happens.
func TestHost_StartResumesActiveSessions(t *testing.T) {
	e := newEnv(t, withGrace(200*time.Millisecond))

	// A clean shutdown while a turn runs and another prompt waits.
	busy := e.create("alice", shell())
	quiet := e.create("alice", shell())
	w := e.watch(busy)
	e.prompt(busy, "alice", "echo started; sleep 100")
	w.until("turn 1 output", isKind(session.KindOutput))
	queued := e.prompt(busy, "alice", "echo resumed")
	e.prompt(quiet, "alice", "echo done")
	if err := e.host.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c, _ := e.catalog(busy); c.State != session.StateActive {
		t.Errorf("catalog of a session with a queued prompt after close = %+v, want active", c)
	}
	if c, _ := e.catalog(quiet); c.State != session.StateHibernated {
		t.Errorf("catalog of an idle session after close = %+v, want hibernated", c)
	}

	// A crash: the catalog still says active, a turn was running and a
	// prompt was queued.
	crashed := e.writeHistory(
		session.KindMessage, session.MessageData{Text: "sleep 100"}, // 2
		session.KindTurnStarted, session.TurnStartedData{Turn: 1, PromptSeq: 2}, // 3
		session.KindMessage, session.MessageData{Text: "echo after crash"}, // 4
	)
	e.putCatalog(crashed, session.StateActive, 4)
	// A session some other node left active, whose history is not here.
	e.putCatalog(session.NewID(), session.StateActive, 9)

	w2 := e.watch(crashed)
	e.start() // and no command at all from here on
	fin := data[session.TurnFinishedData](t, w.until("turn 2 of the busy session", finished(2)))
	if fin.Status != session.TurnOK || outputText(t, w.evs, 2, "stdout") != "resumed\n" {
		t.Errorf("resumed turn = %+v, stdout %q", fin, outputText(t, w.evs, 2, "stdout"))
	}
	if got := turnStarts(t, w.evs); got[2] != queued {
		t.Errorf("turn 2 ran prompt %d, want %d", got[2], queued)
	}
	if d := data[session.TurnFinishedData](t, w2.until("interrupted turn finished", finished(1))); d.Status != session.TurnFailed {
		t.Errorf("interrupted turn = %+v", d)
	}
	w2.until("queued turn after the crash", finished(2))
	if out := outputText(t, w2.evs, 2, "stdout"); out != "after crash\n" {
		t.Errorf("stdout = %q", out)
	}
	eventually(t, "catalog of the crashed session is current", func() bool {
		c, _ := e.catalog(crashed)
		return c.State == session.StateActive && c.LastSeq == w2.evs[len(w2.evs)-1].Seq
	})
}

// TestHost_CatalogFreshness checks that an active session's catalog entry
// follows its log: at the end of each turn at once, and otherwise at most
// once per CatalogInterval while events are committed.
func TestHost_CatalogFreshness(t *testing.T) {
	t.Run("during a turn", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.CatalogInterval = 100 * time.Millisecond })
		id := e.create("alice", shell())
		w := e.watch(id)
		e.prompt(id, "alice", "for i in 1 2 3 4 5; do echo line $i; sleep 0.05; done; sleep 100")
		last := w.until("the last line", func(ev session.Event) bool {
			return ev.Kind == session.KindOutput && strings.Contains(string(ev.Data), "line 5")
		}).Seq
		eventually(t, "catalog catches up while the turn runs", func() bool {
			c, _ := e.catalog(id)
			return c.LastSeq >= last && c.Sandbox == session.SandboxReady && c.State == session.StateActive
		})
	})
	t.Run("coalesced, and at once at the end of a turn", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.CatalogInterval = time.Hour })
		id := e.create("alice", command("bash", "-c", "read -r line; echo ready; sleep 100"))
		w := e.watch(id)
		e.prompt(id, "alice", "go")
		w.until("ready", isKind(session.KindOutput))
		// settled returns the catalog once every write the session has
		// scheduled so far is done (the info round trip orders it after
		// the commits it waits for).
		settled := func() session.CatalogEntry {
			e.cmd(id, "alice", session.Command{Op: session.OpInfo})
			e.host.catalog.flush()
			c, _ := e.catalog(id)
			return c
		}
		before := settled()
		for i := range 10 {
			e.prompt(id, "alice", fmt.Sprint("queued ", i))
		}
		if c := settled(); c.LastSeq != before.LastSeq {
			t.Errorf("catalog last_seq went from %d to %d within one interval", before.LastSeq, c.LastSeq)
		}
		// The end of the turn is written at once.
		if rep := e.cmd(id, "alice", session.Command{Op: session.OpCancel}); rep.Error != nil {
			t.Fatal(rep.Error)
		}
		fin := w.until("turn 1 finished", finished(1)).Seq
		eventually(t, "catalog shows the end of turn 1", func() bool {
			c, _ := e.catalog(id)
			return c.LastSeq >= fin
		})
	})
}

// failingHistories wraps Histories so a test can make one Append block and
// then fail.
type failingHistories struct {
	Histories
	arm     atomic.Bool   // the next Append blocks on gate and fails
	entered chan struct{} // receives when an armed Append is blocked
	gate    chan struct{} // closed to let it fail
}

type failingHistory struct {
	History
	f *failingHistories
}

func (f *failingHistories) Create(ctx context.Context, m session.Meta) (History, error) {
	h, err := f.Histories.Create(ctx, m)
	if err != nil {
		return nil, err
	}
	return failingHistory{h, f}, nil
}

func (f *failingHistories) Open(ctx context.Context, id session.ID) (History, error) {
	h, err := f.Histories.Open(ctx, id)
	if err != nil {
		return nil, err
	}
	return failingHistory{h, f}, nil
}

func (h failingHistory) Append(ctx context.Context, evs []session.Stored) error {
	if h.f.arm.CompareAndSwap(true, false) {
		h.f.entered <- struct{}{}
		<-h.f.gate
		return fmt.Errorf("append: %w", session.Errorf(session.CodeUnavailable, "injected failure"))
	}
	return h.History.Append(ctx, evs)
}

// TestHost_CommitFailureWithQueue fails a commit while more batches wait
// behind it: they are dropped too (they were numbered after it), every
// sender hears so, no seq is reused and the session goes on.
func TestHost_CommitFailureWithQueue(t *testing.T) {
	f := &failingHistories{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	e := newEnv(t, func(c *Config) {
		f.Histories = c.Histories
		c.Histories = f
	})
	var prompts atomic.Int64
	e.host.beforeCmd = func(_ session.ID, c *session.Command) {
		if c.Op == session.OpPrompt && strings.HasPrefix(c.Text, "doomed") {
			prompts.Add(1)
		}
	}
	id := e.create("alice", command("sleep", "100"))
	w := e.watch(id)
	first := e.prompt(id, "alice", "runs")
	w.until("sandbox ready", func(ev session.Event) bool {
		return ev.Kind == session.KindSandbox && data[session.SandboxData](t, ev).State == session.SandboxReady
	})

	f.arm.Store(true)
	const n = 8
	errs := make([]*session.Error, n)
	var wg sync.WaitGroup
	send := func(i int) {
		wg.Go(func() {
			rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpPrompt, Text: fmt.Sprint("doomed ", i)})
			if err != nil {
				t.Error(err)
			}
			errs[i] = rep.Error
		})
	}
	send(0)
	<-f.entered // prompt 0's commit is under way, and will fail
	for i := 1; i < n; i++ {
		send(i)
	}
	// Every other prompt has been handled, so queued behind it, before it
	// fails.
	eventually(t, "all prompts handled", func() bool { return prompts.Load() == n })
	e.cmd(id, "alice", session.Command{Op: session.OpInfo})
	close(f.gate)
	wg.Wait()
	for i, err := range errs {
		// Those queued behind it are told its cause too.
		want := "injected failure"
		if err == nil || err.Code != session.CodeUnavailable || err.Message != want {
			t.Errorf("prompt %d: %+v, want unavailable: %s", i, err, want)
		}
	}
	next := e.prompt(id, "alice", "after")
	evs := decode(t, e.history(id, "alice"))
	checkContiguous(t, evs)
	for _, ev := range evs {
		if ev.Kind == session.KindMessage && strings.HasPrefix(data[session.MessageData](t, ev).Text, "doomed") {
			t.Errorf("a failed prompt is in the log at %d", ev.Seq)
		}
	}
	if next <= first || evs[next-1].Kind != session.KindMessage || data[session.MessageData](t, evs[next-1]).Text != "after" {
		t.Errorf("prompt after the failure has seq %d; log:%s", next, summarize(evs))
	}
	// Watchers never saw a seq twice.
	seen := map[session.Seq]bool{}
	for _, ev := range w.evs {
		if seen[ev.Seq] {
			t.Errorf("seq %d published twice", ev.Seq)
		}
		seen[ev.Seq] = true
	}
}
