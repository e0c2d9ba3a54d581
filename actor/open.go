package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// opener does a session actor's activation I/O, which runs off the actor's
// goroutine: creating or opening the history, finishing a turn a stop
// interrupted, reading the turn queue, and subscribing the Cmd subject. It
// holds only what that needs (never the actor's state), so what it does
// reaches the actor only through the handoff. Bringing the history up to
// date with the events stream before it opens is in takeover.go.
type opener struct {
	h   *Host
	id  session.ID
	log *slog.Logger

	// pre is the history opened while the lease was being acquired, for
	// the continued path of waking (openLocal); nil if none.
	pre *preOpened
}

// preOpened is the result of opening the local history beside the lease.
type preOpened struct {
	hist History
	err  error
}

// openBeside opens the local history on a goroutine of s while the lease
// is acquired: a session waking on the node that released it last (the
// lease is continued, the common case) then waits for one round trip to
// the lease's bucket or for the file, whichever is slower, not for both.
// Opening touches nothing another node could own (the file is this
// node's) and writes nothing but a schema migration of a history an older
// atrium wrote, which any holder would make; keep or drop the result once
// the lease is known.
func (o *opener) openBeside(ctx context.Context, s *sessionActor) <-chan preOpened {
	c := make(chan preOpened, 1)
	s.spawn(func() {
		hist, err := o.h.cfg.Histories.Open(ctx, o.id)
		c <- preOpened{hist, err}
	})
	return c
}

// keepPre keeps p for openLocal if the lease l is continued (the file is
// current); otherwise it closes p's history, which the takeover path
// opens again after comparing it with the stream.
func (o *opener) keepPre(l *lease, p preOpened) {
	if l != nil && l.continued {
		o.pre = &p
		return
	}
	if p.hist != nil {
		p.hist.Close()
	}
}

// openLocal opens the local history: the one opened beside the lease, if
// kept, or now.
func (o *opener) openLocal(ctx context.Context) (History, error) {
	if p := o.pre; p != nil {
		o.pre = nil
		return p.hist, p.err
	}
	return o.h.cfg.Histories.Open(ctx, o.id)
}

// subscribe subscribes the Cmd subject and waits until the server has it.
func (o *opener) subscribe(ctx context.Context, subject string, self *proto.PID) (*nats.Subscription, error) {
	root := o.h.system.Root
	sub, err := o.h.cfg.NATS.Subscribe(subject, func(msg *nats.Msg) { root.Send(self, newCmdMsg(msg)) })
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	if err := o.h.cfg.NATS.FlushWithContext(ctx); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe %s: flush: %w", subject, err)
	}
	return sub, nil
}

// create creates the history of a new session (with its parent's events
// for a fork), captures its first events and writes its catalog entry.
func (o *opener) create(ctx context.Context, p *placeMsg) *handoff {
	own, err := o.h.egress.check(p.req.Egress)
	if err != nil {
		return &handoff{err: err}
	}
	now := time.Now().UTC()
	m := session.Meta{
		ID:        o.id,
		Title:     p.req.Title,
		Owner:     p.user.User,
		Tenant:    p.user.Tenant,
		Epoch:     session.NewEpoch(),
		CreatedAt: session.Time{Time: now},
		Members:   session.Members{p.user.User: session.RoleOwner},
		Harness:   p.req.Harness,
		Egress:    own,
	}
	if p.req.Settings != nil { // checked by parsePlace; applied before anything is written
		if err := o.h.applySettings(&m, p.req.Settings); err != nil {
			return &handoff{err: err}
		}
	}
	hist, err := o.h.cfg.Histories.Create(ctx, m)
	if err != nil {
		return &handoff{err: fmt.Errorf("create session %s: %w", o.id, err)}
	}
	fail := func(err error) *handoff {
		hist.Close()
		if rerr := o.h.cfg.Histories.Remove(context.WithoutCancel(ctx), o.id); rerr != nil {
			o.log.Warn("remove history of a failed create", "err", rerr)
		}
		return &handoff{err: err}
	}
	ev := encodeEvent(1, m.Epoch, now, session.KindSessionCreated, p.user.User,
		mustMarshal(session.SessionCreatedData{Title: m.Title}))
	evs := []session.Stored{ev}
	if p.req.Fork != nil { // A fork starts with its parent's history (files.go).
		if evs, err = forkEvents(p, m, now); err != nil {
			return fail(fmt.Errorf("create session %s: %w", o.id, err))
		}
	}
	if err := hist.Append(ctx, evs); err != nil {
		return fail(fmt.Errorf("create session %s: %w", o.id, err))
	}
	if _, err := o.h.captureEvents(ctx, o.id, m.Epoch, evs, &m); err != nil {
		return fail(fmt.Errorf("create session %s: %w", o.id, session.Errorf(session.CodeUnavailable, "%v", err)))
	}
	entry := catalogEntry(m, evs[len(evs)-1].Seq, session.StateActive, session.SandboxNone)
	entry.Node = o.h.cfg.NodeID
	b, _ := json.Marshal(entry)
	if _, err := o.h.kv.Create(ctx, string(o.id), b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			err = session.Errorf(session.CodeConflict, "session %s already exists", o.id)
		}
		return fail(fmt.Errorf("create session %s: catalog: %w", o.id, err))
	}
	// The file was made here and its events captured: it agrees with the
	// stream, so its release is remembered and the first wake on this
	// node takes the fast path (no stream lookup).
	o.h.markCurrent(o.id)
	if p.req.Fork != nil {
		res, err := o.recover(ctx, hist)
		if err != nil {
			return fail(fmt.Errorf("create session %s: %w", o.id, err))
		}
		return &handoff{hist: hist, open: res}
	}
	return &handoff{hist: hist, open: &openResult{meta: m, last: 1, sandbox: session.SandboxNone}}
}

// open opens an existing history and, if the process stopped in the middle
// of a turn, finishes that turn in the log before serving.
func (o *opener) open(ctx context.Context, l *lease) *handoff {
	hist, err := o.bringUpToDate(ctx, l.continued)
	if err != nil {
		return &handoff{err: fmt.Errorf("activate session %s: %w", o.id, err)}
	}
	res, err := o.recover(ctx, hist)
	if err != nil {
		hist.Close()
		return &handoff{err: fmt.Errorf("activate session %s: %w", o.id, err)}
	}
	return &handoff{hist: hist, open: res}
}

// recover reads what the actor needs from an opened history: metadata,
// last seq, sandbox state, the turn queue and how the last turn ended.
func (o *opener) recover(ctx context.Context, hist History) (*openResult, error) {
	m, err := hist.Meta(ctx)
	if err != nil {
		return nil, err
	}
	last, err := hist.LastSeq(ctx)
	if err != nil {
		return nil, err
	}
	if err := recoverUsage(ctx, hist, &m); err != nil { // usage.go
		return nil, fmt.Errorf("total usage: %w", err)
	}
	res := &openResult{meta: m, last: last, sandbox: session.SandboxNone}
	if last > 0 {
		evs, _, err := hist.Range(ctx, last-1, 1, 0)
		if err != nil {
			return nil, err
		}
		var ev session.Event
		if len(evs) == 1 && json.Unmarshal(evs[0], &ev) == nil && !ev.Time.IsZero() {
			res.lastTime = &ev.Time
		}
	}
	if raw, err := hist.LastOfKind(ctx, session.KindSandbox); err != nil {
		return nil, err
	} else if raw != nil {
		var d session.SandboxData
		if _, err := decodeEvent(raw, &d); err == nil && d.State != "" {
			res.sandbox = d.State
		}
	}
	var started, finished session.TurnStartedData
	rawStarted, err := hist.LastOfKind(ctx, session.KindTurnStarted)
	if err != nil {
		return nil, err
	}
	if rawStarted != nil {
		startEv, err := decodeEvent(rawStarted, &started)
		if err != nil {
			return nil, fmt.Errorf("decode last turn_started: %w", err)
		}
		res.lastTurn = started.Turn
		rawFinished, err := hist.LastOfKind(ctx, session.KindTurnFinished)
		if err != nil {
			return nil, err
		}
		if rawFinished != nil {
			if _, err := decodeEvent(rawFinished, &finished); err != nil {
				return nil, fmt.Errorf("decode last turn_finished: %w", err)
			}
		}
		if finished.Turn < started.Turn {
			if err := o.finishInterrupted(ctx, hist, res, startEv, started.Turn); err != nil {
				return nil, err
			}
		}
	}
	// Every prompt after the one the last turn ran was acknowledged but
	// never started: it is the queue, and it runs now.
	if res.queue, res.prompted, err = queuedPrompts(ctx, hist, started.PromptSeq); err != nil {
		return nil, fmt.Errorf("read queued prompts: %w", err)
	}
	if len(res.queue) > 0 {
		o.log.Info("resuming queued prompts", "prompts", len(res.queue))
	}
	if res.lastTurn > 0 {
		if res.prev, err = previousOf(ctx, hist); err != nil {
			return nil, fmt.Errorf("read how the last turn ended: %w", err)
		}
	}
	return res, nil
}

// finishInterrupted logs that the process stopped during turn n and finishes
// it as failed.
func (o *opener) finishInterrupted(ctx context.Context, hist History, res *openResult, startEv session.Event, n int64) error {
	now := time.Now().UTC()
	evs := []session.Stored{
		encodeEvent(res.last+1, res.meta.Epoch, now, session.KindError, session.BySystem, mustMarshal(session.ErrorData{
			Code:    session.CodeUnavailable,
			Message: fmt.Sprintf("turn %d was interrupted because the server stopped", n),
		})),
		encodeEvent(res.last+2, res.meta.Epoch, now, session.KindTurnFinished, session.BySystem, mustMarshal(session.TurnFinishedData{
			Turn: n, Status: session.TurnFailed, ExitCode: -1,
			DurationMS: max(now.Sub(startEv.Time.Time).Milliseconds(), 0),
		})),
	}
	if err := hist.Append(ctx, evs); err != nil {
		return fmt.Errorf("finish interrupted turn %d: %w", n, err)
	}
	if _, err := o.h.captureEvents(ctx, o.id, res.meta.Epoch, evs, nil); err != nil {
		return session.Errorf(session.CodeUnavailable, "finish interrupted turn %d: %v", n, err)
	}
	res.last += 2
	o.log.Info("finished a turn interrupted by a stop", "turn", n)
	return nil
}

// queuedPrompts returns the prompts (message events) after seq after, in
// order, and whether the history holds any prompt. The common case, no
// message after it, costs one indexed lookup.
func queuedPrompts(ctx context.Context, hist History, after session.Seq) (_ []session.Prompt, prompted bool, _ error) {
	raw, err := hist.LastOfKind(ctx, session.KindMessage)
	if err != nil || raw == nil {
		return nil, false, err
	}
	var head struct {
		Seq session.Seq `json:"seq"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, true, fmt.Errorf("decode last message: %w", err)
	}
	lastMsg := head.Seq
	var queue []session.Prompt
	for after < lastMsg {
		evs, more, err := hist.Range(ctx, after, maxHistoryLimit, session.DefaultHistoryMaxBytes)
		if err != nil {
			return nil, true, err
		}
		for _, raw := range evs {
			var ev struct {
				Seq  session.Seq         `json:"seq"`
				Kind session.Kind        `json:"kind"`
				By   string              `json:"by"`
				Data session.MessageData `json:"data"`
			}
			if err := json.Unmarshal(raw, &ev); err != nil {
				return nil, true, fmt.Errorf("decode event after %d: %w", after, err)
			}
			after = ev.Seq
			if ev.Kind == session.KindMessage {
				queue = append(queue, session.Prompt{Seq: ev.Seq, Text: ev.Data.Text, By: ev.By})
			}
		}
		if !more || len(evs) == 0 {
			break
		}
	}
	return queue, true, nil
}
