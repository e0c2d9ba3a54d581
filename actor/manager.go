package actor

import (
	"encoding/json"
	"maps"

	proto "github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// placeMsg is a request from the place subject, already parsed.
type placeMsg struct {
	msg  *nats.Msg
	req  session.PlaceRequest
	user session.Principal
	// sleep, when not 0, is the generation of the session's sandbox sleep
	// timer that fired: the node, not a client, activates the session so
	// that it saves and sleeps its sandbox (msg is nil).
	sleep uint64
	// seed, on a create for a fork, is the parent's history up to the
	// fork's seq (files.go).
	seed []json.RawMessage
}

// passivate is a session actor asking the manager to stop it: it has closed
// its history and its Cmd subscription is gone.
type passivate struct{ pid *proto.PID }

// bounced is a place request a passivating session actor hands back.
type bounced struct{ m *placeMsg }

// shutdown asks the manager (and through it every session) to stop.
type shutdown struct{}

// child is the manager's record of one session actor.
type child struct {
	pid      *proto.PID
	spawn    *spawnInfo
	stopping bool        // Stop sent; waiting for Terminated
	buffer   []*placeMsg // requests that arrived while stopping
}

// manager owns the session actors of the node. It is the only one that
// spawns them, so there is never more than one actor per session; while an
// actor is stopping (it may still hold its history file) requests for its
// session wait in the buffer until Terminated arrives.
type manager struct {
	h        *Host
	children map[session.ID]*child
	byPID    map[string]session.ID
	// peak is the most children the maps held since they were last
	// rebuilt (shrink).
	peak     int
	shutting bool
	done     bool // managerDone closed
	// slept holds the sessions activated during shutdown to put their
	// sandbox to sleep; each is tried once.
	slept map[session.ID]bool
}

func newManager(h *Host) *manager {
	return &manager{h: h, children: map[session.ID]*child{}, byPID: map[string]session.ID{}}
}

// onPlace parses a place request on the subscription's goroutine; requests
// that are malformed are answered here, the rest go to the manager.
func (h *Host) parsePlace(msg *nats.Msg) (*placeMsg, error) {
	p := &placeMsg{msg: msg, user: principal(msg)}
	if err := json.Unmarshal(msg.Data, &p.req); err != nil {
		return nil, session.Errorf(session.CodeBadRequest, "place request is not valid JSON: %v", err)
	}
	if err := p.req.Session.Validate(); err != nil {
		return nil, err
	}
	if err := session.ValidUser(p.user.User); err != nil {
		return nil, session.Errorf(session.CodeUnauthenticated, "no valid caller in the %s header", session.HeaderUser)
	}
	switch p.req.Op {
	case session.PlaceActivate:
	case session.PlaceCreate:
		if p.req.Fork != nil {
			return nil, session.Errorf(session.CodeBadRequest, "forks are made with POST /v1/sessions/{id}/fork")
		}
		if len(p.req.Title) > session.MaxTitleBytes {
			return nil, session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes)
		}
		if err := p.req.Harness.Validate(); err != nil {
			return nil, err
		}
		if t := p.req.Harness.Template; t != "" {
			if _, ok := h.templates[t]; !ok {
				return nil, session.Errorf(session.CodeBadRequest, "unknown harness template %q", t)
			}
		}
		if err := h.checkAgent(p.req.Harness.Agent); err != nil {
			return nil, err
		}
		if err := h.checkCreateSettings(&p.req); err != nil {
			return nil, err // before anything of the session exists
		}
	default:
		return nil, session.Errorf(session.CodeBadRequest, "unknown place op %q", p.req.Op)
	}
	return p, nil
}

func (m *manager) Receive(ctx proto.Context) {
	switch msg := ctx.Message().(type) {
	case *placeMsg:
		m.route(ctx, msg)
	case *bounced:
		m.route(ctx, msg.m)
	case *sessionNote:
		m.routeNote(ctx, msg)
	case *passivate:
		id, ok := m.byPID[msg.pid.Id]
		if c := m.children[id]; ok && c != nil && !c.stopping && c.pid.Equal(msg.pid) {
			// Poison, not Stop: requests already in the child's mailbox
			// come before the pill, so the child bounces them back here
			// instead of dropping them.
			c.stopping = true
			ctx.Poison(c.pid)
		}
	case *proto.Terminated:
		m.terminated(ctx, msg.Who)
	case *shutdown:
		m.shutting = true
		for _, c := range m.children {
			ctx.Send(c.pid, &shutdownSession{})
		}
		m.checkDone(ctx)
	case *proto.Stopped:
		close(m.h.managerStopped)
	}
}

func (m *manager) route(ctx proto.Context, p *placeMsg) {
	if m.shutting {
		respond(p.msg, errorReply(session.Errorf(session.CodeUnavailable, "this node is shutting down; retry")))
		return
	}
	id := p.req.Session
	c := m.children[id]
	if c == nil {
		c = m.spawn(ctx, id)
		if c == nil {
			respond(p.msg, errorReply(session.Errorf(session.CodeInternal, "could not start the session")))
			return
		}
	}
	if c.stopping {
		c.buffer = append(c.buffer, p)
		return
	}
	ctx.Send(c.pid, p)
}

func (m *manager) spawn(ctx proto.Context, id session.ID) *child {
	info := &spawnInfo{}
	props := proto.PropsFromProducer(func() proto.Actor {
		s := newSessionActor(m.h, id, info)
		if m.h.spawned != nil {
			m.h.spawned(s)
		}
		return &sessionCell{s: s}
	})
	pid, err := ctx.SpawnNamed(props, string(id))
	if err != nil {
		m.h.log.Error("spawn session actor", "session", id, "err", err)
		return nil
	}
	c := &child{pid: pid, spawn: info}
	m.children[id] = c
	m.byPID[pid.Id] = id
	m.peak = max(m.peak, len(m.children))
	return c
}

// shrinkAt is the peak below which the manager's maps are never rebuilt.
const shrinkAt = 256

// shrink rebuilds the manager's maps once they hold a quarter of their peak:
// a Go map keeps the memory of the most entries it ever held, so a node
// where many sessions were active at once kept it for each after they
// hibernated.
func (m *manager) shrink() {
	if m.peak < shrinkAt || len(m.children)*4 > m.peak {
		return
	}
	children := make(map[session.ID]*child, len(m.children))
	maps.Copy(children, m.children)
	byPID := make(map[string]session.ID, len(m.byPID))
	maps.Copy(byPID, m.byPID)
	m.children, m.byPID, m.peak = children, byPID, len(children)
}

func (m *manager) terminated(ctx proto.Context, who *proto.PID) {
	id, ok := m.byPID[who.Id]
	if !ok {
		return
	}
	delete(m.byPID, who.Id)
	c := m.children[id]
	if c == nil || !c.pid.Equal(who) {
		return
	}
	delete(m.children, id)
	m.shrink()
	clearStaleChildren(ctx)
	buffered := c.buffer
	for _, p := range buffered {
		m.route(ctx, p) // respawns, or refuses when shutting down
	}
	m.checkDone(ctx)
}

// clearStaleChildren clears the spare capacity of the manager's child set:
// protoactor's PIDSet.Remove leaves the removed PID there, and a PID caches
// its process (mailbox, context, props), so the set kept as many stopped
// children's records as the manager once had children at the same time
// (sessionCell lets go of the actor itself). Children returns the set's own
// slice, and the set is only touched on the manager's goroutine.
func clearStaleChildren(ctx proto.Context) {
	if kids := ctx.Children(); cap(kids) > len(kids) {
		clear(kids[len(kids):cap(kids)])
	}
}

// checkDone finishes a shutdown once every session has stopped. Before
// that, a session whose sandbox is still awake (it hibernated, or was
// hibernating when the shutdown began) is activated to save the workspace,
// put the sandbox to sleep and log it.
func (m *manager) checkDone(ctx proto.Context) {
	if !m.shutting || m.done {
		return
	}
	for _, id := range m.h.boxes.awakeIDs() {
		if m.children[id] != nil || m.slept[id] {
			continue
		}
		if m.slept == nil {
			m.slept = map[session.ID]bool{}
		}
		m.slept[id] = true
		if c := m.spawn(ctx, id); c != nil {
			ctx.Send(c.pid, &placeMsg{req: session.PlaceRequest{Op: session.PlaceActivate, Session: id}})
			ctx.Send(c.pid, &shutdownSession{})
		}
	}
	if len(m.children) == 0 {
		m.done = true
		close(m.h.managerDone)
	}
}

// principal reads the caller from a request's headers, which only gateways
// set: user, tenant, tenant admin and cap.
func principal(msg *nats.Msg) session.Principal {
	if msg.Header == nil {
		return session.Principal{}
	}
	return session.PrincipalFrom(msg.Header.Get)
}

// respond answers a request with rep; a request without a reply subject is
// dropped.
func respond(msg *nats.Msg, rep session.Reply) {
	if msg == nil || msg.Reply == "" {
		return
	}
	_ = msg.Respond(encodeReply(&rep)) // The requester may be gone; nothing to do then.
}

func errorReply(err error) session.Reply { return session.Reply{Error: session.AsError(err)} }
