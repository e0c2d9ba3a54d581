package gateway

import (
	"context"
	"strconv"
	"sync"

	"github.com/atriumhq/atrium/session"
)

// maxPromptSenders bounds the requests for one session and caller that a
// promptBatcher has in flight at once: while they are, the prompts that
// arrive wait and go together in the next.
const maxPromptSenders = 2

// promptBatcher sends the prompts that REST requests (POST …/messages)
// make to one session for one caller together, as one session.OpPrompts
// request, when they arrive while earlier ones are in flight: group commit
// on the gateway's side, so that under load a session takes one NATS
// request, one actor message and one reply per batch instead of per
// prompt. A lone prompt goes as it always did (OpPrompt).
//
// It starts no goroutine: the request that finds fewer than
// maxPromptSenders in flight sends the prompts waiting (its own first),
// and when its request is answered hands the prompts that arrived
// meanwhile to the next sender, one of their own requests. REST prompts
// have no order among themselves; each is answered with its own seq or
// error. The zero value is ready to use.
type promptBatcher struct {
	mu     sync.Mutex
	queues map[promptKey]*promptQueue // guarded by mu; a key without waiting or sending prompts has none
}

// promptKey groups the prompts that may go in one request: same session,
// same caller (the node authorizes the request's principal), same
// activation rule.
type promptKey struct {
	id       session.ID
	who      string // the principal, as its headers
	activate bool
}

type promptQueue struct {
	waiting []*promptWaiter // guarded by promptBatcher.mu
	senders int             // guarded by promptBatcher.mu: requests in flight
}

// promptWaiter is one REST prompt waiting for its answer (or to send).
type promptWaiter struct {
	cmd     session.Command
	lead    bool         // guarded by promptBatcher.mu: told to send
	taken   bool         // guarded by promptBatcher.mu: in a request
	outcome chan outcome // capacity 1: the answer, or the turn to send
}

type outcome struct {
	reply *session.Reply
	err   error
	lead  bool // no answer: send the prompts waiting
}

func principalKey(p session.Principal) string {
	return p.User + "\x00" + p.Tenant + "\x00" + strconv.FormatBool(p.Admin) + "\x00" + string(p.Cap)
}

// prompt sends cmd, an OpPrompt, to id's actor as call would (activating
// the session if activate is set), possibly with other callers' prompts;
// it returns its own answer. If ctx ends first it returns ctx's error; the
// prompt may still be appended then (as with a client that went away).
func (s *Server) prompt(ctx context.Context, p session.Principal, id session.ID, cmd session.Command, activate bool) (*session.Reply, error) {
	b := &s.prompts
	key := promptKey{id: id, who: principalKey(p), activate: activate}
	w := &promptWaiter{cmd: cmd, outcome: make(chan outcome, 1)}
	b.mu.Lock()
	if b.queues == nil {
		b.queues = make(map[promptKey]*promptQueue)
	}
	q := b.queues[key]
	if q == nil {
		q = &promptQueue{}
		b.queues[key] = q
	}
	q.waiting = append(q.waiting, w)
	lead := q.senders < maxPromptSenders
	if lead {
		q.senders++
		w.lead = true
	}
	b.mu.Unlock()

	if !lead {
		var o outcome
		select {
		case o = <-w.outcome:
		case <-ctx.Done():
			b.mu.Lock()
			if !w.taken && !w.lead {
				q.waiting = removeWaiter(q.waiting, w)
				b.mu.Unlock()
				return nil, natsError(ctx.Err())
			}
			b.mu.Unlock()
			// Taken into a request (its answer is coming) or told to
			// send (others wait on it): see it through.
			if o = <-w.outcome; !o.lead {
				return nil, natsError(ctx.Err())
			}
		}
		if !o.lead {
			return o.reply, o.err
		}
	}

	// Send what waits, this prompt first, but not the prompts told to
	// send (they send themselves).
	b.mu.Lock()
	batch := []*promptWaiter{w}
	rest := q.waiting[:0]
	for _, x := range q.waiting {
		switch {
		case x == w:
		case !x.lead && len(batch) < session.MaxPromptsPerCommand:
			batch = append(batch, x)
		default:
			rest = append(rest, x)
		}
	}
	clear(q.waiting[len(rest):])
	q.waiting = rest
	for _, x := range batch {
		x.taken = true
	}
	b.mu.Unlock()

	// The request outlives this caller's context: it carries other
	// callers' prompts. call bounds it with the request timeout.
	s.sendPrompts(context.WithoutCancel(ctx), p, id, activate, batch)

	// Hand on to a prompt that arrived meanwhile: it sends in this one's
	// place.
	b.mu.Lock()
	var next *promptWaiter
	for _, x := range q.waiting {
		if !x.lead {
			next = x
			break
		}
	}
	if next != nil {
		next.lead = true
		next.outcome <- outcome{lead: true} // never blocks: it has had nothing yet
	} else if q.senders--; q.senders == 0 && len(q.waiting) == 0 {
		delete(b.queues, key)
	}
	b.mu.Unlock()

	o := <-w.outcome // answered by sendPrompts
	if err := ctx.Err(); err != nil {
		return nil, natsError(err)
	}
	return o.reply, o.err
}

// sendPrompts sends the prompts of batch in one request (one alone as
// OpPrompt) and answers each.
func (s *Server) sendPrompts(ctx context.Context, p session.Principal, id session.ID, activate bool, batch []*promptWaiter) {
	if len(batch) == 1 {
		reply, err := s.call(ctx, p, id, batch[0].cmd, activate)
		batch[0].outcome <- outcome{reply: reply, err: err}
		return
	}
	cmd := session.Command{Op: session.OpPrompts, Prompts: make([]session.PromptItem, len(batch))}
	for i, w := range batch {
		cmd.Prompts[i] = session.PromptItem{Text: w.cmd.Text, ClientID: w.cmd.ClientID}
	}
	reply, err := s.call(ctx, p, id, cmd, activate)
	if err == nil && len(reply.Results) != len(batch) {
		err = session.Errorf(session.CodeInternal, "session %s answered %d results to %d prompts", id, len(reply.Results), len(batch))
	}
	switch {
	case err == nil:
		for i, w := range batch {
			r := &reply.Results[i]
			if r.Error != nil {
				w.outcome <- outcome{err: r.Error}
			} else {
				w.outcome <- outcome{reply: r}
			}
		}
	case unknownOp(err): // a node that predates OpPrompts
		for _, w := range batch {
			reply, err := s.call(ctx, p, id, w.cmd, activate)
			w.outcome <- outcome{reply: reply, err: err}
		}
	default:
		for _, w := range batch {
			w.outcome <- outcome{err: err}
		}
	}
}

func removeWaiter(ws []*promptWaiter, w *promptWaiter) []*promptWaiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}
