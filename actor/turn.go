package actor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/acp"
	"github.com/atriumhq/atrium/session"
)

const (
	// outputCredits bounds the output events of a turn that are sent to the
	// actor but not yet committed; the runner stops reading the harness's
	// pipes until one is committed, so memory stays bounded whatever the
	// harness prints.
	outputCredits = 16
	// flushDelay is how long plain output may wait to be coalesced with
	// more before it is sent, so live output stays live.
	flushDelay = 15 * time.Millisecond
	// answerQueue bounds approval answers waiting to be written to stdin.
	answerQueue = 64
	// maxShellPrompt is the longest prompt the built-in shell template can
	// run: Linux limits one environment string to 128 KiB.
	maxShellPrompt = 128<<10 - 1 - len(session.EnvPrompt+"=")
)

// Messages from a runner to its session actor (inside selfMsg).
type (
	// turnEvent is a harness event to log; the runner's credit is released
	// once it is committed or dropped.
	turnEvent struct {
		r    *runner
		kind session.Kind
		data json.RawMessage
	}
	// turnApproval is an approval request; it holds a credit too.
	turnApproval struct {
		r           *runner
		id, summary string
		perm        *acp.Permission // an agent's permission request (agent.go); nil for a harness's
	}
	// sandboxNote is a sandbox event (State set) and/or an error event
	// (Err set) from a runner or a sandbox op.
	sandboxNote struct {
		state  session.SandboxState
		detail string
		err    *session.ErrorData
	}
	// turnExited is the runner's last message: how the turn ended.
	turnExited struct {
		r        *runner
		status   session.TurnStatus
		code     int
		duration time.Duration
		errors   []session.ErrorData // error events to log before turn_finished
		reason   string              // why the turn failed, for the next turn's EnvPreviousTurn
		fence    int64               // the fence the runner acquired for the activation, if it did
	}
)

// stopRequest asks a runner to end its turn: SIGTERM now, SIGKILL after the
// grace period.
type stopRequest struct {
	status   session.TurnStatus // cancelled or timeout
	shutdown bool               // the host is closing
}

// runner runs one turn's harness on its own goroutine. The session actor
// talks to it only through stop, answer, abandon and release; the runner
// talks back only through send. Fields below the line are owned by the
// runner's goroutine.
type runner struct {
	send      func(any)
	log       *slog.Logger
	h         *Host
	box       *box  // the session's sandbox, lent to the runner for the turn
	fence     int64 // the activation's fence; 0: acquire one
	id        session.ID
	turn      int64
	input     []byte // the first stdin line (or, with closeStdin, all of stdin)
	argv, env []string
	// tenant and user (the prompter) get a harness turn's model token
	// (harnessmodels.go).
	tenant, user string
	// closeStdin: stdin ends after input (harness "stdin":"text").
	closeStdin bool
	// agent is set for a turn of an agent session (agent.go): the turn is
	// a prompt to the session's agent process instead of a harness run.
	agent     *agentTurn
	grace     time.Duration
	timeout   time.Duration
	maxOutput int64

	ctx     context.Context // cancelled by abandon; carries span
	span    trace.Span      // the turn's span
	cancel  context.CancelFunc
	stops   chan stopRequest // cap 4
	answers chan []byte      // cap answerQueue
	credits chan struct{}    // cap outputCredits, full when nothing is in flight
	wg      sync.WaitGroup   // the runner's helper goroutines

	// ---
	proc      compute.Process
	stopping  stopRequest // status "" until asked to stop
	timeoutC  <-chan time.Time
	killC     <-chan time.Time
	abandoned bool
	total     int64 // output bytes seen
	discard   bool  // over maxOutput: output is dropped
	out, errs textBuf
	flushT    *time.Timer
	flushOn   bool
}

// stop asks the runner to end the turn. It never blocks.
func (r *runner) stop(req stopRequest) {
	select {
	case r.stops <- req:
	default: // Several stops are already queued; they say the same.
	}
}

// answer queues an approval answer for the harness's stdin.
func (r *runner) answer(a session.ApprovalAnswer) {
	if r.agent != nil {
		r.agent.deliver(a)
		return
	}
	line := append(mustMarshal(a), '\n')
	select {
	case r.answers <- line:
	default:
		r.log.Warn("approval answer dropped: too many queued", "turn", r.turn)
	}
}

// abandon kills the harness at once and stops reporting; used when the actor
// is torn down.
func (r *runner) abandon() { r.cancel() }

// release returns the credit of a committed or dropped event.
func (r *runner) release() {
	select {
	case r.credits <- struct{}{}:
	default:
	}
}

// run is the runner's goroutine.
func (r *runner) run() {
	defer r.cancel()
	start := time.Now()
	res := r.exec()
	res.r = r
	res.duration = time.Since(start)
	endTurn(r.span, res)
	r.send(res)
}

// note reports a sandbox event and/or an error event to the actor.
func (r *runner) note(state session.SandboxState, detail string, err *session.ErrorData) {
	r.send(&sandboxNote{state: state, detail: detail, err: err})
}

func (r *runner) exec() *turnExited {
	var res *turnExited
	if r.agent != nil {
		res = r.execAgent()
	} else {
		res = r.execHarness()
	}
	res.fence = r.fence
	return res
}

// execHarness makes the sandbox ready, runs the harness and saves the
// workspace.
func (r *runner) execHarness() *turnExited {
	b := r.box
	if r.fence == 0 {
		f, err := r.h.leaseFence(r.id)
		if err != nil {
			msg := "the sandbox could not be provisioned: " + err.Error()
			r.note("", "", &session.ErrorData{Code: session.CodeUnavailable, Message: msg})
			return &turnExited{status: session.TurnFailed, code: -1, reason: msg}
		}
		r.fence = f
	}
	env, endModels, err := r.harnessModels(r.env) // harnessmodels.go
	if err != nil {
		return modelsFailed(err)
	}
	defer endModels()
	var proc compute.Process
	var execSpan trace.Span
	for attempt := 0; ; attempt++ {
		if err := r.h.readyBox(r.ctx, b, r.fence, r.note); err != nil {
			return &turnExited{status: session.TurnFailed, code: -1, reason: err.Error()}
		}
		select {
		case req := <-r.stops:
			return r.stoppedBeforeStart(req)
		default:
		}
		if res := r.runSetup(); res != nil { // setup.go
			return res
		}
		b.dirty = true
		var err error
		var ectx context.Context
		ectx, execSpan = r.h.startSpan(r.ctx, "sandbox.exec", r.id)
		proc, err = b.sb.Exec(ectx, compute.ExecRequest{Argv: r.argv, Env: env})
		if err != nil {
			endSpan(execSpan, err)
			if sandboxGone(err) {
				return r.lost("the sandbox is gone: " + err.Error() + "; the next turn gets a fresh sandbox with the last saved workspace")
			}
			msg := "the harness could not be started: " + err.Error()
			return &turnExited{status: session.TurnFailed, code: 127, reason: msg, errors: []session.ErrorData{{
				Code: session.CodeBadRequest, Message: msg,
			}}}
		}
		if !r.h.replaced(b) {
			break
		}
		// The provider replaced a dead machine inside Exec: the command
		// started on a workspace that was never restored. Kill it at
		// once, restore, and start the harness again.
		kill(proc)
		endSpan(execSpan, errMachineReplaced)
		if attempt > 0 {
			return r.lost(errMachineReplaced.Error() + "; the next turn gets the last saved workspace")
		}
		r.log.Warn("the sandbox's machine was replaced: restoring the workspace and starting the harness again", "turn", r.turn)
	}
	r.proc = proc
	r.out = textBuf{limit: session.MaxOutputEventBytes}
	r.errs = textBuf{limit: session.MaxOutputEventBytes}
	r.flushT = time.NewTimer(time.Hour)
	r.flushT.Stop()
	defer r.flushT.Stop()
	timeout := time.NewTimer(r.timeout)
	defer timeout.Stop()
	r.timeoutC = timeout.C

	stdinDone := make(chan struct{})
	r.wg.Go(func() { r.writeStdin(proc.Stdin(), stdinDone) })
	if r.h.cfg.Store != nil {
		r.wg.Go(func() { r.saveLoop(stdinDone) })
	}
	outC := make(chan piece, 1)
	errC := make(chan []byte, 1)
	r.wg.Go(func() { readLines(proc.Stdout(), outC) })
	r.wg.Go(func() { readChunks(proc.Stderr(), errC) })

	type waited struct {
		exit compute.Exit
		err  error
	}
	var waitC chan waited
	var res *waited
	ctxDone := r.ctx.Done()
	for res == nil {
		if outC == nil && errC == nil && waitC == nil {
			// Both pipes are at EOF: the process is exiting.
			waitC = make(chan waited, 1)
			r.wg.Go(func() {
				e, err := proc.Wait()
				waitC <- waited{e, err}
			})
		}
		select {
		case p, ok := <-outC:
			if !ok {
				outC = nil
				if texts := r.out.end(); !r.discard {
					r.emitTexts("stdout", texts)
				}
				continue
			}
			r.onStdout(p)
		case b, ok := <-errC:
			if !ok {
				errC = nil
				if texts := r.errs.end(); !r.discard {
					r.emitTexts("stderr", texts)
				}
				continue
			}
			r.onStderr(b)
		case w := <-waitC:
			res = &w
		case <-r.flushT.C:
			r.flushOn = false
			r.flushText()
		case req := <-r.stops:
			r.onStop(req)
		case <-r.timeoutC:
			r.timeoutC = nil
			r.onStop(stopRequest{status: session.TurnTimeout})
		case <-r.killC:
			r.killC = nil
			r.signal(syscall.SIGKILL)
		case <-ctxDone:
			ctxDone = nil
			r.abandoned = true
			r.signal(syscall.SIGKILL)
		}
	}
	close(stdinDone)
	proc.Stdin().Close()
	r.wg.Wait()
	endExec(execSpan, res.exit, res.err)
	out := r.result(res.exit, res.err)
	switch {
	case res.exit.Lost:
		lost := r.lost(res.exit.Detail)
		out.errors = append(out.errors, lost.errors...)
		out.status, out.reason = session.TurnFailed, lost.reason
		if r.stopping.status != "" {
			out.status = r.stopping.status
		}
	case r.abandoned:
	case r.h.replaced(b):
		lost := r.lost(errMachineReplaced.Error() + "; the next turn gets the last saved workspace")
		out.errors = append(out.errors, lost.errors...)
		out.status, out.reason = session.TurnFailed, lost.reason
	default:
		if err := r.h.saveTurn(r.ctx, b, r.turn); err != nil {
			out.errors = append(out.errors, *saveError(err))
		}
	}
	return out
}

// lost ends a turn whose sandbox died: the box forgets it (the next turn
// provisions a fresh one and restores the last saved workspace) and a
// sandbox failed event says why.
func (r *runner) lost(reason string) *turnExited {
	r.box.drop()
	r.h.boxes.setAwake(r.box, false)
	r.note(session.SandboxFailed, reason, nil)
	return &turnExited{status: session.TurnFailed, code: -1, reason: reason, errors: []session.ErrorData{{
		Code: session.CodeUnavailable, Message: reason,
	}}}
}

// kill kills a command that must not run and waits for it.
func kill(proc compute.Process) {
	_ = proc.Signal(syscall.SIGKILL)
	_ = proc.Stdin().Close()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(io.Discard, proc.Stdout()) })
	_, _ = io.Copy(io.Discard, proc.Stderr())
	wg.Wait()
	_, _ = proc.Wait()
}

// saveLoop saves the workspace every SaveInterval while the harness runs,
// until done is closed. A save that fails is reported as an error event;
// one that succeeds says nothing.
func (r *runner) saveLoop(done <-chan struct{}) {
	t := time.NewTicker(r.h.cfg.SaveInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := r.h.saveBox(r.ctx, r.box); err != nil && r.ctx.Err() == nil {
				r.note("", "", saveError(err))
			}
			// A periodic save does not mean the turn's end is saved.
			r.box.dirty = true
		case <-done:
			return
		case <-r.ctx.Done():
			return
		}
	}
}

func (r *runner) stoppedBeforeStart(req stopRequest) *turnExited {
	res := &turnExited{status: req.status, code: -1}
	if req.shutdown {
		res.errors = append(res.errors, shutdownError())
	}
	return res
}

func shutdownError() session.ErrorData {
	return session.ErrorData{Code: session.CodeUnavailable,
		Message: "the node running this session is shutting down and the turn did not finish within its drain grace period; prompt again to continue"}
}

func (r *runner) result(exit compute.Exit, err error) *turnExited {
	res := &turnExited{code: exit.Code}
	switch {
	case r.stopping.status != "":
		res.status = r.stopping.status
		if r.stopping.shutdown {
			res.errors = append(res.errors, shutdownError())
		}
	case err != nil:
		res.status, res.code = session.TurnFailed, -1
		res.errors = append(res.errors, session.ErrorData{Code: session.CodeInternal, Message: "waiting for the harness: " + err.Error()})
	case exit.OOM:
		res.status = session.TurnFailed
		res.errors = append(res.errors, session.ErrorData{Code: session.CodeUnavailable,
			Message: "the harness was killed because the sandbox hit its memory limit"})
	case exit.Code == 0:
		res.status = session.TurnOK
	default:
		res.status = session.TurnFailed
		if exit.Code == 126 || exit.Code == 127 {
			what := "was not found"
			if exit.Code == 126 {
				what = "is not executable"
			}
			res.errors = append(res.errors, session.ErrorData{Code: session.CodeBadRequest, Message: fmt.Sprintf(
				"the harness could not be run (exit code %d: the command %s); check the session's harness", exit.Code, what)})
		}
	}
	if exit.DiskFull {
		res.errors = append(res.errors, session.ErrorData{Code: session.CodePayloadTooLarge,
			Message: "the sandbox's workspace is full (" + exit.Detail + "): delete files, or ask the operator for a larger sandbox.workspace_disk_bytes"})
	}
	return res
}

// onStop starts ending the turn: SIGTERM now, SIGKILL after the grace.
func (r *runner) onStop(req stopRequest) {
	if r.stopping.status != "" {
		r.stopping.shutdown = r.stopping.shutdown || req.shutdown
		return
	}
	r.stopping = req
	r.signal(syscall.SIGTERM)
	r.killC = time.After(r.grace)
}

func (r *runner) signal(sig syscall.Signal) {
	if err := r.proc.Signal(sig); err != nil {
		r.log.Debug("signal harness", "turn", r.turn, "signal", sig, "err", err)
	}
}

// writeStdin writes the first line and then approval answers until the turn
// ends. A harness that never reads blocks only this goroutine, which ends
// when the turn's stdin is closed.
func (r *runner) writeStdin(w io.Writer, done <-chan struct{}) {
	if _, err := w.Write(r.input); err != nil {
		return
	}
	if c, ok := w.(io.Closer); ok && r.closeStdin {
		c.Close()
		return
	}
	for {
		select {
		case line := <-r.answers:
			if _, err := w.Write(line); err != nil {
				return
			}
		case <-done:
			return
		}
	}
}

// onStdout handles a piece of stdout: harness objects become agent or
// approval events, everything else is coalesced into output text.
func (r *runner) onStdout(p piece) {
	if p.whole {
		line := p.data
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
		}
		if hl := session.ParseHarnessLine(line); hl.Object != nil {
			if hl.ApprovalID != "" {
				// Honoured even past the output limit, or the harness
				// would wait for an answer that cannot come.
				r.flushStream("stdout")
				if r.acquire() {
					r.send(&turnApproval{r: r, id: hl.ApprovalID, summary: hl.Summary})
				}
				return
			}
			if !r.count(len(p.data)) {
				return
			}
			r.flushStream("stdout")
			r.emit(session.KindAgent, session.AgentData(r.turn, hl.Object))
			return
		}
	}
	r.addText("stdout", &r.out, p.data)
}

func (r *runner) onStderr(b []byte) { r.addText("stderr", &r.errs, b) }

func (r *runner) addText(stream string, buf *textBuf, raw []byte) {
	if r.discard {
		return
	}
	if room := r.maxOutput - r.total; int64(len(raw)) > room {
		raw = raw[:room]
		r.emitTexts(stream, buf.add(raw))
		r.count(len(raw) + 1) // trips the limit
		return
	}
	r.total += int64(len(raw))
	r.emitTexts(stream, buf.add(raw))
	if !buf.empty() && !r.flushOn {
		r.flushOn = true
		r.flushT.Reset(flushDelay)
	}
}

// count adds n output bytes; past maxOutput it flushes what is pending, logs
// one error and reports false from then on.
func (r *runner) count(n int) bool {
	if r.discard {
		return false
	}
	if r.total+int64(n) <= r.maxOutput {
		r.total += int64(n)
		return true
	}
	r.discard = true
	r.flushText()
	r.emit(session.KindError, mustMarshal(session.ErrorData{
		Code: session.CodePayloadTooLarge,
		Message: fmt.Sprintf("the output limit of %d bytes was reached; the rest of turn %d's output was discarded",
			r.maxOutput, r.turn),
	}))
	return false
}

// flushText sends whatever text is pending on both streams.
func (r *runner) flushText() {
	r.flushStream("stdout")
	r.flushStream("stderr")
}

func (r *runner) flushStream(stream string) {
	buf := &r.out
	if stream == "stderr" {
		buf = &r.errs
	}
	if t := buf.take(); t != "" {
		r.emitTexts(stream, []string{t})
	}
}

func (r *runner) emitTexts(stream string, texts []string) {
	for _, t := range texts {
		r.emit(session.KindOutput, mustMarshal(session.OutputData{Turn: r.turn, Stream: stream, Text: t}))
	}
}

// emit sends one event to the actor once a credit is free.
func (r *runner) emit(kind session.Kind, data json.RawMessage) {
	if r.acquire() {
		r.send(&turnEvent{r: r, kind: kind, data: data})
	}
}

// acquire waits for an output credit while still obeying stop requests and
// timers. It reports false if the turn was abandoned.
func (r *runner) acquire() bool {
	for !r.abandoned {
		select {
		case <-r.credits:
			return true
		case req := <-r.stops:
			r.onStop(req)
		case <-r.timeoutC:
			r.timeoutC = nil
			r.onStop(stopRequest{status: session.TurnTimeout})
		case <-r.killC:
			r.killC = nil
			r.signal(syscall.SIGKILL)
		case <-r.ctx.Done():
			r.abandoned = true
			r.signal(syscall.SIGKILL)
		}
	}
	return false
}

// --- the actor's side -------------------------------------------------------

// maybeStartTurn starts the next queued turn if none runs.
func (s *sessionActor) maybeStartTurn() {
	s.startFileOps() // Writes received during the last turn go first (files.go).
	for s.queue.runner == nil && s.sandbox.op == nil && !s.act.shutting && s.act.serving() {
		t, ok := s.queue.turns.Next()
		if !ok {
			return
		}
		s.events.emit(session.KindTurnStarted, t.Prompt.By, mustMarshal(session.TurnStartedData{Turn: t.N, PromptSeq: t.Prompt.Seq}), nil)
		if t.Prompt.Cancelled { // cancelled while queued (OpCancel with PromptSeq): it never runs.
			s.events.emit(session.KindTurnFinished, session.BySystem, mustMarshal(session.TurnFinishedData{Turn: t.N, Status: session.TurnCancelled, ExitCode: -1}), nil)
			s.h.metrics.turnFinished(session.TurnCancelled, 0)
			s.queue.turns.Finish(t.N)
			continue
		}
		var argv, env []string
		var err error
		if s.events.meta.Harness.Agent == "" {
			argv, env, err = s.harness(t)
		}
		if err != nil {
			s.events.emit(session.KindError, session.BySystem, mustMarshal(session.ErrorData{Code: session.CodeBadRequest, Message: err.Error()}), nil)
			s.events.emit(session.KindTurnFinished, session.BySystem, mustMarshal(session.TurnFinishedData{Turn: t.N, Status: session.TurnFailed, ExitCode: -1}), nil)
			s.h.metrics.turnFinished(session.TurnFailed, 0)
			s.queue.turns.Finish(t.N)
			continue
		}
		if s.sandbox.box == nil {
			s.sandbox.box = s.h.boxes.get(s.id)
		}
		s.h.boxes.disarm(s.sandbox.box) // A running turn is activity.
		s.sandbox.box.egress = s.h.egress.effective(s.events.meta.Egress)
		s.sandbox.box.limits = s.sandboxLimits() // settings.go
		s.sandbox.box.setup = s.setupStep()      // setup.go
		input := append(mustMarshal(session.HarnessInput{Session: s.id, Turn: t.N, Prompt: t.Prompt.Text, By: t.Prompt.By}), '\n')
		text := s.events.meta.Harness.Stdin == session.HarnessStdinText
		if text {
			input = []byte(t.Prompt.Text)
		}
		r := &runner{
			log: s.log, h: s.h, box: s.sandbox.box, fence: s.fence, id: s.id, turn: t.N,
			input: input, argv: argv, env: env, closeStdin: text, tenant: s.events.meta.Tenant, user: t.Prompt.By,
			grace: s.h.cfg.CancelGrace, timeout: s.turnTimeout(), maxOutput: s.h.cfg.MaxTurnOutput,
			stops: make(chan stopRequest, 4), answers: make(chan []byte, answerQueue),
			credits: make(chan struct{}, outputCredits),
		}
		for range outputCredits {
			r.credits <- struct{}{}
		}
		tctx, span := s.h.startTurn(s.h.ctx, &s.queue.traces, s.id, t.N, t.Prompt.Seq)
		r.ctx, r.cancel = context.WithCancel(tctx)
		r.span = span
		r.send = s.send
		if s.events.meta.Harness.Agent != "" {
			r.agent = s.agentTurn(t)
		}
		s.queue.runner = r
		s.spawn(r.run)
	}
}

// harness returns the argv and environment of turn t.
func (s *sessionActor) harness(t *session.Turn) (argv, env []string, err error) {
	env = []string{session.EnvSession + "=" + string(s.id), session.EnvTurn + "=" + strconv.FormatInt(t.N, 10)}
	if s.queue.prev != nil {
		env = append(env, EnvPreviousTurn+"="+string(mustMarshal(s.queue.prev)))
	}
	env = append(env, s.secretEnv(s.events.meta.Secrets)...)
	h := s.events.meta.Harness
	if len(h.Command) > 0 {
		return h.Command, env, nil
	}
	name := h.Template
	if name == "" {
		name = session.DefaultTemplate
	}
	argv, ok := s.h.templates[name]
	if !ok {
		return nil, nil, fmt.Errorf("harness template %q is not configured on this node", name)
	}
	if name == session.DefaultTemplate && s.h.cfg.Templates[name] == nil {
		if len(t.Prompt.Text) > maxShellPrompt {
			return nil, nil, fmt.Errorf("the shell harness runs prompts of at most %d bytes (it passes them in %s); this one has %d",
				maxShellPrompt, session.EnvPrompt, len(t.Prompt.Text))
		}
		env = append(env, session.EnvPrompt+"="+t.Prompt.Text)
	}
	return argv, env, nil
}

func (s *sessionActor) setSandboxState(state session.SandboxState, detail string) {
	s.sandbox.sandboxState = state
	s.events.emit(session.KindSandbox, session.BySystem, mustMarshal(session.SandboxData{State: state, Detail: detail}), nil)
	s.putCatalog()
}

func (s *sessionActor) onTurnEvent(m *turnEvent) {
	if !s.queue.owns(m.r) || s.act.phase == phaseDeleting {
		m.r.release()
		return
	}
	s.events.emit(m.kind, session.BySystem, m.data, func(error) { m.r.release() })
}

func (s *sessionActor) onTurnApproval(m *turnApproval) {
	if !s.queue.owns(m.r) || s.act.phase == phaseDeleting {
		m.r.release()
		return
	}
	release := func(error) { m.r.release() }
	if err := s.queue.turns.RequestApproval(m.r.turn, m.id); err != nil {
		s.events.emit(session.KindError, session.BySystem, mustMarshal(session.ErrorData{
			Code: session.CodeConflict, Message: fmt.Sprintf("turn %d: %v", m.r.turn, session.AsError(err).Message),
		}), release)
		return
	}
	if m.perm != nil {
		s.agentApproval(m, release)
		return
	}
	s.events.emit(session.KindApprovalRequested, session.BySystem,
		mustMarshal(session.ApprovalRequestedData{Turn: m.r.turn, ID: m.id, Summary: m.summary}), release)
}

// onSandboxNote logs what a runner or a sandbox op reports about the
// sandbox.
func (s *sessionActor) onSandboxNote(m *sandboxNote) {
	if s.act.phase == phaseDeleting {
		return
	}
	if m.state != "" {
		s.setSandboxState(m.state, m.detail)
	}
	if m.err != nil {
		s.events.emit(session.KindError, session.BySystem, mustMarshal(m.err), nil)
	}
}

func (s *sessionActor) onTurnExited(m *turnExited) {
	if !s.queue.owns(m.r) {
		return
	}
	s.queue.exited(m)
	s.h.metrics.turnFinished(m.status, m.duration)
	if m.fence > s.fence {
		s.fence = m.fence
	}
	if s.act.phase == phaseDeleting {
		return
	}
	s.armSleep()
	for _, e := range m.errors {
		s.events.emit(session.KindError, session.BySystem, mustMarshal(e), nil)
	}
	s.events.emit(session.KindTurnFinished, session.BySystem, mustMarshal(session.TurnFinishedData{
		Turn: m.r.turn, Status: m.status, ExitCode: m.code, DurationMS: m.duration.Milliseconds(),
	}), s.turnFinishedDurable)
	s.maybeStartTurn()
}

// turnFinishedDurable updates the catalog once a turn_finished is durable,
// so listings show the end of every turn at once.
func (s *sessionActor) turnFinishedDurable(err error) {
	if err == nil && s.act.phase != phaseDeleting {
		s.putCatalog()
	}
}
