package actor

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// fakeAgentBin builds the scripted ACP agent (testdata/acpagent) once.
var fakeAgentBin struct {
	once sync.Once
	dir  string
	err  error
}

func buildFakeAgent(t testing.TB) string {
	t.Helper()
	fakeAgentBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "atrium-acpagent-")
		if err != nil {
			fakeAgentBin.err = err
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "acpagent"), "./testdata/acpagent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fakeAgentBin.err = err
			t.Logf("go build: %s", out)
			return
		}
		fakeAgentBin.dir = dir
	})
	if fakeAgentBin.err != nil {
		t.Fatalf("build the scripted agent: %v", fakeAgentBin.err)
	}
	return fakeAgentBin.dir
}

// fakeAgents is the test's agent catalog: one agent, "fake", the scripted
// ACP agent mounted read-only at /opt/fakeagent, keeping its sessions in the
// workspace.
type fakeAgents struct {
	dir      string
	load     bool   // the agent supports session/load
	mode     string // the session mode to select
	launches atomic.Int32
	lastMode atomic.Pointer[string] // the permission mode of the last launch
	lastName atomic.Pointer[string] // the agent of the last launch
}

func (f *fakeAgents) Check(name string) error {
	if name != "fake" && name != "fake2" { // fake2: the same program under another name
		return session.Errorf(session.CodeBadRequest, "agent %s is not installed on this node; run: atrium agents install %s", name, name)
	}
	return nil
}

func (f *fakeAgents) Launch(name string, _ session.ID, ep compute.ModelEndpoints, mode string) (AgentLaunch, error) {
	if err := f.Check(name); err != nil {
		return AgentLaunch{}, err
	}
	f.launches.Add(1)
	f.lastMode.Store(&mode)
	f.lastName.Store(&name)
	env := []string{"FAKE_ACP_STATE=/workspace/.fakeacp", "FAKE_TOKEN=" + ep.Token}
	if f.load {
		env = append(env, "FAKE_ACP_LOAD=1")
	}
	return AgentLaunch{
		Argv: []string{"/opt/fakeagent/acpagent"}, Env: env, LoadSession: f.load, SessionMode: f.mode,
		Mounts: []compute.Mount{{Host: f.dir, Sandbox: "/opt/fakeagent", ReadOnly: true}},
	}, nil
}

// fakeModels records the model gateway calls.
type fakeModels struct {
	mu        sync.Mutex
	issued    []string
	active    map[string]int64
	activated []int64
	revoked   []string
}

func (m *fakeModels) Issue(id session.ID, _ string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	tok := "tok-" + string(id) + "-" + string(rune('a'+len(m.issued)))
	m.issued = append(m.issued, tok)
	return tok
}

func (m *fakeModels) Activate(token string, turn int64, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active == nil {
		m.active = map[string]int64{}
	}
	m.active[token] = turn
	m.activated = append(m.activated, turn)
	return nil
}

func (m *fakeModels) Deactivate(token string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.active, token)
}

func (m *fakeModels) Revoke(token string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.revoked = append(m.revoked, token)
}

func (m *fakeModels) Endpoints() compute.ModelEndpoints {
	return compute.ModelEndpoints{Anthropic: "http://" + compute.ModelAddr}
}

func (m *fakeModels) counts() (issued, revoked, active int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.issued), len(m.revoked), len(m.active)
}

func withAgents(a Agents, m Models) envOption {
	return func(c *Config) { c.Agents, c.Models = a, m }
}

func agentSession() session.Harness { return session.Harness{Agent: "fake"} }

// deltas collects a session's delta frames.
type deltas struct {
	mu  sync.Mutex
	got []session.DeltaFrame
}

func (e *env) deltas(id session.ID) *deltas {
	e.t.Helper()
	d := &deltas{}
	sub, err := e.gw.Subscribe(e.subj.Delta(id), func(m *nats.Msg) {
		var f session.DeltaFrame
		if err := json.Unmarshal(m.Data, &f); err == nil {
			d.mu.Lock()
			d.got = append(d.got, f)
			d.mu.Unlock()
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.gw.Flush()
	e.t.Cleanup(func() { sub.Unsubscribe() })
	return d
}

func (d *deltas) of(messageID string) []session.DeltaFrame {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []session.DeltaFrame
	for _, f := range d.got {
		if f.MessageID == messageID {
			out = append(out, f)
		}
	}
	return out
}

// turnEvents returns the events of turn n seen by w (between its
// turn_started and turn_finished), sandbox events left out.
func turnEvents(t testing.TB, w *watcher, n int64) []session.Event {
	t.Helper()
	var out []session.Event
	in := false
	for _, ev := range w.evs {
		switch ev.Kind {
		case session.KindTurnStarted:
			in = data[session.TurnStartedData](t, ev).Turn == n
			continue
		case session.KindTurnFinished:
			if in {
				return out
			}
		}
		if in && ev.Kind != session.KindSandbox {
			out = append(out, ev)
		}
	}
	return out
}

func kinds(evs []session.Event) string {
	var ks []string
	for _, ev := range evs {
		ks = append(ks, string(ev.Kind))
	}
	return strings.Join(ks, " ")
}

// runTurn prompts and waits for the turn to finish.
func agentRun(t testing.TB, e *env, w *watcher, id session.ID, turn int64, text string) session.TurnFinishedData {
	t.Helper()
	e.prompt(id, "alice", text)
	return data[session.TurnFinishedData](t, w.until("turn_finished", finished(turn)))
}

func lastMessage(t testing.TB, evs []session.Event) string {
	t.Helper()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == session.KindAgentMessage {
			return data[session.AgentMessageData](t, evs[i]).Text
		}
	}
	return ""
}

func TestAgent_Turns(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: true, mode: "ask"}
	models := &fakeModels{}
	e := newEnv(t, withAgents(agents, models))
	id := e.create("alice", agentSession())
	w := e.watch(id)
	dl := e.deltas(id)
	turn := int64(0)
	next := func(text string) (session.TurnFinishedData, []session.Event) {
		t.Helper()
		turn++
		fin := agentRun(t, e, w, id, turn, text)
		return fin, turnEvents(t, w, turn)
	}

	t.Run("message chunks", func(t *testing.T) {
		fin, evs := next("chunks 5")
		if fin.Status != session.TurnOK || kinds(evs) != "agent_message" {
			t.Fatalf("turn %+v, events %s", fin, summarize(evs))
		}
		m := data[session.AgentMessageData](t, evs[0])
		if m.Text != "w0 w1 w2 w3 w4 " || m.Turn != turn {
			t.Errorf("agent_message = %+v", m)
		}
		// The node coalesces the chunks (deltas.go): what the deltas
		// carry, concatenated, is the message, in at most 5 frames.
		text := func() string {
			var b strings.Builder
			for _, d := range dl.of(m.MessageID) {
				b.WriteString(d.Text)
			}
			return b.String()
		}
		eventually(t, "the deltas to carry the message", func() bool { return text() == m.Text })
		if got := dl.of(m.MessageID); len(got) > 5 || got[0].Type != "delta" || got[0].Turn != turn || !strings.HasPrefix(got[0].Text, "w0 ") {
			t.Errorf("deltas = %+v", got)
		}
	})
	t.Run("tool call with diff", func(t *testing.T) {
		fin, evs := next("tool")
		if fin.Status != session.TurnOK || kinds(evs) != "agent_message tool_call tool_call_update agent_message" {
			t.Fatalf("turn %+v, events %s", fin, summarize(evs))
		}
		tc := data[session.ToolCallData](t, evs[1])
		if tc.ID != "call-1" || tc.Kind != "edit" || len(tc.Content) != 1 || tc.Content[0].Type != "diff" ||
			*tc.Content[0].OldText != "old\n" || tc.Content[0].NewText != "new\n" {
			t.Errorf("tool_call = %s", evs[1].Data)
		}
		if up := data[session.ToolCallUpdateData](t, evs[2]); up.Status != "completed" {
			t.Errorf("tool_call_update = %s", evs[2].Data)
		}
	})
	t.Run("update-only tool call and plan", func(t *testing.T) {
		if _, evs := next("gemini"); kinds(evs) != "tool_call tool_call_update" {
			t.Errorf("events %s", summarize(evs))
		}
		if _, evs := next("plan"); kinds(evs) != "plan" {
			t.Errorf("events %s", summarize(evs))
		}
	})
	t.Run("session mode", func(t *testing.T) {
		if _, evs := next("mode"); lastMessage(t, evs) != "mode: ask" {
			t.Errorf("events %s", summarize(evs))
		}
	})
	if n := agents.launches.Load(); n != 1 {
		t.Errorf("agent launched %d times for 5 turns, want once", n)
	}
	t.Run("approval with options", func(t *testing.T) {
		for _, answer := range []session.Command{
			{Op: session.OpApprove, OptionID: "always"},
			{Op: session.OpApprove, Allow: false},
			{Op: session.OpApprove, Allow: true},
		} {
			turn++
			e.prompt(id, "alice", "ask")
			req := data[session.ApprovalRequestedData](t, w.until("approval_requested", isKind(session.KindApprovalRequested)))
			if req.Title != "rm -rf build" || req.Kind != "execute" || len(req.Options) != 3 || req.Options[1].Kind != "allow_always" {
				t.Fatalf("approval_requested = %+v", req)
			}
			if rep := e.cmd(id, "alice", session.Command{Op: session.OpApprove, ApprovalID: req.ID, OptionID: "nope"}); rep.Error == nil {
				t.Errorf("an unknown option was accepted")
			}
			answer.ApprovalID = req.ID
			if rep := e.cmd(id, "alice", answer); rep.Error != nil {
				t.Fatalf("approve: %v", rep.Error)
			}
			res := data[session.ApprovalResolvedData](t, w.until("approval_resolved", isKind(session.KindApprovalResolved)))
			w.until("turn_finished", finished(turn))
			want := map[bool]string{true: "allow", false: "reject"}[answer.Allow]
			if answer.OptionID != "" {
				want = answer.OptionID
			}
			if res.OptionID != want || res.Allow != (want != "reject") {
				t.Errorf("approval_resolved = %+v, want option %s", res, want)
			}
			if got := lastMessage(t, turnEvents(t, w, turn)); got != "chose "+want {
				t.Errorf("agent said %q, want %q", got, "chose "+want)
			}
		}
	})
	t.Run("cancel, then a restarted agent loads the session", func(t *testing.T) {
		before := agents.launches.Load()
		turn++
		e.prompt(id, "alice", "sleep")
		// The message is recorded once the agent stops writing it (at
		// the cancel): its delta says the agent is prompted.
		eventually(t, "the agent to be prompted", func() bool {
			dl.mu.Lock()
			defer dl.mu.Unlock()
			return len(dl.got) > 0 && dl.got[len(dl.got)-1].Text == "sleeping"
		})
		e.cmd(id, "alice", session.Command{Op: session.OpCancel})
		if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(turn))); fin.Status != session.TurnCancelled {
			t.Errorf("cancelled turn finished %+v", fin)
		}
		fin, evs := next("recall")
		if fin.Status != session.TurnOK {
			t.Fatalf("turn after cancel: %+v %s", fin, summarize(evs))
		}
		if n := agents.launches.Load(); n != before+1 {
			t.Errorf("launches %d → %d, want a restart after the cancel", before, n)
		}
		got := lastMessage(t, evs)
		if !strings.Contains(got, "known: chunks 5,tool,gemini,plan,mode,ask,ask,ask,sleep;") || !strings.HasSuffix(got, "transcript: ") {
			t.Errorf("recall after load = %q, want the earlier prompts from the loaded session and no transcript", got)
		}
		if strings.Contains(kinds(evs), "agent_message agent_message") || strings.Contains(string(evs[0].Data), "replay") {
			t.Errorf("the load's replay was recorded: %s", summarize(evs))
		}
	})
	t.Run("crash mid-turn, then recovery", func(t *testing.T) {
		before := agents.launches.Load()
		fin, _ := next("crash")
		if fin.Status != session.TurnFailed {
			t.Fatalf("crash turn %+v", fin)
		}
		var errs []string
		for _, ev := range turnEvents(t, w, turn) {
			if ev.Kind == session.KindError {
				errs = append(errs, data[session.ErrorData](t, ev).Message)
			}
		}
		if len(errs) != 1 || !strings.Contains(errs[0], "fatal: the fake agent crashed on purpose") {
			t.Errorf("errors = %q, want the agent's stderr tail", errs)
		}
		fin, evs := next("hello again")
		if fin.Status != session.TurnOK || lastMessage(t, evs) != "echo: hello again" {
			t.Errorf("turn after crash %+v %s", fin, summarize(evs))
		}
		if n := agents.launches.Load(); n != before+1 {
			t.Errorf("launches %d → %d, want a new process after the crash", before, n)
		}
	})
	t.Run("model tokens", func(t *testing.T) {
		issued, revoked, active := models.counts()
		if issued != int(agents.launches.Load()) || revoked != issued-1 || active != 0 {
			t.Errorf("tokens issued %d, revoked %d, active %d; want one per process, all but the live one revoked, none active between turns",
				issued, revoked, active)
		}
	})
	t.Run("usage and over budget", func(t *testing.T) {
		turn++
		e.prompt(id, "alice", "sleep")
		eventually(t, "the agent to be prompted", func() bool {
			dl.mu.Lock()
			defer dl.mu.Unlock()
			return len(dl.got) > 0 && dl.got[len(dl.got)-1].Turn == turn
		})
		e.host.RecordUsage(id, turn, session.UsageData{Model: "m", InputTokens: 10, OutputTokens: 5})
		u := data[session.UsageData](t, w.until("usage", isKind(session.KindUsage)))
		if u.Turn != turn || u.InputTokens != 10 {
			t.Errorf("usage = %+v", u)
		}
		// A request the gateway refused is said in the session; the turn goes on.
		e.host.SayError(id, turn, session.CodeNotFound, `model "x" is not configured`)
		said := data[session.ErrorData](t, w.until("the refusal", isKind(session.KindError)))
		if said.Code != session.CodeNotFound || !strings.Contains(said.Message, `model "x"`) {
			t.Errorf("refusal error = %+v", said)
		}
		e.host.EndTurn(id, turn, session.CodeTooManyRequests, "the session is over its budget")
		fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(turn)))
		if fin.Status != session.TurnFailed {
			t.Errorf("over-budget turn finished %+v", fin)
		}
		var e1 *session.ErrorData
		for _, ev := range turnEvents(t, w, turn) {
			if ev.Kind == session.KindError {
				d := data[session.ErrorData](t, ev)
				e1 = &d
			}
		}
		if e1 == nil || e1.Code != session.CodeTooManyRequests {
			t.Errorf("error event = %+v", e1)
		}
	})
	t.Run("no raw output events", func(t *testing.T) {
		for _, ev := range w.evs {
			if ev.Kind == session.KindOutput || ev.Kind == session.KindAgent {
				t.Errorf("agent session logged %s %s", ev.Kind, ev.Data)
			}
		}
	})
}

// An agent that cannot load its session gets a transcript of the earlier
// turns with its first prompt.
func TestAgent_Rehydrate(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: false}
	e := newEnv(t, withAgents(agents, nil))
	id := e.create("alice", agentSession())
	w := e.watch(id)
	agentRun(t, e, w, id, 1, "remember the word avocado")
	agentRun(t, e, w, id, 2, "crash")
	if fin := agentRun(t, e, w, id, 3, "recall"); fin.Status != session.TurnOK {
		t.Fatalf("recall %+v", fin)
	}
	got := lastMessage(t, turnEvents(t, w, 3))
	if !strings.Contains(got, "known: ;") || !strings.Contains(got, "User alice: remember the word avocado") || !strings.Contains(got, "User alice: crash") {
		t.Errorf("recall = %q, want a new session re-hydrated with the earlier prompts", got)
	}
	if n := agents.launches.Load(); n != 2 {
		t.Errorf("launches = %d, want 2", n)
	}
}

// An agent that supports session/load but lost its session (its home was
// lost) is re-hydrated too.
func TestAgent_LoadFailsRehydrates(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: true}
	e := newEnv(t, withAgents(agents, nil))
	id := e.create("alice", agentSession())
	w := e.watch(id)
	agentRun(t, e, w, id, 1, "remember the word avocado")
	agentRun(t, e, w, id, 2, "forget")
	agentRun(t, e, w, id, 3, "crash")
	if fin := agentRun(t, e, w, id, 4, "recall"); fin.Status != session.TurnOK {
		t.Fatalf("recall %+v", fin)
	}
	got := lastMessage(t, turnEvents(t, w, 4))
	if !strings.Contains(got, "known: ;") || !strings.Contains(got, "User alice: remember the word avocado") {
		t.Errorf("recall = %q, want a new session re-hydrated with the earlier prompts", got)
	}
}

// Output that is not JSON-RPC, and a 10 MB message, are said in bounded
// error events; the turn goes on.
func TestAgent_MalformedOutput(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t)}
	e := newEnv(t, withAgents(agents, nil))
	id := e.create("alice", agentSession())
	w := e.watch(id)
	fin := agentRun(t, e, w, id, 1, "garbage")
	evs := turnEvents(t, w, 1)
	if fin.Status != session.TurnOK || kinds(evs) != "error error agent_message" || lastMessage(t, evs) != "still here" {
		t.Fatalf("turn %+v events %s", fin, summarize(evs))
	}
	for _, ev := range evs[:2] {
		if len(ev.Data) > 512 || strings.Contains(string(ev.Data), "this is not") {
			t.Errorf("error event %s is unbounded or quotes the agent", ev.Data)
		}
	}
	if fin := agentRun(t, e, w, id, 2, "hello"); fin.Status != session.TurnOK || agents.launches.Load() != 1 {
		t.Errorf("next turn %+v, launches %d", fin, agents.launches.Load())
	}
}

// The ACP session survives the agent process: after the sandbox slept,
// and after the node restarted, a new process loads it.
func TestAgent_LoadAfterSleepAndRestart(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t), load: true}
	e := newEnv(t, withAgents(agents, nil), withHibernate(200*time.Millisecond), func(c *Config) { c.SandboxSleepAfter = 300 * time.Millisecond })
	id := e.create("alice", agentSession())
	w := e.watch(id)
	agentRun(t, e, w, id, 1, "first")
	w.until("sandbox sleeping", func(ev session.Event) bool {
		return ev.Kind == session.KindSandbox && data[session.SandboxData](t, ev).State == session.SandboxSleeping
	})
	agentRun(t, e, w, id, 2, "second")
	if got := lastMessage(t, turnEvents(t, w, 2)); got != "echo: second" {
		t.Errorf("turn 2 said %q", got)
	}
	if n := agents.launches.Load(); n != 2 {
		t.Errorf("launches = %d after the sandbox slept, want 2", n)
	}
	// A new node process: the ACP session id comes from the history.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.host.Close(ctx); err != nil {
		t.Fatal(err)
	}
	e.start()
	fin := agentRun(t, e, w, id, 3, "recall")
	got := lastMessage(t, turnEvents(t, w, 3))
	if fin.Status != session.TurnOK || !strings.Contains(got, "known: first,second;") || !strings.HasSuffix(got, "transcript: ") {
		t.Errorf("recall after restart: %+v %q, want the loaded session", fin, got)
	}
}

func TestAgent_ApprovalTimeout(t *testing.T) {
	agents := &fakeAgents{dir: buildFakeAgent(t)}
	e := newEnv(t, withAgents(agents, nil), func(c *Config) { c.ApprovalTimeout = 300 * time.Millisecond })
	id := e.create("alice", agentSession())
	w := e.watch(id)
	fin := agentRun(t, e, w, id, 1, "ask")
	evs := turnEvents(t, w, 1)
	if fin.Status != session.TurnOK || kinds(evs) != "approval_requested error approval_resolved agent_message" {
		t.Fatalf("turn %+v events %s", fin, summarize(evs))
	}
	if msg := data[session.ErrorData](t, evs[1]).Message; !strings.Contains(msg, "was not answered within") {
		t.Errorf("error = %q", msg)
	}
	if res := data[session.ApprovalResolvedData](t, evs[2]); res.Allow || res.OptionID != "reject" || evs[2].By != session.BySystem {
		t.Errorf("approval_resolved = %s by %s", evs[2].Data, evs[2].By)
	}
	if got := lastMessage(t, evs); got != "chose reject" {
		t.Errorf("agent said %q", got)
	}
}

func TestAgent_NotInstalled(t *testing.T) {
	e := newEnv(t, withAgents(&fakeAgents{dir: t.TempDir()}, nil))
	rep := e.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: session.NewID(), Harness: session.Harness{Agent: "claude"}})
	if rep.Error == nil || rep.Error.Code != session.CodeBadRequest || !strings.Contains(rep.Error.Message, "atrium agents install claude") {
		t.Errorf("create with a missing agent: %+v", rep.Error)
	}
	e2 := newEnv(t)
	rep = e2.place("alice", session.PlaceRequest{Op: session.PlaceCreate, Session: session.NewID(), Harness: session.Harness{Agent: "fake"}})
	if rep.Error == nil || rep.Error.Code != session.CodeBadRequest {
		t.Errorf("create on a node without agents: %+v", rep.Error)
	}
}

// A harness with "stdin":"text" reads the prompt alone, to end of input.
func TestAgent_HarnessStdinText(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", session.Harness{Command: []string{"bash", "-c", `cat; echo; echo END`}, Stdin: session.HarnessStdinText})
	w := e.watch(id)
	fin := agentRun(t, e, w, id, 1, "line one\nline two")
	if got := outputText(t, w.evs, 1, "stdout"); fin.Status != session.TurnOK || got != "line one\nline two\nEND\n" {
		t.Errorf("turn %+v stdout %q", fin, got)
	}
}

// BenchmarkAgent_FirstDelta measures, on a warm agent that answers at once,
// the time from a prompt's acknowledgement to its first delta reaching a
// watcher (the node's overhead per turn, DESIGN's < 20 ms p50 goal).
func BenchmarkAgent_FirstDelta(b *testing.B) {
	agents := &fakeAgents{dir: buildFakeAgent(b)}
	e := newEnv(b, withAgents(agents, nil))
	id := e.create("alice", agentSession())
	w := e.watch(id)
	first := make(chan time.Time, 1)
	sub, err := e.gw.Subscribe(e.subj.Delta(id), func(*nats.Msg) {
		select {
		case first <- time.Now():
		default:
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	agentRun(b, e, w, id, 1, "warm up")
	<-first
	var total time.Duration
	b.ResetTimer()
	for i := range b.N {
		e.prompt(id, "alice", "hello")
		acked := time.Now()
		total += (<-first).Sub(acked)
		w.until("turn_finished", finished(int64(i+2)))
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/first-delta")
}
