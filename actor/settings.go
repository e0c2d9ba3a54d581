package actor

import (
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// opSettings changes the session's title and settings (owner): the change
// is kept in the Meta, a new title is written to the catalog before the
// reply (so that GET /v1/sessions shows it), and a permission mode takes
// effect the next time the agent is started (a running agent keeps its
// mode). A rename is not an event: the title is metadata, like egress.
func (s *sessionActor) opSettings(msg *nats.Msg, who session.Principal, c *session.Command) {
	p := c.Settings
	if p == nil || p.Title == nil && p.PermissionMode == nil && p.TurnTimeout == nil {
		respond(msg, errorReply(session.Errorf(session.CodeBadRequest, `settings: give "title" or "settings":{"permission_mode","turn_timeout"}`)))
		return
	}
	next := s.metaNext
	if t := p.Title; t != nil {
		if len(*t) > session.MaxTitleBytes {
			respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "title is longer than %d bytes", session.MaxTitleBytes)))
			return
		}
		if !utf8.ValidString(*t) {
			respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "title is not valid UTF-8")))
			return
		}
		next.Title = *t
	}
	if m := p.PermissionMode; m != nil {
		if next.Harness.Agent == "" {
			respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "settings: permission_mode is for agent sessions; this session runs no agent")))
			return
		}
		h := next.Harness
		h.PermissionMode = *m
		if *m == "" {
			respond(msg, errorReply(session.Errorf(session.CodeBadRequest, `settings: permission_mode must be "ask", "auto-edit" or "auto"`)))
			return
		}
		if err := h.Validate(); err != nil {
			respond(msg, errorReply(err))
			return
		}
		next.Harness = h
	}
	if d := p.TurnTimeout; d != nil {
		limit := s.h.cfg.TurnTimeout
		switch {
		case *d <= 0:
			respond(msg, errorReply(session.Errorf(session.CodeBadRequest, "settings: turn_timeout must be positive")))
			return
		case time.Duration(*d) > limit:
			respond(msg, errorReply(session.Errorf(session.CodeForbidden, "settings: turn_timeout %v is beyond this server's limit of %v (node.turn_timeout)", time.Duration(*d), limit)))
			return
		}
		next.TurnTimeout = *d
	}
	s.metaNext = next
	s.metaDirty = true
	s.metaAfter = append(s.metaAfter, func(err error) {
		if err != nil {
			s.log.Warn("write session metadata", "err", err)
			respond(msg, errorReply(session.Errorf(session.CodeUnavailable, "the change could not be saved: retry")))
			return
		}
		sess := s.sessionFor(who) // on the actor; done runs off it
		s.putCatalogThen(func() { respond(msg, session.Reply{Session: &sess}) })
	})
}

// turnTimeout bounds the session's next turn: its own turn_timeout if it
// has one within the node's, else the node's.
func (s *sessionActor) turnTimeout() time.Duration {
	if d := time.Duration(s.meta.TurnTimeout); d > 0 && d < s.h.cfg.TurnTimeout {
		return d
	}
	return s.h.cfg.TurnTimeout
}
