package gateway

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
	"github.com/coder/websocket"
)

// historyPageLimit bounds the events of one history request; MaxBytes keeps
// its reply under NATS's max payload.
const historyPageLimit = 1000

// History reads are retried after historyBackoff (jittered up to twice it),
// doubling each time: up to maxHistoryRetries times when the node refuses
// them with too_many_requests, and up to maxLagRetries times when its
// history lags behind the live events (150 to 300 ms in all).
const (
	historyBackoff    = 10 * time.Millisecond
	maxHistoryRetries = 8
	maxLagRetries     = 4
)

// sink is where a feed writes: a WebSocket or an SSE stream. Its errors are
// write failures: the client is gone or too slow, and nothing more can be
// sent to it.
type sink interface {
	event(ev *event) error
	frame(b []byte) error // presence, ack and error frames; SSE drops them
	delta(b []byte) error // a delta frame, sent as is (WebSocket) or as an SSE delta event
	heartbeat() error
	// flush sends what was written since the last flush. A sink may hold
	// writes until then, so that a batch costs one write to the network.
	flush() error
}

// writeFailed marks a failure to write to the client.
type writeFailed struct{ err error }

func (e *writeFailed) Error() string { return "write to client: " + e.err.Error() }
func (e *writeFailed) Unwrap() error { return e.err }

// errRevoked ends a feed whose user was removed from the session.
var errRevoked = errors.New("gateway: access revoked")

// feed is one watcher's gap-free, duplicate-free view of a session's log
// (DESIGN §4). Its watcher joins the session's topic first, so live events
// are queued from then on; the feed then reads history after the resume
// point from the owner and writes it, and then drains the queue, dropping
// events it has already written and refetching history when a live event
// skips ahead (a gap: NATS dropped something). Every event is written exactly
// once, in seq order, whatever is published while it catches up.
//
// A feed is used by its connection's writer goroutine only.
type feed struct {
	s  *Server
	p  session.Principal
	id session.ID
	w  *watcher
	// access is what the catalog said; until the owner has answered once,
	// history requests activate the session only if it allowed the caller.
	access access
	owner  string // the session's owner, when known: member changes never change the owner's role
	// roleSeq is the last seq of the session when the watcher's role was
	// read: member changes up to it are in that role already, and only
	// later ones change it (a history replay must not apply old ones).
	roleSeq  session.Seq
	answered bool
	limit    int         // events per history request; default historyPageLimit
	last     session.Seq // seq of the last event written (or the resume point)
}

// page reads up to limit events after after from the owner (0: the feed's
// page size).
func (f *feed) page(ctx context.Context, after session.Seq, limit int) (*session.Reply, error) {
	cmd := session.Command{
		Op: session.OpHistory, After: after, Limit: cmp.Or(limit, f.limit, historyPageLimit), MaxBytes: session.DefaultHistoryMaxBytes,
	}
	reply, err := f.s.call(ctx, f.p, f.id, cmd, f.answered || f.access.allowed())
	// A node sheds history reads when many watchers resume at once; they
	// are cheap to retry after a short, growing pause.
	for try := 0; errors.Is(err, session.ErrTooManyRequests) && try < maxHistoryRetries; try++ {
		if err := pause(ctx, try); err != nil {
			return nil, err
		}
		reply, err = f.s.call(ctx, f.p, f.id, cmd, true)
	}
	if errors.Is(err, errNotActive) {
		return nil, f.access.notActive()
	}
	if err != nil {
		return nil, err
	}
	f.answered = true
	return reply, nil
}

// open reads the first page of history after the resume point. The watcher
// must have joined the topic. It fails with bad_request if after is beyond
// the session's last seq.
//
// A client may resume from an event it saw live an instant ago, and a node
// may publish an event a moment before its history reads count it. So an
// "after beyond the last seq" answer is retried for a moment before it is
// taken for the client's mistake.
//
// A watcher's feed (one that replays) may open from the gateway's history
// cache (openCached); a REST read uses the reply's events itself.
func (f *feed) open(ctx context.Context, after session.Seq) (*session.Reply, error) {
	if f.w != nil {
		if reply, ok := f.openCached(ctx, after); ok {
			return reply, nil
		}
	}
	for try := 0; ; try++ {
		reply, err := f.page(ctx, after, 0)
		beyond := err == nil && after > reply.LastSeq
		if beyond {
			err = session.Errorf(session.CodeBadRequest, "after %d is beyond the session's last_seq %d", after, reply.LastSeq)
		}
		if beyond || errors.Is(err, session.ErrBadRequest) && after > 0 {
			if try < maxLagRetries {
				if err := pause(ctx, try); err != nil {
					return nil, err
				}
				continue
			}
		}
		if err != nil {
			return nil, err
		}
		f.last = after
		return reply, nil
	}
}

// openCached opens the feed from the gateway's history cache when its run
// of the session holds the event after the resume point: the owner is
// asked for one event only, the newest that a history page brought into the
// run (histCache.probe). Its answer authorises the watcher, says where the
// log ends and its epoch, and vouches for the run. Only page events can be
// stale (a page may carry the log's last events before they are captured,
// which a next owner may drop and write again), and those are a suffix of
// the log as it was then: if the newest page event is the owner's, byte for
// byte, so are those before it; the live events after it came from the
// events stream. The reply carries no events:
// replay takes them from the cache. Anything else — another answer, an
// error, a stale run (then dropped) — and open reads history as usual.
func (f *feed) openCached(ctx context.Context, after session.Seq) (*session.Reply, bool) {
	seq, raw, epoch, ok := f.s.hub.hist.probe(f.id, after)
	if !ok {
		return nil, false
	}
	reply, err := f.page(ctx, seq-1, 1)
	switch {
	case errors.Is(err, session.ErrBadRequest): // the owner's log ends before the run
		f.s.hub.hist.drop(f.id)
		return nil, false
	case err != nil:
		return nil, false
	case reply.Epoch != epoch || len(reply.Events) != 1 || !bytes.Equal(reply.Events[0], raw):
		f.s.hub.hist.drop(f.id)
		return nil, false
	}
	f.last = after
	reply.Events, reply.More = nil, true
	return reply, true
}

// historyRetry paces history retries (session/retry's policy): waits from
// historyBackoff·[1, 2] doubling up to 2^maxHistoryRetries times that, so
// that no wait is shorter than the historyBackoff·2^try of before.
var historyRetry = retry.Policy{Min: 2 * historyBackoff, Max: historyBackoff << (maxHistoryRetries + 1)}

// pause waits before retry number try (from 0), by historyRetry.
func pause(ctx context.Context, try int) error {
	t := time.NewTimer(historyRetry.Delay(try + 1))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// replay writes the first page and the rest of history: what the gateway's
// history cache holds after the first page, then pages from the owner up to
// the end of the log. Then the watcher is live: it is sent delta frames from
// now on (those that arrived meanwhile were dropped).
func (f *feed) replay(ctx context.Context, first *session.Reply, out sink) error {
	if err := f.emitPage(first, out); err != nil {
		return err
	}
	more := first.More
	if cached, err := f.emitCached(first.Epoch, out); err != nil {
		return err
	} else if cached || len(first.Events) == 0 {
		more = f.last < first.LastSeq
	}
	if err := out.flush(); err != nil {
		return err
	}
	if more {
		if err := f.catchUp(ctx, -1, out); err != nil {
			return err
		}
	}
	if f.w != nil {
		f.w.live.Store(true)
	}
	return nil
}

// pump writes the watcher's queue to the sink until the queue ends, ctx is done
// or writing fails. It returns how the connection ends and, if a feed error
// (not a write error) ended it, that error for the client. Whatever waits in
// the queue is written as one batch.
func (f *feed) pump(ctx context.Context, to sink) (ending, error) {
	// ctx's end reaches the writer through its queue, so that waiting for
	// the next batch is one channel receive, not a select.
	stop := context.AfterFunc(ctx, func() { f.w.q.finish(f.s.shutdownEnding()) })
	defer stop()
	var spare []out // the last batch's slice, handed back to the queue
	for {
		<-f.w.q.wake
		items, end, heartbeat := f.w.q.take(spare)
		for _, it := range items {
			var err error
			switch {
			case it.ev != nil:
				err = f.live(ctx, it.ev, to)
			case it.delta:
				// The hub had seen events up to it.after when the delta
				// came: if the feed has written later ones (from
				// history), the delta is older than what the client has
				// and is dropped; the durable agent_message carries its
				// text.
				if it.after == 0 || f.last <= it.after {
					err = to.delta(it.frame)
				}
			default:
				err = to.frame(it.frame)
			}
			if err != nil {
				return f.failed(err)
			}
		}
		if heartbeat {
			if err := to.heartbeat(); err != nil {
				return f.failed(err)
			}
		}
		if err := to.flush(); err != nil {
			return f.failed(err)
		}
		if end != nil {
			return *end, nil
		}
		spare = recycle(items)
	}
}

// failed turns an error of the feed into how the connection ends.
func (f *feed) failed(err error) (ending, error) {
	var we *writeFailed
	switch {
	case errors.As(err, &we):
		return ending{}, nil
	case errors.Is(err, errRevoked):
		return ending{code: websocket.StatusPolicyViolation, reason: reasonRevoked}, nil
	case f.s.ctx.Err() != nil:
		return f.s.shutdownEnding(), nil
	}
	return closeFor(f.s, f.id, err), err
}

// closeFor returns how a connection ends after err, which the client is
// also told about.
func closeFor(s *Server, id session.ID, err error) ending {
	e := session.AsError(err)
	switch e.Code {
	case session.CodeInternal:
		s.log.Error("watch session", "session", string(id), "err", err)
		return ending{code: websocket.StatusInternalError, reason: "internal error"}
	case session.CodeUnavailable, session.CodeTooManyRequests:
		return ending{code: websocket.StatusTryAgainLater, reason: "session unavailable: reconnect"}
	}
	return ending{code: websocket.StatusPolicyViolation, reason: string(e.Code)}
}

// live writes a live event unless it was written already, first filling a
// gap before it from history.
func (f *feed) live(ctx context.Context, ev *event, out sink) error {
	if ev.seq <= f.last {
		return nil
	}
	if ev.seq > f.last+1 {
		f.s.metrics.gapRefetches.Inc()
		if err := f.catchUp(ctx, ev.seq-1, out); err != nil {
			return err
		}
		if ev.seq <= f.last {
			return nil
		}
	}
	return f.emit(ev, out)
}

// catchUp writes history after f.last until it has written upTo, or, when
// upTo is negative, until the owner has nothing more.
func (f *feed) catchUp(ctx context.Context, upTo session.Seq, out sink) error {
	for try := 0; upTo < 0 || f.last < upTo; {
		reply, err := f.page(ctx, f.last, 0)
		if err != nil {
			return err
		}
		if err := f.emitPage(reply, out); err != nil {
			return err
		}
		if err := out.flush(); err != nil {
			return err
		}
		if reply.More && len(reply.Events) > 0 {
			continue
		}
		// The owner has nothing more. A live event beyond its history was
		// published a moment before the owner counted it: ask again.
		if upTo < 0 || f.last >= upTo || try == maxLagRetries {
			break
		}
		if err := pause(ctx, try); err != nil {
			return err
		}
		try++
	}
	if upTo >= 0 && f.last < upTo {
		return session.Errorf(session.CodeInternal, "history of session %s ends at %d, before live event %d", f.id, f.last, upTo+1)
	}
	return nil
}

// emitPage writes the events of a page of history from the owner that come
// after f.last, and caches them.
func (f *feed) emitPage(reply *session.Reply, out sink) error {
	var ev event // one for the page: sinks do not keep it
	from := len(reply.Events)
	for i, raw := range reply.Events {
		if err := parseEventInto(&ev, raw, false); err != nil {
			return session.Errorf(session.CodeInternal, "history of session %s: %v", f.id, err)
		}
		if ev.seq <= f.last {
			continue
		}
		if ev.seq != f.last+1 {
			return session.Errorf(session.CodeInternal, "history of session %s skips from %d to %d", f.id, f.last, ev.seq)
		}
		from = min(from, i)
		if err := f.emit(&ev, out); err != nil {
			return err
		}
	}
	if evs := reply.Events[from:]; len(evs) > 0 {
		f.s.hub.hist.addPage(f.id, reply.Epoch, f.last-session.Seq(len(evs))+1, evs)
	}
	return nil
}

// emitCached writes the events after f.last that the gateway's history
// cache holds in epoch, and reports whether it had any. The cache keeps
// runs of consecutive events; should one not follow on (a bug), it is
// dropped and the rest is read from the owner.
func (f *feed) emitCached(epoch string, out sink) (bool, error) {
	evs := f.s.hub.hist.since(f.id, epoch, f.last)
	var ev event
	for i, raw := range evs {
		if err := parseEventInto(&ev, raw, false); err != nil || ev.seq != f.last+1 {
			f.s.log.Error("history cache out of order: dropped", "session", string(f.id), "after", f.last, "err", err)
			f.s.hub.hist.drop(f.id)
			return i > 0, nil
		}
		if err := f.emit(&ev, out); err != nil {
			return true, err
		}
	}
	return len(evs) > 0, nil
}

// emit writes ev, the next event, and makes a watcher's role follow member
// changes after roleSeq: the new member role, as session.RoleFor makes it
// for the caller (a tenant admin stays an owner; a cap still lowers it). A
// caller left with no role is disconnected.
func (f *feed) emit(ev *event, out sink) error {
	if err := out.event(ev); err != nil {
		return err
	}
	f.last = ev.seq
	if ev.member != nil && ev.member.User == f.p.User && f.w != nil && ev.seq > f.roleSeq {
		role := session.RoleFor(f.p, f.p.Tenant, f.owner, session.Members{f.p.User: ev.member.Role})
		f.w.setRole(role)
		if !role.Valid() {
			return errRevoked
		}
	}
	return nil
}
