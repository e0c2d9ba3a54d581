package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/atriumhq/atrium/gateway/audit"
	"github.com/atriumhq/atrium/session"
)

// Rate limits of audit entries that callers can cause at will: a failed
// authentication is recorded at most once per address per auditEvery, and a
// denial at most once per caller, session and action per auditEvery. The
// entry that ends a quiet spell says how many were left out before it.
const (
	auditEvery   = 10 * time.Second
	auditTimeout = 5 * time.Second
	// auditKeysMax bounds the limiter's memory under a flood of addresses.
	auditKeysMax = 100000
)

// limiter lets one event per key through per period and counts the rest.
type limiter struct {
	every time.Duration

	mu     sync.Mutex
	seen   map[string]*limited // guarded by mu
	pruned time.Time           // guarded by mu
}

type limited struct {
	last       time.Time // when an event last went through
	suppressed int       // events held back since
}

// allow reports whether an event of key may go through at now, and how many
// were held back since the last one that did.
func (l *limiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = make(map[string]*limited)
	}
	st := l.seen[key]
	if st != nil && now.Sub(st.last) < l.every {
		st.suppressed++
		return false, 0
	}
	if st == nil {
		if len(l.seen) >= auditKeysMax {
			l.pruneLocked(now)
		}
		st = &limited{}
		l.seen[key] = st
	}
	n := st.suppressed
	st.last, st.suppressed = now, 0
	return true, n
}

// pruneLocked forgets keys that are quiet (at most once a second), or every
// key if that is not enough: a flood from ever new addresses then gets some
// entries recorded again, which is better than unbounded memory.
func (l *limiter) pruneLocked(now time.Time) {
	if now.Sub(l.pruned) >= time.Second {
		l.pruned = now
		for k, st := range l.seen {
			if now.Sub(st.last) >= l.every {
				delete(l.seen, k)
			}
		}
	}
	if len(l.seen) >= auditKeysMax {
		clear(l.seen)
	}
}

// record writes e to the audit log. A failure to audit does not refuse the
// request, whose action is done by then: it is logged as an error, with the
// entry's fields (which never hold secrets or prompt text).
func (s *Server) record(ctx context.Context, e audit.Entry) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditTimeout)
	defer cancel()
	if err := s.audit.Record(ctx, e); err != nil {
		s.log.Error("write audit entry", "action", e.Action, "outcome", e.Outcome, "tenant", e.Tenant,
			"actor", e.Actor, "session", e.Session, "target", e.Target, "remote", e.Remote, "err", err)
	}
}

// entry starts an audit entry of action by p from remote.
func entry(p session.Principal, remote, action string) audit.Entry {
	return audit.Entry{Tenant: p.Tenant, Actor: p.User, Via: p.Via, Action: action, Outcome: audit.OK, Remote: remote}
}

// remoteOf returns the address a request came from, without its port.
func remoteOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// auditAuthFailed records a request whose credentials were refused. A
// request that sent none is not a failed authentication and is not recorded.
// Nobody is authenticated, so the entry has no tenant.
func (s *Server) auditAuthFailed(r *http.Request, err error) {
	remote := remoteOf(r)
	ok, suppressed := s.authFailures.allow(remote, time.Now())
	if !ok {
		return
	}
	e := audit.Entry{Action: audit.ActAuthFailed, Outcome: audit.Failed, Remote: remote,
		Detail: r.Method + " " + r.URL.Path + ": " + session.AsError(err).Message}
	if suppressed > 0 {
		e.Detail += fmt.Sprintf(" (and %d more from this address not recorded)", suppressed)
	}
	s.record(r.Context(), e)
}

// auditDenied records a refusal of what (an op) on session id for lack of
// role: err is forbidden, or not found where the catalog knows the session
// and gives p no role on it (another tenant's session, or one p was not
// shared). Other errors are not denials and are not recorded.
func (s *Server) auditDenied(ctx context.Context, remote string, p session.Principal, id session.ID, what string, known *session.CatalogEntry, err error) {
	if err == nil {
		return
	}
	e := session.AsError(err)
	detail := what + ": " + e.Message
	switch {
	case e.Code == session.CodeForbidden:
	case e.Code == session.CodeNotFound && known != nil && !roleIn(known, p).Valid():
		if known.Tenant != p.Tenant {
			detail = what + ": the session belongs to another tenant"
		} else {
			detail = what + ": no role on the session"
		}
	default:
		return
	}
	ok, suppressed := s.denials.allow(p.Tenant+"\x00"+p.User+"\x00"+string(id)+"\x00"+what, time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		detail += fmt.Sprintf(" (and %d more not recorded)", suppressed)
	}
	en := entry(p, remote, audit.ActDenied)
	en.Outcome, en.Session, en.Detail = audit.Denied, string(id), detail
	s.record(ctx, en)
}
