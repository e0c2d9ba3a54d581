package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/acp"
	"github.com/atriumhq/atrium/session"
)

// The runner's side of an agent turn (agent.go has the runtime's types and
// the actor's side).

// execAgent runs one turn of an agent session: it makes the sandbox and the
// agent process ready (starting and opening or loading its ACP session when
// there is none), sends the prompt and waits for the stop reason, obeying
// cancel and the turn timeout.
func (r *runner) execAgent() *turnExited {
	a, b, h := r.agent, r.box, r.h
	if r.fence == 0 {
		f, err := h.leaseFence(r.id)
		if err != nil {
			msg := "the sandbox could not be provisioned: " + err.Error()
			r.note("", "", &session.ErrorData{Code: session.CodeUnavailable, Message: msg})
			return &turnExited{status: session.TurnFailed, code: -1, reason: msg}
		}
		r.fence = f
	}
	// A sandbox that is new, asleep (unless it kept its processes over
	// its sleep) or about to be replaced has no live agent; one that was
	// cancelled or failed is stopped now.
	fresh := b.sb == nil || b.asleep && !b.kept || h.expired(b)
	if p := b.agent; p != nil && (fresh || p.stale || p.dead() || p.mcp != mcpKey(a.mcp) || p.name != a.name) {
		// A changed settings.mcp_servers restarts it too (they are given
		// at session/new or session/load only), and so does another
		// agent (settings.agent).
		p.kill()
		b.agent = nil
	}
	if b.agent != nil && b.asleep {
		// The sandbox slept keeping its agent process (a VM host's
		// sleep): waking it reattaches the process's streams, and the
		// prompt goes to the same process, with no session/load and no
		// re-hydration. A VM that could not be woken was replaced, and
		// the process ended with it.
		if err := h.readyBox(r.ctx, b, r.fence, r.note); err != nil {
			return &turnExited{status: session.TurnFailed, code: -1, reason: err.Error()}
		}
		if p := b.agent; p.machine != b.machine || p.dead() {
			r.log.Info("the agent process did not survive the sandbox's sleep: starting a new one", "turn", r.turn)
			p.stale = true
			p.kill()
			b.agent = nil
		} else {
			r.log.Info("agent process kept over the sandbox's sleep", "turn", r.turn)
		}
	}
	var launch AgentLaunch
	token := ""
	if b.agent == nil {
		ep := compute.ModelEndpoints{}
		if h.cfg.Models != nil {
			ep = h.cfg.Models.Endpoints()
			token = h.cfg.Models.Issue(r.id, a.tenant)
			ep.Token = token
		}
		var err error
		if h.cfg.Agents == nil {
			err = session.Errorf(session.CodeBadRequest, "this node runs no agents (no agent catalog is configured)")
		} else {
			launch, err = h.cfg.Agents.Launch(a.name, r.id, ep, a.mode)
		}
		if err == nil && launch.Home != "" && !h.homeInSandbox() {
			// The agent's home comes from the object store when this
			// node does not hold it (a takeover, a fresh data dir). A
			// home in the sandbox (a VM's) is restored into it below.
			swapped, rerr := h.restoreAgentHome(r.ctx, b, launch.Home, r.fence)
			switch {
			case rerr != nil:
				r.note("", "", homeError("restored", rerr))
			case swapped:
				// Its settings files are written again over what was
				// restored: the session's permission mode may differ.
				launch, err = h.cfg.Agents.Launch(a.name, r.id, ep, a.mode)
			}
		}
		if err != nil {
			r.revoke(token)
			return agentFailed(session.AsError(err).Code, session.AsError(err).Message)
		}
		b.mounts = launch.Mounts
	}
	for attempt := 0; ; attempt++ {
		if err := h.readyBox(r.ctx, b, r.fence, r.note); err != nil {
			r.revoke(token)
			return &turnExited{status: session.TurnFailed, code: -1, reason: err.Error()}
		}
		if b.agent == nil && h.homeInSandbox() {
			// Before the first agent process starts in it (none runs
			// there: the home is never restored under one).
			if err := h.restoreSandboxHome(r.ctx, b, launch, r.fence); err != nil {
				r.note("", "", homeError("restored", err))
			}
		}
		if !h.replaced(b) {
			break
		}
		// The provider replaced a dead machine while the home was
		// restored: the workspace of the new one was never restored.
		if attempt > 0 || b.agent != nil {
			r.revoke(token)
			return r.lost(errMachineReplaced.Error() + "; the next turn gets the last saved workspace")
		}
		r.log.Warn("the sandbox's machine was replaced: restoring the workspace again", "turn", r.turn)
	}
	select {
	case req := <-r.stops:
		r.revoke(token)
		return r.stoppedBeforeStart(req)
	default:
	}
	if res := r.runSetup(); res != nil { // setup.go
		r.revoke(token)
		return res
	}
	b.dirty = true
	rehydrate := false
	if b.agent == nil {
		p, err := h.startAgent(r.ctx, b, launch, token, r.log)
		if err != nil {
			r.revoke(token)
			if sandboxGone(err) {
				return r.lost("the sandbox is gone: " + err.Error() + "; the next turn gets a fresh sandbox with the last saved workspace")
			}
			return agentFailed(session.CodeBadRequest, "the agent could not be started: "+err.Error())
		}
		b.agent = p
		p.name, p.machine, p.flush = a.name, b.machine, launch.WritesAfterAnswer
		if h.replaced(b) {
			// Exec replaced a dead machine: the agent would work on a
			// workspace that was never restored.
			p.stale = true
			p.kill()
			b.agent = nil
			return r.lost(errMachineReplaced.Error() + "; the next turn gets the last saved workspace")
		}
		var stop *stopRequest
		stop, rehydrate, err = r.openAgent(p, launch)
		if stop != nil || err != nil {
			p.stale = true
			p.kill()
			b.agent = nil
			if stop != nil {
				return r.stoppedBeforeStart(*stop)
			}
			msg := err.Error()
			if tail := p.stderr(); tail != "" {
				msg += "; the agent's stderr ends with: " + tail
			}
			return agentFailed(session.CodeUnavailable, msg)
		}
	}
	res := r.promptAgent(b.agent, rehydrate)
	answered := time.Now()
	r.wg.Wait()
	if !res.lost {
		if err := h.saveTurn(r.ctx, b, r.turn); err != nil { // files.go: also records the turn's changes
			res.errors = append(res.errors, *saveError(err))
		}
		h.awaitHomeFlush(r.ctx, b, answered) // agenthomeflush.go
		if err := h.saveAgentHome(r.ctx, b, r.fence); err != nil {
			res.errors = append(res.errors, *homeError("saved", err))
		}
	}
	return res.turnExited
}

// revoke revokes a token whose process never started.
func (r *runner) revoke(token string) {
	if token != "" && r.h.cfg.Models != nil {
		r.h.cfg.Models.Revoke(token)
	}
}

func agentFailed(code session.Code, msg string) *turnExited {
	return &turnExited{status: session.TurnFailed, code: -1, reason: msg, errors: []session.ErrorData{{Code: code, Message: msg}}}
}

// during runs f with a context that a stop request cancels; it returns the
// stop request if one came.
func (r *runner) during(f func(ctx context.Context) error) (*stopRequest, error) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	done := make(chan error, 1)
	r.wg.Go(func() { done <- f(ctx) })
	var stop *stopRequest
	for {
		select {
		case err := <-done:
			return stop, err
		case req := <-r.stops:
			if stop == nil {
				stop = &req
				cancel()
			}
		}
	}
}

// openAgent initializes a new agent process and loads the session's ACP
// session, or opens a new one; rehydrate says the prompt must carry the
// transcript of earlier turns.
func (r *runner) openAgent(p *agentProc, launch AgentLaunch) (stop *stopRequest, rehydrate bool, err error) {
	a := r.agent
	stop, err = r.during(func(ctx context.Context) error {
		info, err := p.client.Initialize(ctx)
		if err != nil {
			return fmt.Errorf("the agent did not start: %w", err)
		}
		if launch.Authenticate != "" {
			if err := p.client.Authenticate(ctx, launch.Authenticate); err != nil {
				return fmt.Errorf("the agent could not authenticate: %w", err)
			}
		}
		ctx, cancel := context.WithTimeout(ctx, agentOpenTimeout)
		defer cancel()
		setMode := func() error {
			if launch.SessionMode == "" {
				return nil
			}
			if err := p.client.SetMode(ctx, launch.SessionMode); err != nil {
				return fmt.Errorf("the agent could not switch to mode %s: %w", launch.SessionMode, err)
			}
			return nil
		}
		mcp, unsupported := acpServers(a.mcp, info.Capabilities)
		if len(unsupported) > 0 {
			r.note("", "", &session.ErrorData{Code: session.CodeBadRequest, Message: fmt.Sprintf(
				"MCP servers %s were not given to the agent: it does not support their transport", strings.Join(unsupported, ", "))})
		}
		p.mcp = mcpKey(a.mcp)
		if a.acpSession != "" && info.Capabilities.LoadSession && launch.LoadSession {
			err := p.client.LoadSession(ctx, a.acpSession, agentCwd, mcp)
			if err == nil {
				p.acpSession = a.acpSession
				return setMode()
			}
			if ctx.Err() != nil || p.dead() {
				return fmt.Errorf("the agent could not load its session: %w", err)
			}
			r.log.Info("agent session not loaded; re-hydrating a new one", "turn", r.turn, "err", err)
		}
		id, err := p.client.NewSession(ctx, agentCwd, mcp)
		if err != nil {
			return fmt.Errorf("the agent could not open a session: %w", err)
		}
		p.acpSession = id
		rehydrate = r.turn > 1
		r.send(&agentOpened{r: r, id: id})
		return setMode()
	})
	return stop, rehydrate, err
}

// agentResult is a turnExited and whether the sandbox was lost.
type agentResult struct {
	*turnExited
	lost bool
}

// promptAgent sends the turn's prompt to p and waits for its answer.
func (r *runner) promptAgent(p *agentProc, rehydrate bool) agentResult {
	a, h := r.agent, r.h
	text := a.prompt
	if rehydrate {
		if t := r.transcript(); t != "" {
			text = t + text
		}
	}
	if h.cfg.Models != nil && p.token != "" {
		if err := h.cfg.Models.Activate(p.token, r.turn, a.user); err != nil {
			// Its token is no good (the gateway restarted): the next
			// turn starts a process with a new one.
			p.stale = true
			e := session.AsError(err)
			return agentResult{turnExited: agentFailed(e.Code, "the agent may not reach its model: "+e.Message+"; the next prompt restarts it")}
		}
		defer h.cfg.Models.Deactivate(p.token)
	}
	sink := &agentSink{r: r, deltas: newDeltaBuffer(a.publish)}
	defer sink.deltas.close()
	type prompted struct {
		stop string
		err  error
	}
	done := make(chan prompted, 1)
	pctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	r.wg.Go(func() {
		stop, err := p.client.Prompt(pctx, r.turn, text, sink)
		done <- prompted{stop, err}
	})
	timeout := time.NewTimer(r.timeout)
	defer timeout.Stop()
	r.timeoutC = timeout.C
	var res prompted
	ctxDone := r.ctx.Done()
	stopAgent := func(req stopRequest) {
		if r.stopping.status != "" {
			r.stopping.shutdown = r.stopping.shutdown || req.shutdown
			return
		}
		r.stopping = req
		// Not waited for here: an agent that does not read its input
		// would block the write until the kill below.
		r.wg.Go(func() {
			if err := p.client.Cancel(); err != nil {
				r.log.Debug("session/cancel", "turn", r.turn, "err", err)
			}
		})
		r.killC = time.After(r.grace)
	}
wait:
	for {
		select {
		case res = <-done:
			break wait
		case req := <-r.stops:
			stopAgent(req)
		case <-r.timeoutC:
			r.timeoutC = nil
			stopAgent(stopRequest{status: session.TurnTimeout})
		case <-r.killC:
			r.killC = nil
			_ = p.proc.Signal(syscall.SIGKILL)
		case <-ctxDone:
			ctxDone = nil
			r.abandoned = true
			_ = p.proc.Signal(syscall.SIGKILL)
		}
	}
	out := &turnExited{status: session.TurnOK}
	switch {
	case r.stopping.status != "":
		// Whatever the agent answered, every process of the turn stops,
		// and the next turn gets a restarted agent that loads the
		// session (agents answer stale replies, or keep the cancelled
		// command running, after a cancel).
		out.status, out.code = r.stopping.status, -1
		if r.stopping.shutdown {
			out.errors = append(out.errors, shutdownError())
		}
		p.stale = true
		p.kill()
		r.box.agent = nil
	case r.abandoned:
		out.status, out.code = session.TurnCancelled, -1
		p.stale = true
	case res.err != nil && (errors.Is(res.err, acp.ErrClosed) || p.dead()):
		p.stale = true
		select {
		case <-p.exited:
		case <-time.After(r.grace):
			p.kill()
		}
		r.box.agent = nil
		if p.exit.Lost {
			return agentResult{turnExited: r.lost(p.exit.Detail), lost: true}
		}
		msg := "the agent exited during the turn"
		if p.exit.Detail != "" {
			msg += " (" + p.exit.Detail + ")"
		}
		if tail := p.stderr(); tail != "" {
			msg += "; its stderr ends with: " + tail
		}
		msg += "; the next prompt starts it again"
		out = agentFailed(session.CodeUnavailable, msg)
	case res.err != nil:
		out = agentFailed(session.CodeUnavailable, "the agent failed the prompt: "+res.err.Error())
	default:
		status, reason := acp.Outcome(res.stop)
		out.status = status
		if status != session.TurnOK {
			out.code = -1
		}
		if status == session.TurnFailed {
			out.reason = reason
			out.errors = append(out.errors, session.ErrorData{Code: session.CodeUnavailable, Message: reason})
		}
		if status == session.TurnCancelled {
			p.stale = true
		}
	}
	return agentResult{turnExited: out}
}

// transcript returns the earlier turns of the session as text for a new
// agent process that could not load its session (DESIGN §6 re-hydration):
// prompts, final agent messages, tool call titles and outcomes, most recent
// kept when it is too long.
func (r *runner) transcript() string {
	a := r.agent
	if a.hist == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(r.ctx, openTimeout)
	defer cancel()
	var entries []string
	size := 0
	tools := map[string]int{} // tool call id → entry index
	add := func(s string) {
		s = strings.TrimSpace(s)
		if len(s) > transcriptEntry {
			s = truncateText(s, transcriptEntry)
		}
		entries = append(entries, s)
		size += len(s) + 1
	}
	after := session.Seq(0)
	for after < a.promptSeq-1 {
		evs, more, err := a.hist.Range(ctx, after, maxHistoryLimit, session.DefaultHistoryMaxBytes)
		if err != nil {
			r.log.Warn("read history for re-hydration", "err", err)
			break
		}
		for _, raw := range evs {
			var ev struct {
				Seq  session.Seq     `json:"seq"`
				Kind session.Kind    `json:"kind"`
				By   string          `json:"by"`
				Data json.RawMessage `json:"data"`
			}
			if json.Unmarshal(raw, &ev) != nil {
				continue
			}
			after = ev.Seq
			if ev.Seq >= a.promptSeq {
				break
			}
			switch ev.Kind {
			case session.KindMessage:
				var d session.MessageData
				_ = json.Unmarshal(ev.Data, &d)
				add(fmt.Sprintf("User %s: %s", ev.By, d.Text))
			case session.KindAgentMessage:
				var d session.AgentMessageData
				_ = json.Unmarshal(ev.Data, &d)
				add("Agent: " + d.Text)
			case session.KindToolCall:
				var d session.ToolCallData
				_ = json.Unmarshal(ev.Data, &d)
				tools[d.ID] = len(entries)
				add(fmt.Sprintf("Tool call (%s): %s [%s]", d.Kind, d.Title, d.Status))
			case session.KindToolCallUpdate:
				var d session.ToolCallUpdateData
				_ = json.Unmarshal(ev.Data, &d)
				if i, ok := tools[d.ID]; ok && d.Status != "" && i < len(entries) {
					if j := strings.LastIndex(entries[i], " ["); j >= 0 {
						entries[i] = entries[i][:j] + " [" + d.Status + "]"
					}
				}
			case session.KindTurnFinished:
				var d session.TurnFinishedData
				_ = json.Unmarshal(ev.Data, &d)
				if d.Status != session.TurnOK {
					add(fmt.Sprintf("(turn %d ended %s)", d.Turn, d.Status))
				}
			}
		}
		if !more || len(evs) == 0 {
			break
		}
	}
	for size > transcriptBytes && len(entries) > 1 {
		size -= len(entries[0]) + 1
		entries = entries[1:]
	}
	if len(entries) == 0 {
		return ""
	}
	return "[Atrium: your process was restarted and could not load this conversation. Transcript of its earlier turns:]\n" +
		strings.Join(entries, "\n") + "\n[End of the transcript. The new request follows.]\n\n"
}

// truncateText cuts s to n bytes on a rune boundary with the marker.
func truncateText(s string, n int) string {
	cut := max(n-len(session.TruncatedMarker), 0)
	for cut > 0 && cut < len(s) && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return s[:cut] + session.TruncatedMarker
}

// agentSink receives what the agent reports during a prompt (acp.Sink):
// deltas are coalesced and published (deltas.go), events take credits like
// a harness's.
type agentSink struct {
	r      *runner
	deltas *deltaBuffer

	mu      sync.Mutex
	total   int64 // guarded by mu: event bytes of the turn
	discard bool  // guarded by mu: over MaxTurnOutput
}

var _ acp.Sink = (*agentSink)(nil)

func (s *agentSink) Delta(d session.DeltaFrame) { s.deltas.add(d) }

func (s *agentSink) Event(kind session.Kind, data json.RawMessage) {
	if !s.count(len(data)) {
		return
	}
	s.emit(kind, data)
}

func (s *agentSink) Problem(msg string) {
	s.emit(session.KindError, mustMarshal(session.ErrorData{Code: session.CodeInternal, Message: msg}))
}

// count adds n event bytes; past MaxTurnOutput it logs one error and
// reports false from then on.
func (s *agentSink) count(n int) bool {
	s.mu.Lock()
	if s.discard {
		s.mu.Unlock()
		return false
	}
	if s.total+int64(n) <= s.r.maxOutput {
		s.total += int64(n)
		s.mu.Unlock()
		return true
	}
	s.discard = true
	s.mu.Unlock()
	s.emit(session.KindError, mustMarshal(session.ErrorData{
		Code: session.CodePayloadTooLarge,
		Message: fmt.Sprintf("the output limit of %d bytes was reached; the rest of turn %d's agent events were discarded",
			s.r.maxOutput, s.r.turn),
	}))
	return false
}

// emit sends one event to the actor once a credit is free, after the
// deltas gathered before it.
func (s *agentSink) emit(kind session.Kind, data json.RawMessage) {
	s.deltas.flush()
	if s.acquire(s.r.ctx) {
		s.r.send(&turnEvent{r: s.r, kind: kind, data: data})
	}
}

func (s *agentSink) acquire(ctx context.Context) bool {
	select {
	case <-s.r.credits:
		return true
	case <-ctx.Done():
		return false
	}
}

// Permission turns a permission request into an approval and waits for a
// driver's option, or for the approval timeout (the actor then rejects it).
func (s *agentSink) Permission(ctx context.Context, p acp.Permission) (string, bool) {
	a := s.r.agent
	ch := make(chan session.ApprovalAnswer, 1)
	a.mu.Lock()
	a.nperm++
	id := fmt.Sprintf("t%d-p%d", s.r.turn, a.nperm)
	if a.waiters == nil {
		a.waiters = map[string]chan session.ApprovalAnswer{}
	}
	a.waiters[id] = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.waiters, id)
		a.mu.Unlock()
	}()
	s.deltas.flush()
	if !s.acquire(ctx) {
		return "", false
	}
	s.r.send(&turnApproval{r: s.r, id: id, summary: p.Title, perm: &p})
	timer := time.NewTimer(a.timeout)
	defer timer.Stop()
	for {
		select {
		case ans := <-ch:
			return ans.OptionID, ans.OptionID != ""
		case <-timer.C:
			s.r.send(&approvalExpired{r: s.r, id: id})
		case <-ctx.Done():
			return "", false
		}
	}
}
