package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// maxInFlight bounds the commands of one WebSocket that wait for the
// session's reply. The reader stops reading frames while it is reached.
const maxInFlight = 32

// replyMux routes the replies to requests that the gateway publishes itself
// rather than with nats.Conn.Request, so that a connection can publish
// several commands in order without waiting for each reply. It has one
// subscription, to <inbox>.*, made on first use and ended by close.
type replyMux struct {
	nc *nats.Conn

	mu      sync.Mutex
	prefix  string                    // guarded by mu: "<inbox>." once subscribed
	sub     *nats.Subscription        // guarded by mu
	closed  bool                      // guarded by mu
	next    uint64                    // guarded by mu
	waiting map[string]chan *nats.Msg // guarded by mu: by token
}

var errMuxClosed = errors.New("gateway: reply subscription closed")

// publish sends msg as a request and returns the token of its reply and the
// channel (capacity 1) the reply will arrive on. The caller receives it or
// cancels the token.
func (m *replyMux) publish(msg *nats.Msg) (string, chan *nats.Msg, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return "", nil, errMuxClosed
	}
	if m.sub == nil {
		prefix := m.nc.NewInbox() + "."
		sub, err := m.nc.Subscribe(prefix+"*", m.deliver)
		if err != nil {
			m.mu.Unlock()
			return "", nil, fmt.Errorf("subscribe to replies: %w", err)
		}
		m.prefix, m.sub, m.waiting = prefix, sub, make(map[string]chan *nats.Msg)
	}
	m.next++
	token := strconv.FormatUint(m.next, 36)
	ch := make(chan *nats.Msg, 1)
	m.waiting[token] = ch
	msg.Reply = m.prefix + token
	m.mu.Unlock()
	if err := m.nc.PublishMsg(msg); err != nil {
		m.cancel(token)
		return "", nil, err
	}
	return token, ch, nil
}

// cancel forgets a request whose reply is no longer awaited.
func (m *replyMux) cancel(token string) {
	m.mu.Lock()
	delete(m.waiting, token)
	m.mu.Unlock()
}

func (m *replyMux) deliver(msg *nats.Msg) {
	m.mu.Lock()
	token := msg.Subject[min(len(m.prefix), len(msg.Subject)):]
	ch := m.waiting[token]
	delete(m.waiting, token)
	m.mu.Unlock()
	if ch != nil {
		ch <- msg // never blocks: capacity 1, one reply per token.
	}
}

// close ends the subscription. Connections have ended by then.
func (m *replyMux) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.sub != nil {
		_ = m.sub.Unsubscribe()
	}
}

// pending is a command of a WebSocket on its way to the session.
type pending struct {
	cmd      session.Command
	clientID string // echoed in the ack or error frame
	// items, when set, are the prompt frames this request carries together
	// (cmd is then their OpPrompts); each is answered from its result.
	// probe: the first OpPrompts of the connection (see promptsState).
	items []*pending
	probe bool
	// token and reply are the request in flight; reply is nil when the
	// command was not published, and the commander sends it.
	token    string
	reply    chan *nats.Msg
	deadline time.Time
	// gone ends when the lease of the node serving the session (the
	// catalog's hint when the command was published) ends; unfollow
	// stops following it. Both are set with reply.
	gone     context.Context
	unfollow func()
}

// commander sends a WebSocket's commands (prompt, cancel, approve) to its
// session and answers each with an ack or an error frame. It keeps the
// order of the frames: while the session is active, its publisher publishes
// the commands the reader submitted, in frame order, up to maxInFlight of
// them unanswered, and run takes the replies in the same order. Prompt
// frames that queued up while the publisher was busy go in one request
// (session.OpPrompts, up to session.MaxPromptsPerCommand): under load a
// connection's prompts cost one NATS request and one reply per batch, not
// per frame, and their acks leave in one write. When a command finds no
// actor serving the session (hibernated), run wakes it and sends that
// command and every later one itself, one at a time in order, until it has
// caught up; then the publisher publishes again.
//
// The one reordering left: if another client wakes the session between two
// of our publications, the first may fail (no responders, then retried)
// while the second is appended at once.
type commander struct {
	c      *wsConn
	hdr    nats.Header     // the caller's principal; read-only
	slots  chan struct{}   // capacity maxInFlight: commands not yet answered
	queue  chan *pending   // capacity maxInFlight: in frame order
	kick   chan struct{}   // capacity 1: submitted holds commands for publish
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	pubEnd chan struct{} // closed when publish returns

	mu        sync.Mutex
	submitted []*pending   // guarded by mu: in frame order, not yet queued
	direct    bool         // guarded by mu: the publisher publishes commands
	prompts   promptsState // guarded by mu: whether the node takes OpPrompts
	stopped   bool         // guarded by mu: run has returned; nothing more is queued
}

// promptsState is what a commander knows of its node's OpPrompts. Until
// one was answered, the first is a probe: nothing is published after it
// until its answer, so that a node that predates it (which refuses it while
// it would append the prompts published after it) cannot reorder frames;
// they are then sent one by one.
type promptsState uint8

const (
	promptsUnknown promptsState = iota
	promptsProbing              // one is in flight; the publisher waits
	promptsTaken
	promptsRefused
)

func newCommander(c *wsConn) *commander {
	k := &commander{
		c:      c,
		hdr:    principalHeader(c.p),
		slots:  make(chan struct{}, maxInFlight),
		queue:  make(chan *pending, maxInFlight),
		kick:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		pubEnd: make(chan struct{}),
		direct: true,
	}
	k.ctx, k.cancel = context.WithCancel(c.s.ctx)
	return k
}

// submit hands a command to the publisher; called by the connection's
// reader, in frame order. It waits while maxInFlight commands are
// unanswered.
func (k *commander) submit(p *pending) {
	select {
	case k.slots <- struct{}{}:
	case <-k.ctx.Done():
		return
	}
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	k.submitted = append(k.submitted, p)
	k.mu.Unlock()
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// publish is the commander's publisher: it queues the submitted commands for
// run, in order, publishing them first while the session is active; the
// prompts submitted meanwhile go together (see commander).
func (k *commander) publish() {
	defer close(k.pubEnd)
	var spare []*pending
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-k.kick:
		}
		k.mu.Lock()
		if k.stopped {
			k.mu.Unlock()
			return
		}
		cmds := k.submitted
		k.submitted = spare[:0]
		for i := 0; i < len(cmds); {
			if k.prompts == promptsProbing {
				// The rest waits for the probe's answer (run kicks).
				k.submitted = append(k.submitted, cmds[i:]...)
				break
			}
			p, n := cmds[i], 1
			if k.direct && k.prompts != promptsRefused && p.cmd.Op == session.OpPrompt {
				for i+n < len(cmds) && n < session.MaxPromptsPerCommand && cmds[i+n].cmd.Op == session.OpPrompt {
					n++
				}
			}
			if n > 1 {
				p = promptsOf(cmds[i : i+n])
				if k.prompts == promptsUnknown {
					k.prompts, p.probe = promptsProbing, true
				}
			}
			if k.direct {
				k.publishLocked(p)
			}
			k.queue <- p // never blocks: each queued command holds a slot.
			i += n
		}
		clear(cmds)
		spare = cmds
		k.mu.Unlock()
	}
}

// promptsOf returns the request that carries the prompt frames ps.
func promptsOf(ps []*pending) *pending {
	items := slices.Clone(ps)
	prompts := make([]session.PromptItem, len(items))
	for i, it := range items {
		prompts[i] = session.PromptItem{Text: it.cmd.Text, ClientID: it.cmd.ClientID}
	}
	return &pending{cmd: session.Command{Op: session.OpPrompts, Prompts: prompts}, items: items}
}

// publishLocked publishes p's command as a request; if it cannot, p.reply
// stays nil and run sends it, and reports the error if it persists. k.mu
// is held.
func (k *commander) publishLocked(p *pending) {
	p.deadline = time.Now().Add(k.c.s.reqTimeout)
	data, err := json.Marshal(p.cmd)
	if err != nil {
		return
	}
	msg := &nats.Msg{Subject: k.c.s.subj.Cmd(k.c.id), Data: data, Header: k.hdr}
	traceEnd := noEnd
	if k.c.s.tracer != nil {
		// Each request carries its own trace context; the span covers the
		// publication (the reply comes later).
		msg.Header = maps.Clone(k.hdr)
		_, traceEnd = k.c.s.traceRequest(k.ctx, msg, p.cmd)
	}
	// Follow the serving node before publishing: its lease may end before
	// run awaits the reply.
	var node string
	if e, ok := k.c.s.cache.lookup(k.c.id); ok && e != nil {
		node = e.Node
	}
	p.gone, p.unfollow = k.c.s.nodes.follow(k.ctx, node)
	p.token, p.reply, err = k.c.s.replies.publish(msg)
	traceEnd(err)
	if err != nil {
		p.reply = nil
	}
}

// stop ends run and the publisher and waits for them.
func (k *commander) stop() {
	k.cancel()
	<-k.done
	<-k.pubEnd
}

// run answers the queued commands in order until the connection ends.
func (k *commander) run() {
	defer close(k.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var p *pending
		select {
		case <-k.ctx.Done():
			k.mu.Lock()
			defer k.mu.Unlock()
			k.stopped = true
			for {
				select {
				case p := <-k.queue:
					k.c.s.replies.cancel(p.token)
					if p.unfollow != nil {
						p.unfollow()
					}
				default:
					return
				}
			}
		case p = <-k.queue:
		}
		var reply *session.Reply
		err := nats.ErrNoResponders
		if p.reply != nil {
			reply, err = k.await(p, timer)
		}
		if p.unfollow != nil {
			p.unfollow()
		}
		if p.items == nil {
			k.settle(p, reply, err)
			<-k.slots
		} else {
			k.settleItems(p, reply, err)
			for range p.items {
				<-k.slots
			}
		}
		k.mu.Lock()
		if !k.direct && len(k.queue) == 0 && len(k.submitted) == 0 {
			k.direct = true
		}
		k.mu.Unlock()
	}
}

// settle answers a command from the reply to its request, or sends it
// again, or through call, as the request's error requires.
func (k *commander) settle(p *pending, reply *session.Reply, err error) {
	switch {
	case errors.Is(err, errNodeGone) && !repeatable(p.cmd):
		err = k.c.s.notRepeated(k.c.id, p.cmd, err)
	case errors.Is(err, errNodeGone):
		// Its node stopped while handling it: send it again, through
		// call, which places the session if it must.
		k.c.s.metrics.failovers.WithLabelValues(failoverRetried).Inc()
		fallthrough
	case errors.Is(err, nats.ErrNoResponders):
		k.setDirect(false)
		reply, err = k.c.s.call(k.ctx, k.c.p, k.c.id, p.cmd, true)
	default:
		err = natsError(err)
	}
	k.answer(p, reply, err)
}

// settleItems answers the prompts of an OpPrompts request from their
// results. When the request as a whole failed, each prompt is settled as
// if it had been sent alone with that error (sent again if its node
// stopped and it has a client_id, through call if the session was not
// active); a node that does not know OpPrompts gets them one by one.
func (k *commander) settleItems(p *pending, reply *session.Reply, err error) {
	if err == nil && len(reply.Results) != len(p.items) {
		err = session.Errorf(session.CodeInternal, "session %s answered %d results to %d prompts", k.c.id, len(reply.Results), len(p.items))
	}
	if p.probe {
		defer func() {
			k.mu.Lock()
			switch {
			case err == nil:
				k.prompts = promptsTaken
			case unknownOp(err):
				k.prompts = promptsRefused
			default: // not known yet: the next OpPrompts probes again.
				k.prompts = promptsUnknown
			}
			k.mu.Unlock()
			select {
			case k.kick <- struct{}{}:
			default:
			}
		}()
	}
	if err == nil {
		for i, it := range p.items {
			r := &reply.Results[i]
			if r.Error != nil {
				k.answer(it, nil, r.Error)
			} else {
				k.answer(it, r, nil)
			}
		}
		return
	}
	if unknownOp(err) {
		for _, it := range p.items {
			reply, err := k.c.s.call(k.ctx, k.c.p, k.c.id, it.cmd, true)
			k.answer(it, reply, err)
		}
		return
	}
	for _, it := range p.items {
		k.settle(it, nil, err)
	}
}

// unknownOp reports whether err is a node's answer to an op it does not
// know (one that predates it).
func unknownOp(err error) bool {
	var e *session.Error
	return errors.As(err, &e) && e.Code == session.CodeBadRequest && strings.HasPrefix(e.Message, "unknown op")
}

func (k *commander) setDirect(v bool) {
	k.mu.Lock()
	k.direct = v
	k.mu.Unlock()
}

// await waits for the reply to a published command. It gives up with an
// error matching errNodeGone when the lease of the node serving the session
// (the catalog's hint) ends first.
func (k *commander) await(p *pending, timer *time.Timer) (*session.Reply, error) {
	timer.Reset(time.Until(p.deadline))
	defer timer.Stop()
	select {
	case m := <-p.reply:
		return decodeReply(k.c.s.subj.Cmd(k.c.id), m)
	case <-p.gone.Done():
		k.c.s.replies.cancel(p.token)
		if cause := context.Cause(p.gone); errors.Is(cause, errNodeGone) {
			return nil, cause
		}
		return nil, k.ctx.Err()
	case <-timer.C:
		k.c.s.replies.cancel(p.token)
		return nil, context.DeadlineExceeded
	case <-k.ctx.Done():
		k.c.s.replies.cancel(p.token)
		return nil, k.ctx.Err()
	}
}

// answer tells the client how its command went.
func (k *commander) answer(p *pending, reply *session.Reply, err error) {
	c := k.c
	if err != nil {
		if session.AsError(err).Code == session.CodeInternal {
			c.s.log.Error("session command", "session", string(c.id), "op", string(p.cmd.Op), "err", err)
		}
		c.s.auditDenied(k.ctx, c.remote, c.p, c.id, string(p.cmd.Op)+" frame", c.access.entry, err)
		c.reply(errorFrame(err, p.clientID))
		return
	}
	if p.cmd.Op == session.OpPrompt {
		c.reply(ackFrame(p.cmd.ClientID, reply.Seq))
	}
}

// principalHeader returns the NATS headers that carry p: user, tenant,
// tenant admin and cap, so that the node decides p's role as the gateway
// does (session.RoleFor).
func principalHeader(p session.Principal) nats.Header {
	return nats.Header(p.Headers())
}
