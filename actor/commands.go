package actor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// recentWindow is how many prompts per session are remembered for client_id
// deduplication.
const recentWindow = 1024

// promptLookupTimeout bounds looking a retried prompt up in the history.
const promptLookupTimeout = 5 * time.Second

// recentPrompts remembers the seq of recent prompts by user and client_id,
// so a retried prompt is acknowledged with its original seq.
//
// It starts empty at each activation. Rather than loading the last prompts
// from the history then (up to recentWindow events read and decoded on every
// wake, milliseconds for a long session, most wakes bringing no prompt), a
// prompt that misses it is looked up in the history (History.PromptSeq, one
// indexed lookup) while the history may hold prompts it does not: a prompt
// from before this activation or one it has forgotten. A retry whose first
// attempt was committed by an earlier activation (before hibernation, or
// on a node that died) thus gets its original seq too.
type recentPrompts struct {
	byKey map[string]*recentPrompt
	order []string // oldest first
	// partial is set when the history may hold prompts with a client_id
	// that byKey lacks.
	partial bool
}

type recentPrompt struct {
	seq     session.Seq
	durable bool
	waiters []func(session.Reply) // retries waiting for the original's commit
}

func (r *recentPrompts) get(key string) *recentPrompt { return r.byKey[key] }

func (r *recentPrompts) add(key string, p *recentPrompt) {
	if r.byKey == nil {
		r.byKey = map[string]*recentPrompt{}
	}
	r.byKey[key] = p
	r.order = append(r.order, key)
	if len(r.order) > recentWindow {
		delete(r.byKey, r.order[0])
		r.order = r.order[1:]
		r.partial = true
	}
}

func (r *recentPrompts) remove(key string) { delete(r.byKey, key) }

// onCmd handles a request from the Cmd subject. Every request is answered
// with a session.Reply, some only once what they caused is durable.
func (s *sessionActor) onCmd(m *cmdMsg) {
	switch s.act.phase {
	case phaseNew, phaseOpening:
		s.act.early = append(s.act.early, m)
		return
	case phaseDeleting, phasePassivating:
		if s.act.openErr != nil {
			// Sent while the history failed to open (the subscription
			// is made meanwhile).
			respond(m.msg, errorReply(s.act.openErr))
			return
		}
		respond(m.msg, errorReply(session.Errorf(session.CodeNotFound, "session not found")))
		return
	case phaseClosing: // Not reachable: the subscription is drained first.
		respond(m.msg, errorReply(session.Errorf(session.CodeUnavailable, "the session is going to sleep; retry")))
		return
	}
	if m.err != nil {
		respond(m.msg, errorReply(m.err))
		return
	}
	c := &m.cmd
	who := principal(m.msg)
	if who.User == "" {
		respond(m.msg, errorReply(session.Errorf(session.CodeUnauthenticated, "no caller in the %s header", session.HeaderUser)))
		return
	}
	s.current = m.msg
	s.queue.traces.cmd = s.h.startCommand(m.msg, s.id, c.Op)
	if s.h.beforeCmd != nil {
		s.h.beforeCmd(s.id, c)
	}
	s.command(m.msg, who, c)
	s.current = nil
	s.queue.traces.cmd.End()
}

func (s *sessionActor) command(msg *nats.Msg, who session.Principal, c *session.Command) {
	if s.fileCommand(msg, who, c) { // files.go
		return
	}
	role := s.roleOf(who)
	need := session.ActRead
	switch c.Op {
	case session.OpPrompt, session.OpPrompts, session.OpCancel, session.OpApprove, session.OpPROpened:
		need = session.ActDrive
	case session.OpMember, session.OpDelete, session.OpSecretSet, session.OpSecretDelete, session.OpSecrets, session.OpEgress, session.OpSettings:
		need = session.ActManage
	case session.OpHistory, session.OpInfo:
	default:
		if err := session.Authorize(role, session.ActRead); err != nil {
			respond(msg, errorReply(err))
			return
		}
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "unknown op %q", c.Op)))
		return
	}
	if err := session.Authorize(role, need); err != nil {
		respond(msg, errorReply(err))
		return
	}
	switch c.Op {
	case session.OpPrompt:
		s.opPrompt(msg, who.User, c)
	case session.OpPrompts:
		s.opPrompts(msg, who.User, c)
	case session.OpCancel:
		s.opCancel(msg, c)
	case session.OpApprove:
		s.opApprove(msg, who.User, c)
	case session.OpHistory:
		s.opHistory(msg, c)
	case session.OpInfo:
		sess := s.sessionFor(who)
		respond(msg, session.Reply{Session: &sess})
	case session.OpMember:
		s.opMember(msg, who.User, c)
	case session.OpDelete:
		s.opDelete(msg)
	case session.OpSecretSet:
		s.opSecretSet(msg, who.User, c)
	case session.OpSecretDelete:
		s.opSecretDelete(msg, c)
	case session.OpSecrets:
		s.opSecrets(msg)
	case session.OpEgress:
		s.opEgress(msg, who, c)
	case session.OpSettings:
		s.opSettings(msg, who, c) // settings.go
	case session.OpPROpened:
		s.opPROpened(msg, who.User, c)
	}
}

func (s *sessionActor) opPrompt(msg *nats.Msg, user string, c *session.Command) {
	var lk lookupCtx
	defer lk.end()
	s.prompt(&lk, user, c.Text, c.ClientID, func(rep session.Reply) { respond(msg, rep) })
}

// opPrompts appends the prompts of one request in order, as opPrompt would
// each, and answers once every one of them is answered: they are emitted
// in this Receive, so they commit together.
func (s *sessionActor) opPrompts(msg *nats.Msg, user string, c *session.Command) {
	n := len(c.Prompts)
	switch {
	case n == 0:
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "prompts is empty")))
		return
	case n > session.MaxPromptsPerCommand:
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "more than %d prompts in one command", session.MaxPromptsPerCommand)))
		return
	}
	results := make([]session.Reply, n)
	left := n
	var lk lookupCtx // one for the whole batch's lookups
	defer lk.end()
	for i, p := range c.Prompts {
		s.prompt(&lk, user, p.Text, p.ClientID, func(rep session.Reply) {
			results[i] = rep
			if left--; left == 0 {
				respond(msg, session.Reply{Results: results})
			}
		})
	}
}

// prompt appends a prompt of user and calls answer, on the actor, once: with
// its seq when it is durable (or was already: a retried client_id), or with
// the error that refused or dropped it.
func (s *sessionActor) prompt(lk *lookupCtx, user, text, clientID string, answer func(session.Reply)) {
	switch {
	case strings.TrimSpace(text) == "":
		answer(errorReply(session.Errorf(session.CodeBadRequest, "prompt text is empty")))
		return
	case len(text) > session.MaxTextBytes:
		answer(errorReply(session.Errorf(session.CodePayloadTooLarge, "prompt text is longer than %d bytes", session.MaxTextBytes)))
		return
	case len(clientID) > session.MaxClientIDBytes:
		answer(errorReply(session.Errorf(session.CodeBadRequest, "client_id is longer than %d bytes", session.MaxClientIDBytes)))
		return
	case !utf8.ValidString(text):
		answer(errorReply(session.Errorf(session.CodeBadRequest, "prompt text is not valid UTF-8")))
		return
	}
	key := ""
	if clientID != "" {
		key = user + "\x00" + clientID
		if p := s.queue.recent.get(key); p != nil {
			if p.durable {
				answer(session.Reply{Seq: p.seq})
			} else {
				p.waiters = append(p.waiters, answer)
			}
			return
		}
		if s.queue.recent.partial {
			seq, err := s.committedPrompt(lk.get(s.h.ctx), user, clientID)
			if err != nil {
				answer(errorReply(err))
				return
			}
			if seq > 0 {
				s.queue.recent.add(key, &recentPrompt{seq: seq, durable: true})
				answer(session.Reply{Seq: seq})
				return
			}
		}
	}
	data := messageData(text, clientID)
	if len(data) > s.events.maxData {
		answer(errorReply(session.Errorf(session.CodePayloadTooLarge, "prompt is too large once encoded")))
		return
	}
	span := s.queue.traces.cmd
	rp := &recentPrompt{}
	rp.seq = s.events.emit(session.KindMessage, user, data, func(err error) {
		if err != nil {
			if key != "" {
				s.queue.recent.remove(key)
			}
			answer(errorReply(err))
			for _, w := range rp.waiters {
				w(errorReply(err))
			}
			return
		}
		rp.durable = true
		s.queue.traces.queued(rp.seq, span)
		s.queue.turns.Enqueue(session.Prompt{Seq: rp.seq, Text: text, By: user})
		rep := session.Reply{Seq: rp.seq}
		answer(rep)
		for _, w := range rp.waiters {
			w(rep)
		}
		rp.waiters = nil
		s.maybeStartTurn()
	})
	if key != "" {
		s.queue.recent.add(key, rp)
	}
}

// committedPrompt returns the seq of the prompt user sent with clientID as
// the history holds it, 0 if there is none. The actor waits for the lookup
// (tens of microseconds, longer only behind an Append in progress): what
// comes after depends on it.
func (s *sessionActor) committedPrompt(ctx context.Context, user, clientID string) (session.Seq, error) {
	seq, err := s.hist.PromptSeq(ctx, user, clientID)
	if err != nil {
		s.log.Warn("look up a retried prompt", "err", err)
		return 0, session.Errorf(session.CodeUnavailable, "could not check whether this prompt was already received; retry")
	}
	return seq, nil
}

// lookupCtx bounds the retried-prompt lookups of one command with
// promptLookupTimeout. Its context is made at the first lookup (most
// commands make none, and a batch's prompts share one).
type lookupCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (l *lookupCtx) get(parent context.Context) context.Context {
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithTimeout(parent, promptLookupTimeout)
	}
	return l.ctx
}

func (l *lookupCtx) end() {
	if l.cancel != nil {
		l.cancel()
	}
}

// maxEventData is the largest event data that still publishes within the
// connection's max payload. (nats.Conn.MaxPayload takes the connection's
// lock, so the session reads it once when it activates.)
func maxEventData(nc *nats.Conn) int {
	return int(nc.MaxPayload()) - 1024
}

func (s *sessionActor) opCancel(msg *nats.Msg, c *session.Command) {
	if c.PromptSeq > 0 { // only that prompt's turn, running or queued (invoke).
		turn, err := s.queue.turns.CancelPrompt(c.PromptSeq)
		if err != nil {
			respond(msg, errorReply(err))
			return
		}
		if turn == nil { // queued: its turn will finish cancelled without running.
			respond(msg, session.Reply{})
			return
		}
	} else if _, err := s.queue.turns.Cancel(); err != nil {
		respond(msg, errorReply(err))
		return
	}
	if s.queue.runner != nil {
		s.queue.runner.stop(stopRequest{status: session.TurnCancelled})
	}
	respond(msg, session.Reply{})
}

func (s *sessionActor) opApprove(msg *nats.Msg, user string, c *session.Command) {
	if c.ApprovalID == "" {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "approval_id is required")))
		return
	}
	// An agent's approval is answered with one of its options (agent.go).
	opt, isAgent, err := s.agentOption(c.ApprovalID, c.OptionID, c.Allow)
	if err != nil {
		respond(msg, errorReply(err))
		return
	}
	if c.OptionID != "" && !isAgent && !s.queue.turns.Pending(c.ApprovalID) {
		// Not asked yet (or answered): a client may wait for it.
		respond(msg, errorReply(session.Errorf(session.CodeNotFound, "no pending approval %q", c.ApprovalID)))
		return
	}
	if c.OptionID != "" && !isAgent {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "approval %q has no options; answer it with allow", c.ApprovalID)))
		return
	}
	turn, err := s.queue.turns.ResolveApproval(c.ApprovalID)
	if err != nil {
		respond(msg, errorReply(err))
		return
	}
	r, id, allow := s.queue.runner, c.ApprovalID, c.Allow
	if isAgent {
		allow = allows(opt.Kind)
	}
	s.events.emit(session.KindApprovalResolved, user,
		mustMarshal(session.ApprovalResolvedData{Turn: turn, ID: id, Allow: allow, OptionID: opt.ID}),
		func(err error) {
			if err != nil {
				// Not durable: the approval is still pending.
				_ = s.queue.turns.RequestApproval(turn, id)
				respond(msg, errorReply(err))
				return
			}
			if r != nil && r == s.queue.runner {
				r.answer(session.ApprovalAnswer{Type: "approval", ID: id, Allow: allow, OptionID: opt.ID})
			}
			respond(msg, session.Reply{})
		})
}

func (s *sessionActor) opHistory(msg *nats.Msg, c *session.Command) {
	// The committer publishes an event as soon as it is durable and tells
	// the actor afterwards, so a client may resume from an event the actor
	// has not yet counted. The history's own last seq is already past it.
	last := s.events.durable
	if l, err := s.hist.LastSeq(context.Background()); err == nil && l > last {
		last = l
	}
	switch {
	case c.After < 0:
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "after must not be negative")))
		return
	case c.After > last:
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "after %d is beyond the last event %d", c.After, last)))
		return
	case c.Limit < 0 || c.MaxBytes < 0:
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "limit and max_bytes must not be negative")))
		return
	}
	limit := c.Limit
	if limit == 0 {
		limit = defaultHistoryLimit
	}
	maxBytes := c.MaxBytes
	if maxBytes == 0 || maxBytes > session.DefaultHistoryMaxBytes {
		maxBytes = session.DefaultHistoryMaxBytes
	}
	s.readsWG.Add(1)
	job := readJob{
		hist: s.hist, msg: msg, after: c.After, lastSeq: last,
		limit: min(limit, maxHistoryLimit), max: maxBytes, epoch: s.events.meta.Epoch,
		done: s.readsWG.Done,
	}
	select {
	case s.h.reads <- job:
	default:
		s.readsWG.Done()
		respond(msg, errorReply(session.Errorf(session.CodeTooManyRequests, "too many history reads in progress; retry")))
	}
}

func (s *sessionActor) opMember(msg *nats.Msg, caller string, c *session.Command) {
	if err := session.ValidUser(c.User); err != nil {
		respond(msg, errorReply(err))
		return
	}
	role, err := session.ParseRole(string(c.Role))
	if err != nil {
		respond(msg, errorReply(err))
		return
	}
	if c.User == s.events.meta.Owner {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "the owner's own role cannot be changed")))
		return
	}
	next := s.events.metaNext
	next.Members = cloneMembers(next.Members)
	if role == session.RoleNone {
		delete(next.Members, c.User)
	} else {
		next.Members[c.User] = role
	}
	s.events.metaNext = next
	s.events.metaDirty = true
	s.events.emit(session.KindMemberChanged, caller, mustMarshal(session.MemberChangedData{User: c.User, Role: role}),
		func(err error) {
			if err != nil {
				respond(msg, errorReply(err))
				return
			}
			// Gateways authorize from the catalog: the reply waits for
			// the entry with the new role, so that the caller's next
			// request is judged by it.
			s.putCatalogThen(func() { respond(msg, session.Reply{}) })
		})
}

// opDelete stops the session for good: the running turn is cancelled, the
// Cmd subscription drained, then (off the actor) the history, the sandbox and
// the catalog entry are removed and watchers are told. The reply comes last.
func (s *sessionActor) opDelete(msg *nats.Msg) {
	s.act.toDeleting(msg)
	s.stopCatalogTimer()
	if s.queue.runner != nil {
		s.queue.runner.stop(stopRequest{status: session.TurnCancelled})
	}
	s.drain()
	s.tryFinishDelete()
}

// tryFinishDelete starts removing the session once nothing runs, nothing is
// being committed and no command can arrive any more.
func (s *sessionActor) tryFinishDelete() {
	if s.act.phase != phaseDeleting || s.act.deleteStarted || s.queue.runner != nil || s.sandbox.op != nil || s.events.uncommitted > 0 ||
		len(s.events.outbox) > 0 || s.act.draining != nil {
		return
	}
	s.act.deleteStarted = true
	hist, c, b, msg := s.hist, s.events.committer, s.sandbox.box, s.act.deleteMsg
	if b == nil {
		b = &box{id: s.id}
	}
	hadSandbox := b.sb != nil || (s.sandbox.sandboxState != session.SandboxNone && s.sandbox.sandboxState != "")
	l, fence := s.lease, s.fence
	s.hist, s.events.committer, s.sandbox.box, s.lease = nil, nil, nil, nil
	s.stopCheckpointTimer()
	s.h.boxes.remove(s.id)
	s.spawn(func() {
		ctx, cancel := context.WithTimeout(s.h.ctx, openTimeout)
		defer cancel()
		s.readsWG.Wait()
		c.stop()
		var errs []error
		if err := hist.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := s.h.cfg.Histories.Remove(ctx, s.id); err != nil {
			errs = append(errs, err)
		}
		if err := s.h.destroyBox(ctx, b, hadSandbox, fence); err != nil {
			errs = append(errs, err)
		}
		if err := s.h.forget(ctx, s.id); err != nil {
			errs = append(errs, err)
		}
		s.h.catalog.remove(s.id)
		s.h.catalog.flush()
		ctl := &nats.Msg{Subject: s.h.cfg.Subjects.Capture(s.id), Header: nats.Header{}}
		ctl.Header.Set(session.HeaderControl, string(session.ControlDeleted))
		if err := s.h.cfg.NATS.PublishMsg(ctl); err != nil {
			errs = append(errs, fmt.Errorf("publish deleted: %w", err))
		}
		if err := errors.Join(errs...); err != nil {
			s.log.Warn("delete session", "err", err)
			respond(msg, errorReply(err))
		} else {
			s.log.Info("session deleted")
			respond(msg, session.Reply{})
		}
		l.release(ctx)
		s.h.dropReleased(s.id)
		s.send(&deletedMsg{})
	})
}
