package channel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/atriumhq/atrium/session"
)

// ErrBusy is returned by Receive, Press and Command when another gateway
// is handling the same platform event right now: the adapter should answer
// so that the platform delivers it again later.
var ErrBusy = errors.New("channel: this event is being handled by another gateway")

// maxTitle bounds the title of a session started from chat.
const maxTitle = 80

// Receive handles a message a person sent in a thread: the first mention in
// a thread starts a session bound to it, and later messages become prompts
// in that session, as the person's Atrium user. A person the identity
// mapping does not know is told how to get access, and nothing else
// happens.
//
// An error means the message was not handled and the platform should
// deliver it again (the adapter answers with a server error): NATS or the
// session was unavailable, or another gateway is handling it (ErrBusy).
// Refusals are not errors: the person is told why.
func (s *Service) Receive(ctx context.Context, ch Channel, in Incoming) error {
	c, ok, err := s.claimEvent(ctx, in.Thread.Platform, in.EventID)
	if !ok {
		return err
	}
	err = s.receive(ctx, ch, in)
	s.settle(ctx, c, err)
	return err
}

func (s *Service) receive(ctx context.Context, ch Channel, in Incoming) error {
	p, known, err := s.dir.resolve(ctx, ch, in.Thread, in.User)
	if err != nil {
		return err
	}
	if !known {
		s.tell(ch, in.Thread, in.User, unknownUser(in.Thread.Platform, in.User.ID))
		return nil
	}
	text := strings.TrimSpace(in.Text)
	if in.Start && isTask(text) {
		in.Text = text
		return s.receiveTask(ctx, ch, in, p)
	}
	id, err := s.st.sessionOf(ctx, in.Thread)
	if err != nil {
		return err
	}
	if id == "" {
		if !in.Start {
			return nil // a thread Atrium is not part of
		}
		if text == "" {
			s.tell(ch, in.Thread, in.User, "Hi! Tell me what to do in the same message, e.g. “@Atrium run the tests”, and I will start a session in this thread.")
			return nil
		}
		id, err = s.start(ctx, p, in.Thread, title(text), false)
		if err != nil {
			return s.refuse(ch, in.Thread, in.User, err)
		}
	}
	if text == "" {
		return nil
	}
	clientID := ""
	if in.EventID != "" {
		clientID = truncateUTF8(in.Thread.Platform+":"+in.EventID, session.MaxClientIDBytes)
	}
	prompt := func() error {
		_, err := s.cfg.Sessions.Prompt(ctx, p, id, text, clientID)
		return err
	}
	err = s.asMember(ctx, ch, in.Thread, in.User, p, id, prompt)
	if errors.Is(err, errGone) && in.Start {
		// The thread's session was deleted: the thread starts afresh.
		if err := s.st.unbind(ctx, &Binding{Session: id, Thread: &in.Thread}); err != nil {
			return err
		}
		if id, err = s.start(ctx, p, in.Thread, title(text), false); err != nil {
			return s.refuse(ch, in.Thread, in.User, err)
		}
		err = s.asMember(ctx, ch, in.Thread, in.User, p, id, prompt)
	}
	if err != nil {
		return s.refuse(ch, in.Thread, in.User, err)
	}
	s.kick(id)
	return nil
}

// start creates a session for p bound to th (replacing th's binding if
// replace) and returns the session th is bound to: another gateway may have
// bound th first, in which case the session made here is deleted again.
func (s *Service) start(ctx context.Context, p session.Principal, th Thread, title string, replace bool) (session.ID, error) {
	sess, err := s.cfg.Sessions.Create(ctx, p, title)
	if err != nil {
		return "", err
	}
	bound, err := s.st.bindThread(ctx, th, sess.ID, p.User, p.Tenant, replace)
	if err != nil {
		return "", err
	}
	if bound != sess.ID {
		if err := s.cfg.Sessions.Delete(ctx, p, sess.ID); err != nil {
			s.log.Warn("channel: delete a session made for a thread bound meanwhile", "session", string(sess.ID), "err", err)
		}
	}
	return bound, nil
}

// asMember runs do as p on session id; if p has no role on it yet but is
// of its tenant, p is first given Config.ThreadRole, as the session's owner.
func (s *Service) asMember(ctx context.Context, ch Channel, th Thread, u User, p session.Principal, id session.ID, do func() error) error {
	err := do()
	if !errors.Is(err, session.ErrNotFound) || s.cfg.ThreadRole == NoRole {
		return err
	}
	owner, tenant, ok := s.ownerOf(ctx, id)
	if !ok {
		return err
	}
	if tenant != p.Tenant {
		return errOtherTenant
	}
	op := session.Principal{User: owner, Tenant: tenant, Via: th.Platform}
	if err := s.cfg.Sessions.SetMember(ctx, op, id, p.User, s.cfg.ThreadRole); err != nil {
		if errors.Is(err, session.ErrNotFound) {
			return errGone // even its owner cannot see it
		}
		return fmt.Errorf("add %s to the session of the thread: %w", p.User, err)
	}
	s.log.Info("channel: person of the thread joined its session", "session", string(id), "user", p.User,
		"role", string(s.cfg.ThreadRole), "platform", th.Platform)
	return do()
}

var (
	errOtherTenant = session.Errorf(session.CodeNotFound, "the session of this thread belongs to another organisation")
	errGone        = session.Errorf(session.CodeNotFound, "the session of this thread was deleted")
)

// ownerOf returns a session's owner and tenant, from its binding or the
// catalog.
func (s *Service) ownerOf(ctx context.Context, id session.ID) (owner, tenant string, ok bool) {
	if b, _, err := s.st.binding(ctx, id); err == nil && b != nil && b.Owner != "" {
		return b.Owner, b.Tenant, true
	}
	if e, ok := s.catalogEntry(id); ok {
		return e.owner, e.tenant, true
	}
	return "", "", false
}

// refuse tells a person why their action was refused, or returns err if
// it is worth retrying.
func (s *Service) refuse(ch Channel, th Thread, u User, err error) error {
	if retryable(err) {
		return err
	}
	s.tell(ch, th, u, explain(err))
	return nil
}

// retryable reports whether err is a failure of the system rather than a
// refusal: the platform should deliver the event again.
func retryable(err error) bool {
	var e *session.Error
	if !errors.As(err, &e) {
		return true // NATS, KV: not the person's fault
	}
	return e.Code == session.CodeUnavailable || e.Code == session.CodeTooManyRequests || e.Code == session.CodeInternal
}

// explain turns a refusal into a sentence for the person.
func explain(err error) string {
	e := session.AsError(err)
	switch {
	case errors.Is(err, errOtherTenant):
		return "This thread's session belongs to another Atrium organisation, so you can't use it from here."
	case errors.Is(err, errGone):
		return "This thread's session was deleted. Mention me in a new thread to start another one."
	case e.Code == session.CodeForbidden && strings.Contains(e.Message, "you are a viewer"):
		return "You're a viewer of this session, so Atrium didn't act on that. Ask the session's owner to make you a driver."
	case e.Code == session.CodeForbidden:
		return "Atrium refused: " + e.Message + "."
	case e.Code == session.CodeNotFound:
		return "You don't have access to this thread's session. Ask its owner to share it with you."
	}
	return "Atrium couldn't do that: " + e.Message + "."
}

func unknownUser(platform, id string) string {
	return fmt.Sprintf("Hi! I don't know who you are in Atrium yet, so I can't act for you. "+
		"Ask your Atrium admin to add your %s account (user id %s) to the channel identity mapping; "+
		"see “Who is who” in docs/channels.md.", title(platform), id)
}

// tell queues a private reply to a person.
func (s *Service) tell(ch Channel, th Thread, u User, text string) {
	s.direct.push(&job{what: "reply to a " + th.Platform + " user", run: func(ctx context.Context) error {
		return ch.Whisper(ctx, th, u, text)
	}})
}

// Tell sends a private reply to a person, retried like every message.
// Adapters use it to answer button presses where the platform has no
// better way.
func (s *Service) Tell(ch Channel, th Thread, u User, text string) { s.tell(ch, th, u, text) }

// claimEvent takes the right to handle a platform event. ok false means
// do not handle it: err is nil for a duplicate, ErrBusy or a store failure
// otherwise.
func (s *Service) claimEvent(ctx context.Context, platform, eventID string) (*claim, bool, error) {
	if eventID == "" {
		return nil, true, nil
	}
	c, err := s.st.claim(ctx, platform+"."+hashKey(eventID))
	switch {
	case errors.Is(err, errDuplicate):
		s.log.Debug("channel: duplicate event ignored", "platform", platform)
		return nil, false, nil
	case errors.Is(err, errInProgress):
		return nil, false, ErrBusy
	case err != nil:
		return nil, false, err
	}
	return &c, true, nil
}

// settle marks a claimed event handled, or gives the claim up if handling
// failed, so that the platform's next delivery is handled.
func (s *Service) settle(ctx context.Context, c *claim, err error) {
	if c == nil {
		return
	}
	if err != nil {
		s.st.release(ctx, *c)
		return
	}
	if err := s.st.done(ctx, *c); err != nil {
		s.log.Warn("channel: mark event handled", "err", err)
	}
}

// Press handles a button press and returns what to tell the person who
// pressed it. Approval buttons answer the approval as that person: only
// drivers of the session may.
func (s *Service) Press(ctx context.Context, ch Channel, pr Press) (string, error) {
	c, ok, err := s.claimEvent(ctx, pr.Thread.Platform, pr.EventID)
	if !ok {
		return "", err
	}
	reply, err := s.press(ctx, ch, pr)
	s.settle(ctx, c, err)
	return reply, err
}

func (s *Service) press(ctx context.Context, ch Channel, pr Press) (string, error) {
	p, known, err := s.dir.resolve(ctx, ch, pr.Thread, pr.User)
	if err != nil {
		return "", err
	}
	if !known {
		return unknownUser(pr.Thread.Platform, pr.User.ID), nil
	}
	if pr.Action != ActionApprove && pr.Action != ActionDeny {
		return "That button is not Atrium's.", nil
	}
	seq, err := strconv.ParseInt(pr.Value, 10, 64)
	if err != nil || seq < 1 {
		return "That button is not Atrium's.", nil
	}
	id, err := s.st.sessionOf(ctx, pr.Thread)
	if err != nil {
		return "", err
	}
	if id == "" {
		return "This thread has no Atrium session any more.", nil
	}
	var req session.ApprovalRequestedData
	err = s.asMember(ctx, ch, pr.Thread, pr.User, p, id, func() error {
		evs, _, err := s.cfg.Sessions.History(ctx, p, id, seq-1, 1)
		if err != nil {
			return err
		}
		var ev session.Event
		if len(evs) == 0 || json.Unmarshal(evs[0], &ev) != nil || ev.Kind != session.KindApprovalRequested ||
			json.Unmarshal(ev.Data, &req) != nil {
			return session.Errorf(session.CodeBadRequest, "that button does not belong to an approval request")
		}
		return s.cfg.Sessions.Approve(ctx, p, id, req.ID, pr.Action == ActionApprove)
	})
	e := session.AsError(err)
	switch {
	case err == nil:
	case retryable(err):
		return "", err
	case e.Code == session.CodeForbidden:
		return "Only drivers of this session can answer approvals, and you're a viewer. Ask the session's owner to make you a driver.", nil
	case (e.Code == session.CodeNotFound || e.Code == session.CodeConflict) && req.ID != "":
		return "This approval was already answered (or its turn has ended).", nil
	default:
		return explain(err), nil
	}
	s.kick(id)
	if pr.Action == ActionApprove {
		return "You approved: " + orNothing(req.Summary, "(no summary)"), nil
	}
	return "You denied: " + orNothing(req.Summary, "(no summary)"), nil
}

// Command handles a command ("/atrium new …" on Slack, "/new …" on
// Telegram) and returns the reply for the person who typed it:
//
//	new PROMPT   start a session (in a new thread where the platform has them) and send it PROMPT
//	task REPO-URL [--base BRANCH] PROMPT
//	             start a repository task (task.go) whose session is bound like new's
//	status [ID]  the session of this thread, the latest one of this channel, or ID
//	cancel [ID]  cancel its running turn (drivers)
//	link [ID]    its address in the web UI
//	help         what the commands are
func (s *Service) Command(ctx context.Context, ch Channel, c Command) (string, error) {
	cl, ok, err := s.claimEvent(ctx, c.Thread.Platform, c.EventID)
	if !ok {
		return "", err
	}
	reply, err := s.command(ctx, ch, c)
	s.settle(ctx, cl, err)
	return reply, err
}

func (s *Service) command(ctx context.Context, ch Channel, c Command) (string, error) {
	name := strings.ToLower(strings.TrimSpace(c.Name))
	if name == "" || name == "help" || name == "start" {
		return s.help(c.Prefix), nil
	}
	p, known, err := s.dir.resolve(ctx, ch, c.Thread, c.User)
	if err != nil {
		return "", err
	}
	if !known {
		return unknownUser(c.Thread.Platform, c.User.ID), nil
	}
	args := strings.TrimSpace(c.Args)
	switch name {
	case "new":
		return s.commandNew(ctx, ch, c, p, args)
	case "task":
		return s.commandTask(ctx, ch, c, p, args)
	case "status", "cancel", "link":
	default:
		return fmt.Sprintf("I don't know the command “%s”.\n\n%s", name, s.help(c.Prefix)), nil
	}
	id, err := s.pick(ctx, c.Thread, args)
	if err != nil {
		return "", err
	}
	if id == "" {
		return fmt.Sprintf("There is no Atrium session here yet. Start one with “%snew what to do”.", c.Prefix), nil
	}
	switch name {
	case "status":
		info, err := s.cfg.Sessions.Info(ctx, p, id)
		if err != nil {
			if retryable(err) {
				return "", err
			}
			return explain(err), nil
		}
		return s.describe(info), nil
	case "cancel":
		err := s.asMember(ctx, ch, c.Thread, c.User, p, id, func() error { return s.cfg.Sessions.Cancel(ctx, p, id) })
		if err != nil {
			if retryable(err) {
				return "", err
			}
			return explain(err), nil
		}
		s.kick(id)
		return fmt.Sprintf("Cancelling the running turn of session %s.", id), nil
	default: // link
		if _, err := s.cfg.Sessions.Info(ctx, p, id); err != nil {
			if retryable(err) {
				return "", err
			}
			return explain(err), nil
		}
		if l := s.link(id); l != "" {
			return fmt.Sprintf("Session %s: %s", id, l), nil
		}
		return fmt.Sprintf("Session %s (this Atrium has no public_url set, so I can't link to it).", id), nil
	}
}

func (s *Service) commandNew(ctx context.Context, ch Channel, c Command, p session.Principal, prompt string) (string, error) {
	if prompt == "" {
		return fmt.Sprintf("Tell me what to do: “%snew run the tests and fix what fails”.", c.Prefix), nil
	}
	sess, err := s.cfg.Sessions.Create(ctx, p, title(prompt))
	if err != nil {
		if retryable(err) {
			return "", err
		}
		return explain(err), nil
	}
	th := c.Thread
	if op, ok := ch.(Opener); ok {
		m := Message{Text: fmt.Sprintf("🧵 %s started an Atrium session: %s", orNothing(c.User.Name, "Someone"), title(prompt))}
		if l := s.link(sess.ID); l != "" {
			m.Link = &Link{Text: "Open in Atrium", URL: l}
		}
		th, err = op.Open(ctx, c.Thread, m)
		if err != nil {
			_ = s.cfg.Sessions.Delete(ctx, p, sess.ID)
			if errors.Is(err, ErrPermanent) {
				return "I couldn't post in this channel. Invite me to it first, then try again.", nil
			}
			return "", err
		}
	}
	if _, err := s.st.bindThread(ctx, th, sess.ID, p.User, p.Tenant, true); err != nil {
		return "", err
	}
	if _, err := s.cfg.Sessions.Prompt(ctx, p, sess.ID, prompt, ""); err != nil {
		if retryable(err) {
			return "", err
		}
		return explain(err), nil
	}
	s.kick(sess.ID)
	reply := fmt.Sprintf("Started session %s.", sess.ID)
	if l := s.link(sess.ID); l != "" {
		reply += " " + l
	}
	return reply, nil
}

// pick returns the session a command is about: the one named by args, else
// the thread's, else the latest one started in the thread's channel.
func (s *Service) pick(ctx context.Context, th Thread, args string) (session.ID, error) {
	if args != "" {
		id := session.ID(strings.Fields(args)[0])
		if id.Validate() != nil {
			return "", nil
		}
		return id, nil
	}
	if th.ID != "" {
		id, err := s.st.sessionOf(ctx, th)
		if err != nil || id != "" {
			return id, err
		}
	}
	id, err := s.st.sessionOf(ctx, Thread{Platform: th.Platform, Workspace: th.Workspace, Channel: th.Channel})
	if err != nil || id != "" {
		return id, err
	}
	return s.st.latestIn(ctx, th)
}

func (s *Service) describe(info session.Session) string {
	state := "asleep (it wakes when someone writes to it)"
	if info.State == session.StateActive {
		state = "active"
	}
	text := fmt.Sprintf("Session %s “%s”: %s; owner %s; %d events; you are a %s.",
		info.ID, orNothing(info.Title, "untitled"), state, info.Owner, info.LastSeq, info.Role)
	if l := s.link(info.ID); l != "" {
		text += " " + l
	}
	return text
}

func (s *Service) help(prefix string) string {
	return fmt.Sprintf("Atrium runs an agent session per thread. Mention me with a request to start one; "+
		"later messages in the thread that mention me go to the same session.\n"+
		"%[1]snew PROMPT: start a session with PROMPT\n"+
		"%[1]stask REPO-URL [--base BRANCH] PROMPT: work on a repository and open a pull request; its link is posted in the thread\n"+
		"%[1]sstatus [ID]: the state of this thread's (or the latest) session\n"+
		"%[1]scancel [ID]: cancel its running turn\n"+
		"%[1]slink [ID]: its address in the web UI", prefix)
}

// title makes a session title from a prompt: its first line, shortened.
func title(text string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return "Chat session"
	}
	if utf8.RuneCountInString(line) > maxTitle {
		r := []rune(line)
		line = strings.TrimSpace(string(r[:maxTitle-1])) + "…"
	}
	if len(line) > session.MaxTitleBytes {
		line = truncateUTF8(line, session.MaxTitleBytes)
	}
	return line
}

// Subscribe makes session id deliver its events of sub.Kinds to the
// outbound webhook sub.Target, from its next event on; a subscription to
// the same target is replaced. p must be able to read the session (the
// gateway checks the owner role before calling).
func (s *Service) Subscribe(ctx context.Context, p session.Principal, id session.ID, sub Subscription) error {
	info, err := s.cfg.Sessions.Info(ctx, p, id)
	if err != nil {
		return err
	}
	_, err = s.st.updateBinding(ctx, id, func(b *Binding) {
		if b.Owner == "" {
			b.Owner, b.Tenant, b.Cursor = info.Owner, p.Tenant, info.LastSeq
		}
		b.Hooks = append(deleteTarget(b.Hooks, sub.Target), sub)
	})
	if err != nil {
		return err
	}
	s.kick(id)
	return nil
}

// Unsubscribe stops deliveries of session id to target.
func (s *Service) Unsubscribe(ctx context.Context, id session.ID, target string) error {
	_, err := s.st.updateBinding(ctx, id, func(b *Binding) { b.Hooks = deleteTarget(b.Hooks, target) })
	if err == nil {
		s.kick(id)
	}
	return err
}

// Subscriptions returns the webhook subscriptions of session id.
func (s *Service) Subscriptions(ctx context.Context, id session.ID) ([]Subscription, error) {
	b, _, err := s.st.binding(ctx, id)
	if err != nil || b == nil {
		return nil, err
	}
	return b.Hooks, nil
}

func deleteTarget(subs []Subscription, target string) []Subscription {
	out := subs[:0:0]
	for _, x := range subs {
		if x.Target != target {
			out = append(out, x)
		}
	}
	return out
}
