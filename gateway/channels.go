package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/gateway/channel"
	"github.com/atriumhq/atrium/gateway/hooks"
	"github.com/atriumhq/atrium/gateway/slack"
	"github.com/atriumhq/atrium/gateway/task"
	"github.com/atriumhq/atrium/gateway/telegram"
	"github.com/atriumhq/atrium/session"
)

// DefaultChannelsDrain bounds how long Close waits for chat messages and
// webhook deliveries that are still pending.
const DefaultChannelsDrain = 10 * time.Second

// Channels configures chat channels and signed webhooks (docs/channels.md).
// The platform endpoints (/channels/slack/…, /channels/telegram/webhook,
// POST /v1/hooks/{name}) authenticate requests by the platform's signature
// or secret, not by login; everything they do is done as the mapped Atrium
// user, through the same role checks as REST requests.
type Channels struct {
	// Service tunes the platform-neutral part: identity mapping, public
	// URL, thread role, timings. The gateway sets its NATS, Subjects,
	// Sessions, Webhooks, Gateway and Logger.
	Service channel.Config
	// Slack turns the Slack app on; the gateway sets its Service and
	// Logger.
	Slack *slack.Config
	// Telegram turns the Telegram bot on; the gateway sets its Service and
	// Logger.
	Telegram *telegram.Config
	// Hooks turns signed webhooks on; the gateway sets its NATS, Prefix and
	// Logger.
	Hooks *hooks.Config
	// Drain bounds how long Close waits for pending deliveries; default
	// DefaultChannelsDrain.
	Drain time.Duration
}

// Audit actions of webhook subscriptions.
const (
	actWebhookSubscribed   = "webhook_subscribed"
	actWebhookUnsubscribed = "webhook_unsubscribed"
)

// channels is the running chat channels and webhooks of a Server.
type channels struct {
	svc   *channel.Service
	hooks *hooks.Hooks // nil without webhooks
	drain time.Duration
}

// mountChannels builds the channel service, its adapters and webhooks, and
// registers their routes. The service starts with Start.
func mountChannels(s *Server, mux *http.ServeMux, cfg *Channels) (*channels, error) {
	c := &channels{drain: cfg.Drain}
	if c.drain <= 0 {
		c.drain = DefaultChannelsDrain
	}
	sc := cfg.Service
	sc.NATS, sc.Subjects, sc.Sessions, sc.Gateway = s.nc, s.subj, chatSessions{s}, s.id
	sc.Replicas = cmp.Or(sc.Replicas, s.replicas)
	sc.Tasks = chatTasks{s}
	sc.Logger = s.log.With("worker", "channels")
	if cfg.Hooks != nil {
		hc := *cfg.Hooks
		hc.NATS, hc.Prefix, hc.Logger = s.nc, s.subj.Prefix, sc.Logger
		hc.Replicas = cmp.Or(hc.Replicas, s.replicas)
		h, err := hooks.New(hc)
		if err != nil {
			return nil, err
		}
		c.hooks = h
		sc.Webhooks = h
	}
	svc, err := channel.New(sc)
	if err != nil {
		return nil, err
	}
	c.svc = svc
	if cfg.Slack != nil {
		ac := *cfg.Slack
		ac.Service, ac.Logger = svc, sc.Logger
		a, err := slack.New(ac)
		if err != nil {
			return nil, err
		}
		svc.Register(a)
		a.Routes(mux)
	}
	if cfg.Telegram != nil {
		ac := *cfg.Telegram
		ac.Service, ac.Logger = svc, sc.Logger
		a, err := telegram.New(ac)
		if err != nil {
			return nil, err
		}
		svc.Register(a)
		a.Routes(mux)
	}
	if c.hooks != nil {
		mux.Handle("POST /v1/hooks/{name}", c.hooks.Handler(chatSessions{s}, svc))
		hookRoutes{s: s, c: c}.mount(mux) // hookroutes.go
	}
	return c, nil
}

// close stops the channel service, waiting up to the drain time for what
// is still to be delivered.
func (c *channels) close() {
	ctx, cancel := context.WithTimeout(context.Background(), c.drain)
	defer cancel()
	_ = c.svc.Close(ctx)
}

// channelError keeps wire errors and reports anything else (NATS, KV) as
// unavailable.
func channelError(err error) error {
	var e *session.Error
	if errors.As(err, &e) {
		return err
	}
	return withCause(session.Errorf(session.CodeUnavailable, "channel state is unavailable: try again shortly"), err)
}

// chatSessions implements channel.Sessions with the gateway's own checks:
// the catalog's role check (session.RoleFor), activation of hibernated
// sessions, the node's check again, and audit entries, as for REST.
type chatSessions struct{ s *Server }

var _ channel.Sessions = chatSessions{}

// do is Server.do for callers that are not HTTP requests.
func (c chatSessions) do(ctx context.Context, p session.Principal, id session.ID, act session.Action, cmd session.Command) (*session.Reply, error) {
	s := c.s
	a, err := s.check(ctx, p, id, act)
	if err != nil {
		return nil, err
	}
	reply, err := s.call(ctx, p, id, cmd, a.allowed())
	if errors.Is(err, errNotActive) {
		err = a.notActive()
	}
	if err != nil {
		s.auditDenied(ctx, "", p, id, string(cmd.Op), a.entry, err)
		return nil, err
	}
	return reply, nil
}

func (c chatSessions) Create(ctx context.Context, p session.Principal, title string) (session.Session, error) {
	s := c.s
	if len(title) > session.MaxTitleBytes {
		return session.Session{}, session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes)
	}
	if !p.Limit(session.RoleOwner).AtLeast(session.RoleDriver) {
		return session.Session{}, session.Errorf(session.CodeForbidden, "this credential is limited to the %s role: it cannot create sessions", p.Cap)
	}
	id := session.NewID()
	reply, err := s.place(ctx, p, session.PlaceRequest{Op: session.PlaceCreate, Session: id, Title: title})
	if err != nil {
		return session.Session{}, err
	}
	sess := reply.Session
	if sess == nil {
		info, err := s.call(ctx, p, id, session.Command{Op: session.OpInfo}, true)
		if err == nil && info.Session == nil {
			err = session.Errorf(session.CodeInternal, "info reply of session %s has no session", id)
		}
		if err != nil {
			return session.Session{}, err
		}
		sess = info.Session
	}
	s.refreshCatalog(ctx, sess.ID)
	e := entry(p, "", audit.ActSessionCreated)
	e.Session, e.Detail = string(sess.ID), "started from "+p.Via
	s.record(ctx, e)
	return *sess, nil
}

func (c chatSessions) Delete(ctx context.Context, p session.Principal, id session.ID) error {
	if _, err := c.do(ctx, p, id, session.ActManage, session.Command{Op: session.OpDelete}); err != nil {
		return err
	}
	c.s.cache.forget(id)
	e := entry(p, "", audit.ActSessionDeleted)
	e.Session, e.Detail = string(id), "from "+p.Via
	c.s.record(ctx, e)
	return nil
}

func (c chatSessions) Info(ctx context.Context, p session.Principal, id session.ID) (session.Session, error) {
	s := c.s
	a, err := s.check(ctx, p, id, session.ActRead)
	if err != nil {
		return session.Session{}, err
	}
	reply, err := s.call(ctx, p, id, session.Command{Op: session.OpInfo}, false)
	if errors.Is(err, errNotActive) && !a.allowed() {
		err = a.notActive()
	}
	switch {
	case errors.Is(err, errNotActive):
		sess := a.entry.SessionFor(p.User)
		sess.Role = roleIn(a.entry, p)
		sess.State = session.StateHibernated
		return sess, nil
	case err != nil:
		s.auditDenied(ctx, "", p, id, string(session.OpInfo), a.entry, err)
		return session.Session{}, err
	case reply.Session == nil:
		return session.Session{}, session.Errorf(session.CodeInternal, "info reply of session %s has no session", id)
	}
	return *reply.Session, nil
}

func (c chatSessions) Prompt(ctx context.Context, p session.Principal, id session.ID, text, clientID string) (session.Seq, error) {
	if err := validatePrompt(text, clientID); err != nil {
		return 0, err
	}
	if err := c.s.checkPromptQuota(ctx, p, id); err != nil {
		return 0, err
	}
	reply, err := c.do(ctx, p, id, session.ActDrive, session.Command{Op: session.OpPrompt, Text: text, ClientID: clientID})
	if err != nil {
		return 0, err
	}
	return reply.Seq, nil
}

func (c chatSessions) Cancel(ctx context.Context, p session.Principal, id session.ID) error {
	_, err := c.do(ctx, p, id, session.ActDrive, session.Command{Op: session.OpCancel})
	return err
}

func (c chatSessions) Approve(ctx context.Context, p session.Principal, id session.ID, approvalID string, allow bool) error {
	_, err := c.do(ctx, p, id, session.ActDrive, session.Command{Op: session.OpApprove, ApprovalID: approvalID, Allow: allow})
	return err
}

func (c chatSessions) SetMember(ctx context.Context, p session.Principal, id session.ID, user string, role session.Role) error {
	if _, err := c.do(ctx, p, id, session.ActManage, session.Command{Op: session.OpMember, User: user, Role: role}); err != nil {
		return err
	}
	c.s.refreshCatalog(ctx, id)
	e := entry(p, "", audit.ActMemberChanged)
	e.Session, e.Target, e.Detail = string(id), user, "role "+string(role)+", joined from a "+p.Via+" thread"
	c.s.record(ctx, e)
	return nil
}

func (c chatSessions) History(ctx context.Context, p session.Principal, id session.ID, after session.Seq, limit int) ([]json.RawMessage, bool, error) {
	reply, err := c.do(ctx, p, id, session.ActRead, session.Command{
		Op: session.OpHistory, After: after, Limit: limit, MaxBytes: session.DefaultHistoryMaxBytes,
	})
	if err != nil {
		return nil, false, err
	}
	return reply.Events, reply.More, nil
}

// chatTasks implements channel.Tasks with the task service of POST
// /v1/tasks (Server.tasks, set up after the channels; nil without
// Config.Tasks), with the same audit entries.
type chatTasks struct{ s *Server }

var _ channel.Tasks = chatTasks{}

func (c chatTasks) StartTask(ctx context.Context, p session.Principal, req channel.TaskRequest) (session.ID, error) {
	s := c.s
	if s.tasks == nil {
		return "", channel.ErrNoTasks
	}
	t, err := s.tasks.Start(ctx, p, task.Request{Repo: req.Repo, Base: req.Base, Prompt: req.Prompt, Agent: req.Agent})
	if err != nil {
		var se *session.Error
		if errors.As(err, &se) && se.Code == session.CodeForbidden {
			s.auditDenied(ctx, "", p, "", "start task on "+req.Repo, nil, err)
		}
		return "", err
	}
	e := entry(p, "", ActTaskStarted)
	e.Session, e.Target, e.Detail = string(t.Session), t.ID, "repo "+t.Repo+", base "+t.Base+", from "+p.Via
	s.record(ctx, e)
	return t.Session, nil
}
