package actor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/acp"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
)

// The agent runtime (DESIGN §6 "Agents: ACP, one process per awake
// sandbox"): a session whose harness names an agent runs it as one ACP agent
// process in its sandbox, kept across turns in the session's box (so it
// outlives the actor's hibernation, and dies with the sandbox). Each turn is
// one session/prompt, driven by the turn's runner (execAgent); the ACP
// client (compute/acp) maps what the agent reports to agent events, which
// take the same commit path, with the same credits, as a harness's.

// Agents is the node's catalog of ACP agents (compute/agents implements it).
type Agents interface {
	// Check returns nil if agent name can run on this node, else an error
	// matching session.ErrBadRequest that says what to do, such as
	// "agent claude is not installed on this node; run: atrium agents
	// install claude".
	Check(name string) error
	// Launch returns how to start agent name for session sess, reaching
	// its models through ep (ep.Token is the process's model token; ep is
	// zero without a model gateway), in the session's permission mode
	// (session.Harness.PermissionMode; "" for the node's). It errs like
	// Check.
	Launch(name string, sess session.ID, ep compute.ModelEndpoints, mode string) (AgentLaunch, error)
}

// AgentLaunch is how to start one agent process.
type AgentLaunch struct {
	// Argv and Env are the command and its environment inside the
	// sandbox (Env may hold the model token: never logged).
	Argv []string
	Env  []string
	// Mounts are bound into the sandbox: the agent's programs (read-only)
	// and the session's agent home.
	Mounts []compute.Mount
	// LoadSession says the agent's session/load works on this node (its
	// home, where it keeps its sessions, persists); the agent must also
	// advertise loadSession.
	LoadSession bool
	// Authenticate is the ACP auth method to call after initialize; ""
	// for none.
	Authenticate string
	// SessionMode is the ACP session mode to select after session/new or
	// session/load (the permission mode); "" for none.
	SessionMode string
	// WritesAfterAnswer says the agent writes its transcript into Home
	// after it answers a prompt: the turn's end waits for that write
	// (up to homeFlushWait) before it saves the home (agenthomeflush.go).
	WritesAfterAnswer bool
	// Home is the host directory mounted as the agent's home (HOME,
	// CODEX_HOME, its transcripts), which the node saves to the object
	// store beside the workspace and restores on another node; "" for
	// none. Launch may write settings files into it.
	Home string
}

// Models is the node's model gateway (compute/modelgw implements it): it
// issues the scoped tokens agent processes present as their API key.
type Models interface {
	// Issue returns a new token for one agent process of session id.
	Issue(id session.ID, tenant string) string
	// Activate lets token reach the models for turn (usage is attributed
	// to it); the gateway refuses a token outside a running turn.
	Activate(token string, turn int64, user string) error
	// Deactivate ends the turn of token.
	Deactivate(token string)
	// Revoke forgets token; its process has stopped.
	Revoke(token string)
	// Endpoints are the base URLs an agent in a sandbox uses.
	Endpoints() compute.ModelEndpoints
}

// Bounds of the agent runtime.
const (
	// DefaultApprovalTimeout is how long an agent's permission request
	// waits for a driver before it is rejected.
	DefaultApprovalTimeout = 15 * time.Minute
	// agentOpenTimeout bounds session/new and session/load.
	agentOpenTimeout = 2 * time.Minute
	// stderrTail is how much of an agent's stderr is kept, to say why it
	// died.
	stderrTail = 4 << 10
	// transcriptBytes bounds the transcript that re-hydrates a new agent
	// process; transcriptEntry bounds one entry of it.
	transcriptBytes = 32 << 10
	transcriptEntry = 2 << 10
	// agentCwd is where agents work.
	agentCwd = "/workspace"
	// agentExitGrace is how long an agent whose input was closed (its
	// sandbox goes to sleep, or the node stops) may take to exit, writing
	// what it keeps (Claude Code writes its transcript after it answers),
	// before it gets SIGTERM.
	agentExitGrace = 2 * time.Second
	// agentTermGrace is how long an agent has to exit after SIGTERM
	// before it is killed.
	agentTermGrace = 2 * time.Second
)

// agentProc is one agent process in a session's sandbox with its ACP
// connection. It lives in the session's box; the runner of a turn uses it.
type agentProc struct {
	proc   compute.Process
	client *acp.Client
	token  string // its model token; "" without a model gateway

	// Set by the runner that opened it; read by later runners (the box
	// lends it to one at a time).
	acpSession string
	stale      bool   // must not serve another prompt: killed at the next turn
	mcp        string // the MCP servers it opened its session with (mcpKey)
	name       string // the agent it runs
	machine    uint64 // the sandbox's machine generation it started on (box.machine)
	flush      bool   // it writes its transcript after it answers (AgentLaunch.WritesAfterAnswer)

	mu   sync.Mutex
	tail []byte // guarded by mu: the last stderrTail bytes of stderr

	exited chan struct{} // closed once the process has exited and its token is revoked
	exit   compute.Exit  // set before exited closes
}

// dead reports whether the process has exited or its output ended.
func (p *agentProc) dead() bool {
	select {
	case <-p.exited:
		return true
	case <-p.client.Done():
		return true
	default:
		return false
	}
}

func (p *agentProc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.ToValidUTF8(strings.TrimSpace(string(p.tail)), "?")
}

// kill kills the process and everything it started, and waits until it has
// exited.
func (p *agentProc) kill() {
	_ = p.proc.Signal(syscall.SIGKILL)
	<-p.exited
}

// agentSet owns the goroutines of the node's agent processes, so that Close
// kills what is left and waits for them.
type agentSet struct {
	mu     sync.Mutex
	procs  map[*agentProc]bool       // guarded by mu
	homes  map[session.ID]*agentHome // guarded by mu: the agent homes this node holds as saved
	closed bool                      // guarded by mu
	wg     sync.WaitGroup
}

// agentHome is a session's agent home on this node and its saved copy: the
// Volume restored it (or found none saved) and saves it. A home the
// sandbox keeps (a VM's, agenthome.go) is the directory of the sandbox's
// mount at path at, valid for the machine it was restored into.
type agentHome struct {
	dir     string
	vol     *mount.Volume
	at      string // the sandbox path of the home the sandbox keeps; "" when dir is bound
	machine uint64 // with at: the machine generation (box.machine) it was restored into
}

// close kills every agent process still running and waits for their
// goroutines.
func (a *agentSet) close() {
	a.mu.Lock()
	a.closed = true
	procs := make([]*agentProc, 0, len(a.procs))
	for p := range a.procs {
		procs = append(procs, p)
	}
	a.mu.Unlock()
	for _, p := range procs {
		_ = p.proc.Signal(syscall.SIGKILL)
	}
	a.wg.Wait()
}

// startAgent starts an agent process in b's sandbox and its ACP client. Its
// goroutines read stderr and wait for the process; when it exits, its model
// token is revoked.
func (h *Host) startAgent(ctx context.Context, b *box, launch AgentLaunch, token string, log *slog.Logger) (*agentProc, error) {
	h.agents.mu.Lock()
	closed := h.agents.closed
	h.agents.mu.Unlock()
	if closed {
		return nil, session.Errorf(session.CodeUnavailable, "the node is shutting down")
	}
	proc, err := b.sb.Exec(ctx, compute.ExecRequest{Argv: launch.Argv, Env: launch.Env, Dir: agentCwd})
	if err != nil {
		return nil, err
	}
	log.Info("agent process started", "agent", launch.Argv[0])
	p := &agentProc{proc: proc, token: token, exited: make(chan struct{})}
	p.client = acp.Start(proc.Stdin(), proc.Stdout(), acp.Config{Logger: log.With("agent", "acp")})
	h.agents.mu.Lock()
	if h.agents.procs == nil {
		h.agents.procs = map[*agentProc]bool{}
	}
	h.agents.procs[p] = true
	h.agents.mu.Unlock()
	stderrDone := make(chan struct{})
	h.agents.wg.Go(func() {
		defer close(stderrDone)
		buf := make([]byte, 4096)
		for {
			n, err := proc.Stderr().Read(buf)
			if n > 0 {
				p.mu.Lock()
				p.tail = append(p.tail, buf[:n]...)
				if len(p.tail) > stderrTail {
					p.tail = p.tail[len(p.tail)-stderrTail:]
				}
				p.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	})
	h.agents.wg.Go(func() {
		<-p.client.Done()
		// An agent whose output ended is of no use: make sure nothing of
		// it is left.
		_ = proc.Signal(syscall.SIGKILL)
		_ = proc.Stdin().Close()
		<-stderrDone
		p.client.Wait()
		exit, err := proc.Wait()
		if err != nil {
			exit = compute.Exit{Code: -1, Detail: err.Error()}
		}
		p.exit = exit
		if token != "" && h.cfg.Models != nil {
			h.cfg.Models.Revoke(token)
		}
		h.agents.mu.Lock()
		delete(h.agents.procs, p)
		h.agents.mu.Unlock()
		close(p.exited)
	})
	return p, nil
}

// agentTurn is what a runner needs to run one turn of an agent session.
type agentTurn struct {
	name       string
	mode       string // the session's permission mode; "" for the node's
	tenant     string
	user       string
	prompt     string
	promptSeq  session.Seq
	acpSession string              // the session's ACP session from its metadata
	mcp        []session.MCPServer // the session's MCP servers (settings.mcp_servers)
	hist       History             // read for re-hydration; the actor keeps it open while the turn runs
	timeout    time.Duration
	publish    func(session.DeltaFrame)

	mu      sync.Mutex
	waiters map[string]chan session.ApprovalAnswer // guarded by mu: permission requests waiting for an answer
	nperm   int                                    // guarded by mu

	// options are the options of the turn's pending approvals, by id;
	// owned by the session actor.
	options map[string][]session.ApprovalOption
}

// deliver hands a driver's (or the timeout's) answer to the waiting
// permission request.
func (a *agentTurn) deliver(ans session.ApprovalAnswer) {
	a.mu.Lock()
	ch := a.waiters[ans.ID]
	a.mu.Unlock()
	if ch != nil {
		select {
		case ch <- ans:
		default:
		}
	}
}

// Messages from an agent runner to its session actor (inside selfMsg).
type (
	// agentOpened: the runner opened a new ACP session, to keep in the
	// metadata.
	agentOpened struct {
		r  *runner
		id string
	}
	// approvalExpired: nobody answered approval id in time.
	approvalExpired struct {
		r  *runner
		id string
	}
)

// checkAgent refuses to create a session with an agent this node cannot
// run.
func (h *Host) checkAgent(name string) error {
	if name == "" {
		return nil
	}
	if h.cfg.Agents == nil {
		return session.Errorf(session.CodeBadRequest, "agent %s cannot run here: this node has no agent catalog configured", name)
	}
	if err := h.cfg.Agents.Check(name); err != nil {
		if errors.Is(err, session.ErrBadRequest) || errors.Is(err, session.ErrNotFound) {
			return session.Errorf(session.CodeBadRequest, "%s", session.AsError(err).Message)
		}
		return session.Errorf(session.CodeBadRequest, "agent %s: %v", name, err)
	}
	return nil
}

// --- the actor's side -------------------------------------------------------

// agentRunner returns the agentTurn of turn t of an agent session.
func (s *sessionActor) agentTurn(t *session.Turn) *agentTurn {
	id, nc, subj := s.id, s.h.cfg.NATS, s.h.cfg.Subjects.Delta(s.id)
	log := s.log
	return &agentTurn{
		name: s.events.meta.Harness.Agent, mode: s.events.meta.Harness.PermissionMode, tenant: s.events.meta.Tenant, user: t.Prompt.By, prompt: t.Prompt.Text,
		promptSeq: t.Prompt.Seq, acpSession: s.events.metaNext.AgentSession, mcp: s.events.meta.MCPServers, hist: s.hist, timeout: s.h.cfg.ApprovalTimeout,
		options: map[string][]session.ApprovalOption{},
		publish: func(d session.DeltaFrame) {
			// Encoded once, published without waiting: a delta is live
			// text, never stored, and a lost one is covered by the
			// agent_message that follows.
			if err := nc.Publish(subj, mustMarshal(d)); err != nil {
				log.Debug("publish delta", "session", id, "err", err)
			}
		},
	}
}

// onAgentOpened keeps a new ACP session id in the metadata, so a later
// agent process loads it.
func (s *sessionActor) onAgentOpened(m *agentOpened) {
	if m.r != s.queue.runner || s.act.phase == phaseDeleting || s.events.metaNext.AgentSession == m.id {
		return
	}
	s.events.metaNext.AgentSession = m.id
	s.events.metaDirty = true
}

// agentApproval logs an agent's permission request as an approval with its
// options.
func (s *sessionActor) agentApproval(m *turnApproval, release func(error)) {
	p := m.perm
	m.r.agent.options[m.id] = p.Options
	s.events.emit(session.KindApprovalRequested, session.BySystem, mustMarshal(session.ApprovalRequestedData{
		Turn: m.r.turn, ID: m.id, Summary: p.Title, Title: p.Title, Kind: p.Kind, Content: p.Content, Options: p.Options,
	}), release)
}

// agentOption resolves an answer to approval id of the running agent turn:
// the option chosen (optionID, or by allow the first allow_once /
// reject_once option), and whether the approval is an agent's at all.
func (s *sessionActor) agentOption(id, optionID string, allow bool) (session.ApprovalOption, bool, error) {
	r := s.queue.runner
	if r == nil || r.agent == nil {
		return session.ApprovalOption{}, false, nil
	}
	opts, ok := r.agent.options[id]
	if !ok {
		return session.ApprovalOption{}, false, nil
	}
	o, err := pickOption(opts, optionID, allow)
	return o, true, err
}

// pickOption chooses among an agent's options.
func pickOption(opts []session.ApprovalOption, optionID string, allow bool) (session.ApprovalOption, error) {
	if optionID != "" {
		for _, o := range opts {
			if o.ID == optionID {
				return o, nil
			}
		}
		ids := make([]string, len(opts))
		for i, o := range opts {
			ids[i] = o.ID
		}
		return session.ApprovalOption{}, session.Errorf(session.CodeBadRequest, "option %q is not one of this approval's options %q", optionID, ids)
	}
	prefs := []string{"reject_once", "reject_always"}
	if allow {
		prefs = []string{"allow_once", "allow_always"}
	}
	for _, k := range prefs {
		for _, o := range opts {
			if o.Kind == k {
				return o, nil
			}
		}
	}
	if allow {
		return session.ApprovalOption{}, session.Errorf(session.CodeBadRequest, "this approval offers no option that allows; answer with an option_id")
	}
	return session.ApprovalOption{}, session.Errorf(session.CodeBadRequest, "this approval offers no option that rejects; answer with an option_id")
}

// allows reports whether an ACP option kind allows.
func allows(kind string) bool { return strings.HasPrefix(kind, "allow") }

// onApprovalExpired rejects an agent's approval nobody answered in time,
// and says so in the session.
func (s *sessionActor) onApprovalExpired(m *approvalExpired) {
	if m.r != s.queue.runner || s.act.phase == phaseDeleting {
		return
	}
	o, ok, err := s.agentOption(m.id, "", false)
	if !ok {
		return
	}
	turn, rerr := s.queue.turns.ResolveApproval(m.id)
	if rerr != nil {
		return // answered meanwhile
	}
	s.events.emit(session.KindError, session.BySystem, mustMarshal(session.ErrorData{Code: session.CodeConflict, Message: fmt.Sprintf(
		"approval %s was not answered within %v; it was rejected", m.id, s.h.cfg.ApprovalTimeout)}), nil)
	if err != nil {
		// No reject option: the request is answered "cancelled".
		m.r.agent.deliver(session.ApprovalAnswer{Type: "approval", ID: m.id})
		s.events.emit(session.KindApprovalResolved, session.BySystem,
			mustMarshal(session.ApprovalResolvedData{Turn: turn, ID: m.id}), nil)
		return
	}
	r := m.r
	s.events.emit(session.KindApprovalResolved, session.BySystem,
		mustMarshal(session.ApprovalResolvedData{Turn: turn, ID: m.id, Allow: false, OptionID: o.ID}),
		func(error) {
			if r == s.queue.runner {
				r.agent.deliver(session.ApprovalAnswer{Type: "approval", ID: m.id, OptionID: o.ID})
			}
		})
}

// sessionNote is a message from the node's model gateway to a session
// (Host.RecordUsage, Host.EndTurn), routed by the manager.
type sessionNote struct {
	id    session.ID
	usage *session.UsageData
	end   *turnEnd
	say   *turnEnd // an error event for the turn, which goes on
}

type turnEnd struct {
	turn    int64
	code    session.Code
	message string
}

// RecordUsage logs a usage event in session id (the model gateway counted
// it for turn). It never blocks; a session that is not active on this node
// is activated to log it.
func (h *Host) RecordUsage(id session.ID, turn int64, u session.UsageData) {
	u.Turn = turn
	h.noteSession(&sessionNote{id: id, usage: &u})
}

// EndTurn ends turn of session id as failed (the model gateway found it
// over budget): it logs an error event with code and message, cancels the
// agent and finishes the turn. It never blocks.
func (h *Host) EndTurn(id session.ID, turn int64, code session.Code, message string) {
	h.noteSession(&sessionNote{id: id, end: &turnEnd{turn: turn, code: code, message: message}})
}

// SayError logs an error event with code and message in session id while
// its turn runs (the model gateway refused a request the agent made: the
// agent may report only "model not found"); the turn goes on. It never
// blocks.
func (h *Host) SayError(id session.ID, turn int64, code session.Code, message string) {
	h.noteSession(&sessionNote{id: id, say: &turnEnd{turn: turn, code: code, message: message}})
}

func (h *Host) noteSession(n *sessionNote) {
	if h.serving.Load() {
		h.system.Root.Send(h.manager, n)
	}
}

// routeNote delivers a note to its session, activating it if needed.
func (m *manager) routeNote(ctx proto.Context, n *sessionNote) {
	if m.shutting {
		return
	}
	c := m.children[n.id]
	if c == nil || c.stopping {
		if n.end != nil || n.say != nil {
			return // No turn runs there.
		}
		m.route(ctx, &placeMsg{req: session.PlaceRequest{Op: session.PlaceActivate, Session: n.id}})
		c = m.children[n.id]
		if c == nil || c.stopping {
			m.h.log.Warn("usage not logged: the session could not be activated", "session", n.id)
			return
		}
	}
	ctx.Send(c.pid, n)
}

// onSessionNote handles a note in the session actor; until the session is
// active the note waits.
func (s *sessionActor) onSessionNote(n *sessionNote) {
	switch s.act.phase {
	case phaseNew, phaseOpening:
		s.notes = append(s.notes, n)
		return
	case phaseActive, phaseDraining, phaseWaking:
	default:
		return
	}
	switch {
	case n.usage != nil:
		s.recordUsage(*n.usage) // usage.go
	case n.end != nil:
		r := s.queue.runner
		if r == nil || r.turn != n.end.turn {
			return
		}
		s.events.emit(session.KindError, session.BySystem, mustMarshal(session.ErrorData{Code: n.end.code, Message: n.end.message}), nil)
		r.stop(stopRequest{status: session.TurnFailed})
	case n.say != nil:
		if r := s.queue.runner; r == nil || r.turn != n.say.turn {
			return
		}
		s.events.emit(session.KindError, session.BySystem, mustMarshal(session.ErrorData{Code: n.say.code, Message: n.say.message}), nil)
	}
}

// replayNotes handles the notes that arrived before the session was active.
func (s *sessionActor) replayNotes() {
	notes := s.notes
	s.notes = nil
	for _, n := range notes {
		s.onSessionNote(n)
	}
}

// mcpKey identifies a list of MCP servers, so that an agent opened with
// other servers than the session's is restarted.
func mcpKey(servers []session.MCPServer) string {
	if len(servers) == 0 {
		return ""
	}
	return string(mustMarshal(servers))
}

// acpServers returns the session's MCP servers the agent can connect to,
// and the names of those whose transport it does not support.
func acpServers(servers []session.MCPServer, caps acp.Capabilities) (out []acp.MCPServer, unsupported []string) {
	nv := func(l []session.NameValue) []acp.EnvVar {
		if l == nil {
			return nil
		}
		out := make([]acp.EnvVar, len(l))
		for i, e := range l {
			out[i] = acp.EnvVar{Name: e.Name, Value: e.Value}
		}
		return out
	}
	for _, m := range servers {
		if !caps.Supports(m.Type) {
			unsupported = append(unsupported, m.Name+" ("+m.ServerType()+")")
			continue
		}
		out = append(out, acp.MCPServer{Name: m.Name, Type: m.Type, Command: m.Command, Args: m.Args, Env: nv(m.Env), URL: m.URL, Headers: nv(m.Headers)})
	}
	return out, unsupported
}
