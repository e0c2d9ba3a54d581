package gateway_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fakeNode is a small stand-in for the node (package actor) that serves the
// NATS protocol of package session for the gateway's tests: it creates and
// activates sessions on the Place subject, answers commands on each active
// session's Cmd subject, keeps events in memory, publishes each after it is
// "committed", and writes the catalog. Tests also drive it directly: append
// events, hibernate sessions, drop the next publications.
type fakeNode struct {
	t    testing.TB
	nc   *nats.Conn
	subj session.Subjects
	kv   jetstream.KeyValue

	mu          sync.Mutex
	sessions    map[session.ID]*fakeSession // guarded by mu
	activations int                         // guarded by mu: PlaceActivate requests served
	drop        int                         // guarded by mu: publications still to drop
	cmds        []session.Command           // guarded by mu: commands received
	// noPrompts: answer OpPrompts as a node that predates it; guarded by mu.
	noPrompts bool
}

type fakeSession struct {
	entry  session.CatalogEntry
	events [][]byte
	cmd    *nats.Subscription // nil while hibernated
}

func startFakeNode(t testing.TB, nc *nats.Conn, subj session.Subjects) *fakeNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subj.CatalogBucket()})
	if err != nil {
		t.Fatalf("create catalog bucket: %v", err)
	}
	n := &fakeNode{t: t, nc: nc, subj: subj, kv: kv, sessions: make(map[session.ID]*fakeSession)}
	sub, err := nc.QueueSubscribe(subj.Place(), subj.PlaceQueue(), n.onPlace)
	if err != nil {
		t.Fatalf("subscribe place: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, s := range n.sessions {
			if s.cmd != nil {
				_ = s.cmd.Unsubscribe()
			}
		}
	})
	return n
}

func (n *fakeNode) respond(m *nats.Msg, r session.Reply) {
	b, _ := json.Marshal(r)
	_ = m.Respond(b)
}

func (n *fakeNode) respondErr(m *nats.Msg, err *session.Error) {
	n.respond(m, session.Reply{Error: err})
}

func (n *fakeNode) onPlace(m *nats.Msg) {
	var req session.PlaceRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		n.respondErr(m, session.Errorf(session.CodeBadRequest, "bad place request"))
		return
	}
	user := m.Header.Get(session.HeaderUser)
	n.mu.Lock()
	defer n.mu.Unlock()
	switch req.Op {
	case session.PlaceCreate:
		if _, ok := n.sessions[req.Session]; ok {
			n.respondErr(m, session.Errorf(session.CodeConflict, "exists"))
			return
		}
		s := &fakeSession{entry: session.CatalogEntry{
			ID: req.Session, Title: req.Title, Owner: user, Tenant: m.Header.Get(session.HeaderTenant),
			Members:   session.Members{user: session.RoleOwner},
			CreatedAt: session.Time{Time: time.Now().UTC()}, Epoch: session.NewEpoch(),
			State: session.StateActive, Sandbox: session.SandboxNone,
		}}
		n.sessions[req.Session] = s
		n.appendLocked(s, session.KindSessionCreated, user, session.SessionCreatedData{Title: req.Title})
		n.activateLocked(s)
		sess := s.entry.SessionFor(user)
		sess.Role = session.RoleFor(session.PrincipalFrom(m.Header.Get), s.entry.Tenant, s.entry.Owner, s.entry.Members)
		n.respond(m, session.Reply{Session: &sess})
	case session.PlaceActivate:
		s, ok := n.sessions[req.Session]
		if !ok {
			n.respondErr(m, session.Errorf(session.CodeNotFound, "session not found"))
			return
		}
		n.activations++
		n.activateLocked(s)
		n.respond(m, session.Reply{})
	default:
		n.respondErr(m, session.Errorf(session.CodeBadRequest, "unknown place op"))
	}
}

func (n *fakeNode) activateLocked(s *fakeSession) {
	if s.cmd != nil {
		return
	}
	id := s.entry.ID
	sub, err := n.nc.Subscribe(n.subj.Cmd(id), func(m *nats.Msg) { n.onCmd(id, m) })
	if err != nil {
		n.t.Errorf("subscribe cmd: %v", err)
		return
	}
	if err := n.nc.Flush(); err != nil { // reply only once the subscription is live.
		n.t.Errorf("flush: %v", err)
	}
	s.cmd = sub
	s.entry.State = session.StateActive
	n.putLocked(s)
}

func (n *fakeNode) putLocked(s *fakeSession) {
	b, _ := json.Marshal(s.entry)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.kv.Put(ctx, string(s.entry.ID), b); err != nil {
		n.t.Errorf("put catalog: %v", err)
	}
}

func (n *fakeNode) appendLocked(s *fakeSession, kind session.Kind, by string, data any) session.Seq {
	seq := session.Seq(len(s.events) + 1)
	raw, err := json.Marshal(session.Event{
		Seq: seq, Epoch: s.entry.Epoch, Time: session.Time{Time: time.Now()}, Kind: kind, By: by, Data: session.MustData(data),
	})
	if err != nil {
		n.t.Errorf("encode event: %v", err)
	}
	s.events = append(s.events, raw)
	s.entry.LastSeq = seq
	if n.drop > 0 {
		n.drop--
		return seq
	}
	if err := n.nc.Publish(n.subj.Events(s.entry.ID), raw); err != nil {
		n.t.Errorf("publish event: %v", err)
	}
	return seq
}

func (n *fakeNode) onCmd(id session.ID, m *nats.Msg) {
	var cmd session.Command
	if err := json.Unmarshal(m.Data, &cmd); err != nil {
		n.respondErr(m, session.Errorf(session.CodeBadRequest, "bad command"))
		return
	}
	p := session.PrincipalFrom(m.Header.Get)
	user := p.User
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cmds = append(n.cmds, cmd)
	s, ok := n.sessions[id]
	if !ok {
		n.respondErr(m, session.Errorf(session.CodeNotFound, "session not found"))
		return
	}
	role := session.RoleFor(p, s.entry.Tenant, s.entry.Owner, s.entry.Members)
	act := session.ActRead
	switch cmd.Op {
	case session.OpPrompt, session.OpPrompts, session.OpCancel, session.OpApprove:
		act = session.ActDrive
	case session.OpMember, session.OpDelete:
		act = session.ActManage
	}
	if err := session.Authorize(role, act); err != nil {
		n.respondErr(m, session.AsError(err))
		return
	}
	switch cmd.Op {
	case session.OpPrompt:
		if strings.TrimSpace(cmd.Text) == "" {
			n.respondErr(m, session.Errorf(session.CodeBadRequest, "prompt text is empty"))
			return
		}
		seq := n.appendLocked(s, session.KindMessage, user, session.MessageData{Text: cmd.Text, ClientID: cmd.ClientID})
		n.respond(m, session.Reply{Seq: seq})
	case session.OpPrompts:
		if n.noPrompts {
			n.respondErr(m, session.Errorf(session.CodeBadRequest, "unknown op %q", cmd.Op))
			return
		}
		r := session.Reply{Results: make([]session.Reply, len(cmd.Prompts))}
		for i, p := range cmd.Prompts {
			if strings.TrimSpace(p.Text) == "" {
				r.Results[i].Error = session.Errorf(session.CodeBadRequest, "prompt text is empty")
				continue
			}
			r.Results[i].Seq = n.appendLocked(s, session.KindMessage, user, session.MessageData{Text: p.Text, ClientID: p.ClientID})
		}
		n.respond(m, r)
	case session.OpCancel, session.OpApprove:
		n.respond(m, session.Reply{})
	case session.OpSecretSet, session.OpSecretDelete: // repository tasks (channels_task_test.go)
		n.respond(m, session.Reply{})
	case session.OpPROpened:
		n.appendLocked(s, session.KindPROpened, user, cmd.PR)
		n.putLocked(s)
		n.respond(m, session.Reply{})
	case session.OpHistory:
		r := session.Reply{LastSeq: session.Seq(len(s.events)), Epoch: s.entry.Epoch}
		size := 0
		for i := int(cmd.After); i < len(s.events); i++ {
			if (cmd.Limit > 0 && len(r.Events) >= cmd.Limit) ||
				(cmd.MaxBytes > 0 && len(r.Events) > 0 && size+len(s.events[i]) > cmd.MaxBytes) {
				r.More = true
				break
			}
			r.Events = append(r.Events, s.events[i])
			size += len(s.events[i])
		}
		n.respond(m, r)
	case session.OpInfo:
		sess := s.entry.SessionFor(user)
		sess.Role = role
		n.respond(m, session.Reply{Session: &sess})
	case session.OpMember:
		if cmd.Role.Valid() {
			s.entry.Members[cmd.User] = cmd.Role
		} else {
			delete(s.entry.Members, cmd.User)
		}
		n.putLocked(s)
		n.appendLocked(s, session.KindMemberChanged, user, session.MemberChangedData{User: cmd.User, Role: cmd.Role})
		n.respond(m, session.Reply{})
	case session.OpDelete:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = n.kv.Delete(ctx, string(id))
		_ = s.cmd.Unsubscribe()
		delete(n.sessions, id)
		ctl := nats.NewMsg(n.subj.Events(id))
		ctl.Header.Set(session.HeaderControl, string(session.ControlDeleted))
		_ = n.nc.PublishMsg(ctl)
		n.respond(m, session.Reply{})
	default:
		n.respondErr(m, session.Errorf(session.CodeBadRequest, "unknown op"))
	}
}

// Append commits and publishes an event as the session's actor would.
func (n *fakeNode) Append(id session.ID, kind session.Kind, data any) session.Seq {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.appendLocked(n.sessions[id], kind, session.BySystem, data)
}

// DropNext makes the next k events committed but never published, as if
// NATS had lost them.
func (n *fakeNode) DropNext(k int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drop = k
}

// Hibernate stops serving id's commands, as an idle actor does.
func (n *fakeNode) Hibernate(id session.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.sessions[id]
	_ = s.cmd.Unsubscribe()
	s.cmd = nil
	s.entry.State = session.StateHibernated
	n.putLocked(s)
	if err := n.nc.Flush(); err != nil {
		n.t.Errorf("flush: %v", err)
	}
}

// SetMember changes a role directly, as if the owner had, and writes the
// member_changed event and the catalog.
func (n *fakeNode) SetMember(id session.ID, user string, role session.Role) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.sessions[id]
	if role.Valid() {
		s.entry.Members[user] = role
	} else {
		delete(s.entry.Members, user)
	}
	n.putLocked(s)
	n.appendLocked(s, session.KindMemberChanged, s.entry.Owner, session.MemberChangedData{User: user, Role: role})
}

func (n *fakeNode) Activations() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.activations
}

func (n *fakeNode) Active(id session.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sessions[id] != nil && n.sessions[id].cmd != nil
}

// Events returns the committed events of id.
func (n *fakeNode) Events(id session.ID) [][]byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([][]byte(nil), n.sessions[id].events...)
}
