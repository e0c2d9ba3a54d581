package actor

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// openTimeout bounds opening or creating a history and subscribing.
const openTimeout = 30 * time.Second

// spawnInfo is shared by the incarnations of one session actor (a restart
// after a panic makes a new instance from the same props).
type spawnInfo struct {
	opened atomic.Bool // an incarnation opened the history: restarts open it at once
}

// cmdMsg is a request from the session's Cmd subscription, decoded on the
// subscription's goroutine (in parallel with the actor, and on a goroutine
// whose stack has grown to what decoding needs: protoactor runs an actor on a
// fresh goroutine whenever its mailbox was empty).
type cmdMsg struct {
	msg *nats.Msg
	cmd session.Command
	err error // the body is not a valid command
}

func newCmdMsg(msg *nats.Msg) *cmdMsg {
	m := &cmdMsg{msg: msg}
	if err := json.Unmarshal(msg.Data, &m.cmd); err != nil {
		m.err = session.Errorf(session.CodeBadRequest, "command is not valid JSON: %v", err)
	}
	return m
}

// shutdownSession tells a session that the host is closing.
type shutdownSession struct{}

// selfMsg wraps everything a session actor's own goroutines send it. A
// message from a previous incarnation (before a restart) is ignored. It does
// not reset the idle timer.
type selfMsg struct {
	inst *sessionActor
	m    any
}

func (*selfMsg) NotInfluenceReceiveTimeout() {}

// Messages inside selfMsg.
type (
	opened      struct{} // the result is in sessionActor.handoff
	subscribed  struct{} // likewise
	cmdDrained  struct{ sub *nats.Subscription }
	idleTimeout struct{ gen uint64 }
	closedMsg   struct{}
	deletedMsg  struct{}
	catalogTick struct{}
	// leaseLost: the lease could not be renewed in time, or a newer
	// owner fenced a checkpoint; the session stops at once.
	leaseLost struct{ why string }
	// checkpointTick: CheckpointInterval passed while active.
	checkpointTick struct{}
	// checkpointDone: a periodic checkpoint ended; seq is what it covered.
	checkpointDone struct {
		seq session.Seq
		err error
	}
	// drainExpired: DrainGrace passed since the host began closing.
	drainExpired struct{}
)

// handoff carries what an opening or subscribing goroutine produced to the
// actor; if the actor is torn down first, teardown releases it.
type handoff struct {
	lease *lease
	hist  History
	sub   *nats.Subscription
	open  *openResult
	err   error
}

// openResult is what activation learned from the history.
type openResult struct {
	meta     session.Meta
	last     session.Seq
	lastTime *session.Time // when event last was committed; nil if unknown
	lastTurn int64
	sandbox  session.SandboxState
	queue    []session.Prompt // acknowledged prompts whose turn has not started
	prev     *previousTurn    // how the last finished turn ended; nil if none did
	prompted bool             // the history holds a prompt (see recentPrompts.partial)
}

// sessionActor owns one session: its history (sole writer), its turn queue,
// its Cmd subscription and its sandbox. Receive runs on one goroutine at a
// time and dispatches to the components below, plain values it owns (no
// locks): each has its own file, type and unit tests.
//
//	act      activation  activation.go  phase, lifecycle flags, requests waiting on them
//	events   eventLog    eventlog.go    seq numbering, outbox, commit reports, metadata
//	queue    turnQueue   turnqueue.go   queued prompts, the running turn, previous turn
//	sandbox  sandboxUse  sandboxuse.go  the session's box, sandbox op, sandbox state
//	timers   timers      timers.go      idle (hibernate_after), drain, catalog, checkpoint
//
// The agent runtime (agent.go, agent_turn.go) is one more component beside
// them. Each component is a named field, so every use names the component
// that owns the state (s.act.phase, s.events.emit). The other fields are
// the actor's own: its identity, its goroutines, its history, the lease
// (lease.go) and checkpoints (checkpoint.go). The I/O of activation
// (create, open, recover, subscribe; takeover.go's bringing the history up
// to date with the stream) runs off the goroutine in an opener (open.go),
// which holds none of this state.
type sessionActor struct {
	h    *Host
	id   session.ID
	info *spawnInfo
	log  *slog.Logger
	self *proto.PID

	wg      sync.WaitGroup // goroutines of this incarnation
	readsWG sync.WaitGroup // history reads in flight on the read pool

	mu      sync.Mutex
	handoff *handoff // guarded by mu

	act     activation
	events  eventLog
	queue   turnQueue
	sandbox sandboxUse
	timers  timers

	opener *opener // activation I/O, run off the actor's goroutine (open.go)

	current *nats.Msg // the command being handled, answered if it panics

	hist History

	catalogAt      time.Time // when the catalog entry was last written
	catalogSeq     session.Seq
	catalogSandbox session.SandboxState

	// lease is this activation's ownership lease; fence its fencing
	// token, given to the sandbox, workspace saves and checkpoints.
	lease *lease
	fence int64
	// ckptRunning while a periodic checkpoint is written; ckptSeq is the
	// last seq checkpointed.
	ckptRunning bool
	ckptSeq     session.Seq

	// commitErr is why this activation's last failed commit failed
	// (onCommitted): the batches dropped behind it report it.
	commitErr error

	// files holds the file writes waiting for the running turn (files.go).
	files fileQueue

	// notes from the model gateway that arrived before the session was
	// active (agent.go).
	notes []*sessionNote
}

func newSessionActor(h *Host, id session.ID, info *spawnInfo) *sessionActor {
	s := &sessionActor{
		h:       h,
		id:      id,
		info:    info,
		log:     h.log.With("session", id),
		sandbox: sandboxUse{sandboxState: session.SandboxNone},
	}
	s.act.log = s.log
	s.opener = &opener{h: h, id: id, log: s.log}
	return s
}

// sessionCell is what protoactor holds of a session actor: the actor until
// it stopped, then nothing. protoactor's PIDSet.Remove leaves a removed PID
// in its slice's spare capacity, and a PID caches its process (mailbox,
// context, actor), so the manager's context keeps as many stopped children
// reachable as it once had children at the same time, until new children
// overwrite them: 500 sessions hibernated together kept all 500 actors,
// with their logger, metadata and closed history handles. Letting go of the
// actor leaves protoactor's own records in those slots.
type sessionCell struct{ s *sessionActor }

func (c *sessionCell) Receive(ctx proto.Context) {
	s := c.s
	if s == nil {
		return
	}
	s.Receive(ctx)
	if _, ok := ctx.Message().(*proto.Stopped); ok {
		c.s = nil
	}
}

// Receive handles one message. It never blocks on disk, the network or a
// future: those run on goroutines the actor owns, which report back with
// selfMsg.
func (s *sessionActor) Receive(ctx proto.Context) {
	switch m := ctx.Message().(type) {
	case *proto.Started:
		s.self = ctx.Self()
		if s.info.opened.Load() {
			s.startOpen(nil) // a restart: reopen from the history file
		}
	case *proto.Restarting:
		if s.current != nil {
			respond(s.current, errorReply(session.Errorf(session.CodeInternal, "internal error; the session restarted")))
			s.current = nil
		}
		s.teardownNow("restart")
		return
	case *proto.Stopping:
		s.teardownNow("stop")
		return
	case *proto.Stopped:
		return
	case *placeMsg:
		s.timers.touch()
		s.onPlace(ctx, m)
	case *cmdMsg:
		// Reads (info, history) do not keep a session awake: a client
		// polling GET /v1/sessions/{id} must not defeat hibernation.
		if op := m.cmd.Op; op != session.OpInfo && op != session.OpHistory {
			s.timers.touch()
		}
		s.onCmd(m)
	case *shutdownSession:
		s.onShutdown(ctx)
	case *sessionNote:
		s.onSessionNote(m)
	case *selfMsg:
		if m.inst != s {
			s.dropStale(m.m)
			return
		}
		s.onSelf(ctx, m.m)
	}
	s.maybeSleep()
	s.flush()
	s.maybeShutdown()
	s.tryFinishDelete()
	s.armIdle()
}

func (s *sessionActor) onSelf(ctx proto.Context, m any) {
	switch m := m.(type) {
	case fileMsg: // files.go
		m.handle(s)
	case *idleTimeout:
		if s.timers.idleFired(m.gen) {
			s.onIdle(ctx)
		}
	case *opened:
		s.onOpened(ctx)
	case *subscribed:
		s.onSubscribed(ctx)
	case *cmdDrained:
		s.onDrained(ctx, m.sub)
	case *catalogTick:
		s.timers.catalogTimer = nil
		s.catalogChanged()
	case *leaseLost:
		s.onLeaseLost(ctx, m.why)
	case *checkpointTick:
		s.timers.ckptTimer = nil
		s.startCheckpoint()
	case *checkpointDone:
		s.onCheckpointDone(ctx, m)
	case *drainExpired:
		if s.queue.runner != nil {
			s.queue.runner.stop(stopRequest{status: session.TurnCancelled, shutdown: true})
		}
	case *closedMsg:
		s.passivate(ctx)
	case *deletedMsg:
		s.passivate(ctx)
	case *committed:
		s.onCommitted(m)
	case *turnEvent:
		s.onTurnEvent(m)
	case *turnApproval:
		s.onTurnApproval(m)
	case *sandboxNote:
		s.onSandboxNote(m)
	case *turnExited:
		s.onTurnExited(m)
	case *agentOpened:
		s.onAgentOpened(m)
	case *approvalExpired:
		s.onApprovalExpired(m)
	case *boxOpDone:
		if s.sandbox.opDone(m.op) {
			s.maybeStartTurn()
		}
	}
}

// dropStale releases what a message from a previous incarnation holds.
func (s *sessionActor) dropStale(m any) {
	if e, ok := m.(*turnEvent); ok {
		e.r.release()
	}
}

// send delivers m to this incarnation from any goroutine.
func (s *sessionActor) send(m any) {
	s.h.system.Root.Send(s.self, &selfMsg{inst: s, m: m})
}

// spawn runs f on a goroutine owned by this incarnation (and by the host).
func (s *sessionActor) spawn(f func()) {
	s.wg.Add(1)
	s.h.wg.Add(1)
	go func() {
		defer s.h.wg.Done()
		defer s.wg.Done()
		f()
	}()
}

// armIdle runs the hibernation timer while the session is idle, restarting
// it after each request. (protoactor's SetReceiveTimeout does this too, but
// its timer callback races with the actor on the context's fields.)
func (s *sessionActor) armIdle() {
	idle := (s.act.phase == phaseActive && s.idle()) || s.act.phase == phaseNew
	if gen, start := s.timers.rearmIdle(idle); start {
		s.timers.startIdle(s.h.cfg.HibernateAfter, func() { s.send(&idleTimeout{gen: gen}) })
	}
}

// idle reports whether nothing is running, queued, uncommitted or waiting.
func (s *sessionActor) idle() bool {
	return s.queue.idle() && s.sandbox.idle() && !s.events.pending() && len(s.act.waiting) == 0 && s.files.idle()
}

// quiet is idle for a session that is shutting down: queued prompts stay in
// the log and do not run.
func (s *sessionActor) quiet() bool {
	return s.queue.runner == nil && s.sandbox.op == nil && !s.events.pending()
}

// --- activation -----------------------------------------------------------

func (s *sessionActor) onPlace(ctx proto.Context, p *placeMsg) {
	s.sandbox.sleepFired(p.sleep, s.act.phase)
	switch s.act.phase {
	case phaseNew:
		if p.req.Op == session.PlaceCreate {
			s.act.creator = p
			s.startOpen(p)
			return
		}
		s.act.waiting = append(s.act.waiting, p)
		s.startOpen(nil)
	case phaseOpening, phaseDraining, phaseWaking, phaseClosing:
		s.act.waiting = append(s.act.waiting, p)
	case phaseActive:
		s.answerPlace(p)
	case phasePassivating:
		ctx.Send(ctx.Parent(), &bounced{m: p})
	case phaseDeleting:
		respond(p.msg, errorReply(session.Errorf(session.CodeNotFound, "session not found")))
	}
}

// answerPlace answers a place request once the Cmd subscription is live.
func (s *sessionActor) answerPlace(p *placeMsg) {
	if p.req.Op == session.PlaceCreate {
		if p != s.act.creator {
			respond(p.msg, errorReply(session.Errorf(session.CodeConflict, "session %s already exists", s.id)))
			return
		}
		s.act.creator = nil
		sess := s.sessionFor(p.user)
		respond(p.msg, session.Reply{Session: &sess})
		return
	}
	respond(p.msg, session.Reply{})
}

// startOpen opens (or, for create, creates) the history on a goroutine and
// subscribes the Cmd subject; the result comes back as opened.
func (s *sessionActor) startOpen(create *placeMsg) {
	s.act.toOpening()
	subject := s.h.cfg.Subjects.Cmd(s.id)
	self := s.self
	s.spawn(func() {
		ctx, cancel := context.WithTimeout(s.h.ctx, openTimeout)
		defer cancel()
		var ho *handoff
		var pre <-chan preOpened
		if create == nil {
			// Local SQLite reads: a cancellable context would cost modernc
			// a goroutine per statement (see storage/sqlite's doc).
			pre = s.opener.openBeside(context.WithoutCancel(ctx), s)
		}
		// The lease comes first: only its holder may subscribe (a second
		// responder would answer the owner's requests) or write the file.
		l, err := s.h.acquireLease(ctx, s.id, func() { s.send(&leaseLost{why: "the node's lease could not be renewed in time"}) })
		if pre != nil {
			s.opener.keepPre(l, <-pre)
		}
		if err != nil {
			ho = &handoff{err: err}
		} else if create != nil {
			ho = s.opener.create(ctx, create)
			if ho.err == nil {
				ho.sub, ho.err = s.opener.subscribe(ctx, subject, self)
			}
		} else {
			// Subscribe while the history opens, so that the round trip
			// to the server overlaps opening the file; commands that
			// arrive first wait in s.act.early. (Not for create: until it
			// succeeds the id may be a hibernated session's, which this
			// actor must not answer for.)
			type subResult struct {
				sub *nats.Subscription
				err error
			}
			subC := make(chan subResult, 1)
			s.spawn(func() {
				sub, err := s.opener.subscribe(ctx, subject, self)
				subC <- subResult{sub, err}
			})
			// Local SQLite reads: a cancellable context would cost modernc
			// a goroutine per statement (see storage/sqlite's doc).
			ho = s.opener.open(context.WithoutCancel(ctx), l)
			r := <-subC
			if ho.err == nil {
				ho.sub, ho.err = r.sub, r.err
			} else if r.sub != nil {
				r.sub.Unsubscribe()
			}
		}
		if ho.err != nil && ho.hist != nil {
			ho.hist.Close()
			ho.hist = nil
		}
		if ho.err != nil {
			l.release(context.WithoutCancel(ctx))
		} else {
			ho.lease = l
		}
		s.mu.Lock()
		s.handoff = ho
		s.mu.Unlock()
		s.send(&opened{})
	})
}

func (s *sessionActor) takeHandoff() *handoff {
	s.mu.Lock()
	defer s.mu.Unlock()
	ho := s.handoff
	s.handoff = nil
	return ho
}

func (s *sessionActor) onOpened(ctx proto.Context) {
	ho := s.takeHandoff()
	if ho == nil {
		return
	}
	if ho.err != nil {
		if !errors.Is(ho.err, session.ErrNotFound) && !errors.Is(ho.err, session.ErrConflict) && !errors.Is(ho.err, session.ErrUnavailable) {
			s.log.Warn("activate session", "err", ho.err)
		}
		rep := errorReply(ho.err)
		s.act.openErr = ho.err
		if s.act.creator != nil {
			respond(s.act.creator.msg, rep)
			s.act.creator = nil
		}
		for _, p := range s.act.takeWaiting() {
			respond(p.msg, rep)
		}
		for _, c := range s.act.takeEarly() {
			respond(c.msg, rep)
		}
		s.act.toPassivating()
		ctx.Send(ctx.Parent(), &passivate{pid: s.self})
		return
	}
	s.info.opened.Store(true)
	s.hist, s.act.sub = ho.hist, ho.sub
	s.lease, s.fence = ho.lease, ho.lease.fence
	s.events.resume(ho.open.meta, ho.open.last, ho.open.lastTime, maxEventData(s.h.cfg.NATS))
	s.queue.resume(ho.open.lastTurn, ho.open.queue, ho.open.prev, ho.open.prompted)
	s.sandbox.sandboxState = ho.open.sandbox
	s.sandbox.box = s.h.boxes.lookup(s.id)
	if s.sandbox.box != nil && s.h.boxes.isAwake(s.sandbox.box) && !s.h.boxes.armed(s.sandbox.box) {
		s.armSleep() // Its timer was lost with a previous incarnation.
	}
	s.events.committer = s.startCommitter(s.hist)
	// -1: unknown, the first periodic checkpoint writes one. Known when
	// this node released the session last: nothing to write at
	// hibernation if nothing is committed meanwhile.
	s.ckptSeq = session.Seq(ho.lease.checkpointed.Load())
	s.armCheckpoint()
	s.act.toActive()
	s.act.metered = true
	s.h.metrics.activated()
	s.putCatalog()
	s.log.Debug("session active", "last_seq", s.events.durable)
	if s.act.creator != nil {
		s.answerPlace(s.act.creator)
	}
	s.answerWaiting()
	for _, c := range s.act.takeEarly() {
		s.onCmd(c)
	}
	s.maybeStartTurn()
	s.replayNotes()
}

func (s *sessionActor) answerWaiting() {
	for _, p := range s.act.takeWaiting() {
		s.answerPlace(p)
	}
}

// --- hibernation ----------------------------------------------------------

func (s *sessionActor) onIdle(ctx proto.Context) {
	switch {
	case s.act.phase == phaseNew:
		s.act.toPassivating()
		ctx.Send(ctx.Parent(), &passivate{pid: s.self})
	case s.act.phase == phaseActive && s.idle():
		s.log.Debug("hibernating")
		s.drain()
	}
}

// drain stops new commands from reaching the session: the Cmd subscription
// is drained, so commands already delivered are still handled, and a request
// sent after the server dropped the interest fails with no responders, which
// makes the gateway place the session again.
func (s *sessionActor) drain() {
	sub := s.act.sub
	s.act.sub = nil
	s.act.draining = sub
	s.act.toDraining() // a session being deleted stays deleting
	if sub == nil {
		s.send(&cmdDrained{})
		return
	}
	if err := sub.Drain(); err != nil {
		sub.Unsubscribe()
		s.send(&cmdDrained{sub: sub})
		return
	}
	s.spawn(func() {
		waitSubClosed(s.h.ctx, sub)
		s.send(&cmdDrained{sub: sub})
	})
}

func (s *sessionActor) onDrained(ctx proto.Context, sub *nats.Subscription) {
	if sub != s.act.draining {
		return
	}
	s.act.draining = nil
	switch s.act.phase {
	case phaseDeleting:
		s.tryFinishDelete()
	case phaseDraining:
		if s.act.shutting && s.quiet() || !s.act.shutting && s.idle() {
			s.close(ctx)
			return
		}
		// Work arrived while draining: serve again.
		s.act.toWaking()
		subject, self := s.h.cfg.Subjects.Cmd(s.id), s.self
		s.spawn(func() {
			ctx, cancel := context.WithTimeout(s.h.ctx, openTimeout)
			defer cancel()
			sub, err := s.opener.subscribe(ctx, subject, self)
			s.mu.Lock()
			s.handoff = &handoff{sub: sub, err: err}
			s.mu.Unlock()
			s.send(&subscribed{})
		})
	}
}

func (s *sessionActor) onSubscribed(ctx proto.Context) {
	ho := s.takeHandoff()
	if ho == nil {
		return
	}
	if s.act.phase != phaseWaking {
		if ho.sub != nil {
			ho.sub.Unsubscribe()
		}
		return
	}
	s.act.toActive()
	if ho.err != nil {
		// Without a subscription nobody can reach the session: it finishes
		// what it has and hibernates; the next request places it again.
		s.log.Warn("re-subscribe", "err", ho.err)
		for _, p := range s.act.takeWaiting() {
			respond(p.msg, errorReply(session.Errorf(session.CodeUnavailable, "the session could not subscribe; retry")))
		}
		return
	}
	s.act.sub = ho.sub
	s.answerWaiting()
}

// maxHibernating is how many sessions of a host checkpoint and close their
// history at once (except while the host closes). Those steps fsync, and the Go runtime gives each blocked
// system call its own OS thread and never ends one: 500 sessions
// hibernating together (atrium bench --scenarios memory at load 20) left
// 400 threads, about 50 KiB each in stacks (g0 and signal stacks), most of
// the 40–60 KiB of memory then measured per hibernated session.
const maxHibernating = 4

// hibernateSlot waits for one of the host's hibernation slots and returns
// the function that frees it; without one (ctx ended) it returns a no-op.
func (h *Host) hibernateSlot(ctx context.Context) (free func()) {
	if h.hibernating == nil {
		return func() {}
	}
	select {
	case h.hibernating <- struct{}{}:
		return func() { <-h.hibernating }
	case <-ctx.Done():
		return func() {}
	}
}

// close closes the history on a goroutine once reads and commits are done;
// closedMsg follows.
func (s *sessionActor) close(ctx proto.Context) {
	s.act.toClosing()
	s.files.abort() // files.go
	s.h.metrics.hibernated(&s.act.metered)
	hist, c := s.hist, s.events.committer
	s.events.committer = nil
	s.stopCatalogTimer()
	// A session stopped by a closing host with prompts still queued stays
	// active in the catalog: the next Start resumes it.
	state := session.StateHibernated
	if s.queue.turns.Queued() > 0 {
		state = session.StateActive
	}
	entry := s.catalogEntry(state)
	l, fence, epoch := s.lease, s.fence, s.events.meta.Epoch
	durable, ckptSeq := s.events.durable, s.ckptSeq
	s.events.closing = c
	replace := s.act.shutting && s.queue.turns.Queued() > 0
	// A closing host hibernates every session at once and then exits:
	// its threads do not outlive it, and its deadline must not wait on
	// slots.
	slotted := !s.act.shutting
	owner := s.events.meta.Owner
	s.lease = nil
	s.stopCheckpointTimer()
	s.spawn(func() {
		s.readsWG.Wait()
		c.stop()
		ctx, cancel := context.WithTimeout(s.h.ctx, openTimeout)
		defer cancel()
		free := func() {}
		if slotted {
			free = s.h.hibernateSlot(ctx)
		}
		// Only what the stream has too, and only while the lease holds (a
		// node that lost it must not write a checkpoint a new owner could
		// restore).
		if l.valid() && !c.uncaptured.Load() && durable != ckptSeq {
			if seq, err := s.h.checkpoint(ctx, s.id, epoch, hist, fence, c.acked.Load(), l); err != nil {
				// The stream still holds what the checkpoint lacks.
				s.log.Warn("checkpoint at hibernation", "err", err)
			} else if s.h.cfg.Checkpoints != nil {
				l.checkpointed.Store(int64(seq))
			}
		}
		if err := hist.Close(); err != nil {
			s.log.Warn("close history", "err", err)
		}
		free()
		l.release(ctx)
		// Hibernated means the file is closed (and checkpointed).
		s.h.catalog.put(entry)
		if replace {
			// Queued prompts run on another node: it may take the
			// session now that the lease is free.
			s.h.replace(s.id, owner)
		}
		s.send(&closedMsg{})
	})
	s.hist = nil
}

// passivate asks the manager to stop this actor; place requests that arrive
// meanwhile go back to the manager, which holds them until the actor is gone
// and then starts a new one.
func (s *sessionActor) passivate(ctx proto.Context) {
	s.act.toPassivating()
	ctx.Send(ctx.Parent(), &passivate{pid: s.self})
	for _, p := range s.act.takeWaiting() {
		ctx.Send(ctx.Parent(), &bounced{m: p})
	}
}

// --- shutdown -------------------------------------------------------------

func (s *sessionActor) onShutdown(ctx proto.Context) {
	s.act.shutting = true
	switch s.act.phase {
	case phaseNew:
		s.act.toPassivating()
		ctx.Send(ctx.Parent(), &passivate{pid: s.self})
	}
	if s.queue.runner != nil {
		// Running turns may finish within DrainGrace; then they are
		// cancelled.
		s.timers.armDrain(s.h.cfg.DrainGrace, func() { s.send(&drainExpired{}) })
	}
}

// maybeShutdown starts hibernating a session of a closing host as soon as
// its running turn has finished and everything is committed.
func (s *sessionActor) maybeShutdown() {
	if s.act.shutting && s.act.phase == phaseActive && s.quiet() {
		if !s.act.shutdownSlept && s.sandbox.box != nil && s.h.boxes.isAwake(s.sandbox.box) {
			// A forced stop: save the workspace and put the sandbox to
			// sleep first, logging both.
			s.act.shutdownSlept = true
			s.startSleep("the server is shutting down")
			return
		}
		s.drain()
	}
}

// teardownNow releases everything at once: the actor is being stopped or
// restarted without going through hibernation. It waits for the actor's
// goroutines, which all end promptly once the runner is killed and the
// committer's queue is closed.
func (s *sessionActor) teardownNow(why string) {
	s.h.metrics.deactivated(&s.act.metered)
	s.timers.stopIdle()
	s.stopCatalogTimer()
	s.stopCheckpointTimer()
	s.timers.stopDrain()
	if s.act.lost {
		// The stream is out of reach or fenced.
		for _, c := range []*committer{s.events.committer, s.events.closing} {
			if c != nil {
				c.abort()
			}
		}
	}
	if s.act.sub != nil {
		s.act.sub.Unsubscribe()
		s.act.sub = nil
	}
	if s.act.draining != nil {
		s.act.draining.Unsubscribe()
		s.act.draining = nil
	}
	if s.queue.runner != nil {
		s.queue.runner.abandon()
		s.queue.runner = nil
	}
	s.files.abort() // files.go
	s.sandbox.cancelOp()
	if s.events.committer != nil {
		s.events.committer.stop()
		s.events.committer = nil
	}
	s.wg.Wait()
	s.readsWG.Wait()
	// The stopped committer's reports reach a mailbox that no longer
	// settles them (the committer is gone): fail what they carried and
	// what was never handed over, so that every caller waiting for a
	// commit (a prompt's 202, a member change) is answered now, with why
	// the session stopped, instead of timing out at the gateway.
	var stopped error = session.Errorf(session.CodeUnavailable, "the session stopped; retry")
	if s.act.lost && s.act.openErr != nil {
		stopped = s.act.openErr
	}
	if n := s.events.abandon(stopped); n > 0 {
		s.log.Info("failed what waited for a commit: the session stopped", "callbacks", n, "why", why)
	}
	if ho := s.takeHandoff(); ho != nil {
		if ho.sub != nil {
			ho.sub.Unsubscribe()
		}
		if ho.hist != nil {
			ho.hist.Close()
		}
	}
	if s.hist != nil {
		if err := s.hist.Close(); err != nil {
			s.log.Warn("close history", "err", err)
		}
		s.hist = nil
	}
	if s.lease != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.h.cfg.LeaseTTL)
		s.lease.release(ctx)
		cancel()
		s.lease = nil
	}
	for _, p := range s.act.takeWaiting() {
		respond(p.msg, errorReply(stopped))
	}
	if s.act.phase != phasePassivating {
		s.log.Info("session actor torn down", "why", why)
	}
}

// --- helpers --------------------------------------------------------------

// catalogEntry is the session's catalog entry as it is now, naming this
// node, whose disk has the history file, as the one that last held it.
func (s *sessionActor) catalogEntry(state session.State) session.CatalogEntry {
	e := catalogEntry(s.events.meta, s.events.durable, state, s.sandbox.sandboxState)
	e.LastActivity = s.events.lastActivity
	e.Node = s.h.cfg.NodeID
	e.SandboxKind = s.h.cfg.SandboxKind
	return e
}

func catalogEntry(m session.Meta, last session.Seq, state session.State, sb session.SandboxState) session.CatalogEntry {
	return session.CatalogEntry{
		ID: m.ID, Title: m.Title, Owner: m.Owner, Tenant: m.Tenant, Members: m.Members,
		CreatedAt: m.CreatedAt, Epoch: m.Epoch, State: state, LastSeq: last, Sandbox: sb,
		Usage: cloneUsage(m.Usage), InvokeConcurrency: m.InvokeConcurrency,
	}
}

// roleOf returns p's role (session.RoleFor): a caller from another tenant
// has none, a tenant admin is an owner, and a credential's cap lowers it.
func (s *sessionActor) roleOf(p session.Principal) session.Role {
	return session.RoleFor(p, s.events.meta.Tenant, s.events.meta.Owner, s.events.meta.Members)
}

// sessionFor returns the Session object as p sees it.
func (s *sessionActor) sessionFor(p session.Principal) session.Session {
	return session.Session{
		ID: s.id, Title: s.events.meta.Title, Owner: s.events.meta.Owner, CreatedAt: s.events.meta.CreatedAt,
		LastSeq: s.events.durable, Epoch: s.events.meta.Epoch, State: session.StateActive,
		Sandbox: session.NewSandboxInfo(s.sandbox.sandboxState, s.h.cfg.SandboxKind), LastActivity: s.events.lastActivity,
		Egress: slices.Clone(s.events.meta.Egress), Usage: cloneUsage(s.events.meta.Usage), Settings: session.SettingsOf(&s.events.meta),
	}.WithRole(s.roleOf(p), maps.Clone(s.events.meta.Members))
}
