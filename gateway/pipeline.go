package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
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
// order of the frames: while the session is active, the reader publishes
// each command as its frame arrives, up to maxInFlight of them, and the
// commander takes the replies in the same order. When a command finds no
// actor serving the session (hibernated), the commander wakes it and sends
// that command and every later one itself, one at a time in order, until it
// has caught up; then the reader publishes again.
//
// The one reordering left: if another client wakes the session between two
// of our publications, the first may fail (no responders, then retried)
// while the second is appended at once.
type commander struct {
	c      *wsConn
	hdr    nats.Header     // the caller's principal; read-only
	slots  chan struct{}   // capacity maxInFlight: commands not yet answered
	queue  chan *pending   // capacity maxInFlight: in frame order
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns

	mu      sync.Mutex
	direct  bool // guarded by mu: the reader publishes commands itself
	stopped bool // guarded by mu: run has returned; nothing more is queued
}

func newCommander(c *wsConn) *commander {
	k := &commander{
		c:      c,
		hdr:    principalHeader(c.p),
		slots:  make(chan struct{}, maxInFlight),
		queue:  make(chan *pending, maxInFlight),
		done:   make(chan struct{}),
		direct: true,
	}
	k.ctx, k.cancel = context.WithCancel(c.s.ctx)
	return k
}

// submit queues a command; called by the connection's reader, in frame
// order. It waits while maxInFlight commands are unanswered.
func (k *commander) submit(p *pending) {
	select {
	case k.slots <- struct{}{}:
	case <-k.ctx.Done():
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	if k.direct {
		p.deadline = time.Now().Add(k.c.s.reqTimeout)
		data, err := json.Marshal(p.cmd)
		if err == nil {
			msg := &nats.Msg{Subject: k.c.s.subj.Cmd(k.c.id), Data: data, Header: k.hdr}
			traceEnd := noEnd
			if k.c.s.tracer != nil {
				// Each frame's command carries its own trace context;
				// the span covers the publication (the reply comes later).
				msg.Header = maps.Clone(k.hdr)
				_, traceEnd = k.c.s.traceRequest(k.ctx, msg, p.cmd)
			}
			// Follow the serving node before publishing: its lease may
			// end before run awaits the reply.
			var node string
			if e, ok := k.c.s.cache.lookup(k.c.id); ok && e != nil {
				node = e.Node
			}
			p.gone, p.unfollow = k.c.s.nodes.follow(k.ctx, node)
			p.token, p.reply, err = k.c.s.replies.publish(msg)
			traceEnd(err)
		}
		if err != nil {
			p.reply = nil // run sends it, and reports the error if it persists.
		}
	}
	k.queue <- p // never blocks: a slot is held.
}

// stop ends run and waits for it.
func (k *commander) stop() {
	k.cancel()
	<-k.done
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
		<-k.slots
		k.mu.Lock()
		if !k.direct && len(k.queue) == 0 {
			k.direct = true
		}
		k.mu.Unlock()
	}
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
		ack, _ := json.Marshal(session.AckFrame{Type: session.FrameAck, ClientID: p.cmd.ClientID, Seq: reply.Seq})
		c.reply(ack)
	}
}

// principalHeader returns the NATS headers that carry p: user, tenant,
// tenant admin and cap, so that the node decides p's role as the gateway
// does (session.RoleFor).
func principalHeader(p session.Principal) nats.Header {
	return nats.Header(p.Headers())
}
