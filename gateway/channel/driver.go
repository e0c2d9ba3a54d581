package channel

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// driverBuffer is how many live events may wait for a driver; beyond it
// NATS drops them, and the driver fills the gap from history.
const driverBuffer = 4096

// historyPage bounds one history read of a driver.
const historyPage = 500

// driver delivers one bound session's events to its thread and webhooks.
// It holds the session's lease in the leases bucket while it runs, so no
// other gateway delivers them too; it reads the session's events live from
// NATS, filling gaps and catching up from history, and it advances the
// binding's cursor as deliveries complete, so that the next driver (after
// this one idles out, or its gateway dies) starts where it stopped.
type driver struct {
	s  *Service
	id session.ID

	// reload (capacity 1) asks the driver to read its binding again (a
	// thread was bound or a webhook subscribed while it ran).
	reload chan struct{}

	// Used by the driver's goroutine only.
	lease     uint64
	binding   *Binding
	p         session.Principal // as whom history is read: the session's owner
	processed session.Seq
	stored    session.Seq // the cursor last stored
	thread    *thread
	chat      *queue
	hooks     *queue
	runs      sync.WaitGroup // the queues' run loops
	lastView  []byte         // the view last stored, encoded
	deleted   bool           // the session was deleted
}

// run drives the session until it has been idle for IdleAfter, the lease
// is lost, or the service closes.
func (d *driver) run() {
	defer d.s.forget(d)
	s := d.s
	rev, ok, err := s.st.acquire(s.ctx, d.id, s.cfg.Gateway)
	if err != nil {
		s.log.Warn("channel driver: acquire lease", "session", string(d.id), "err", err)
		s.backOff(d.id)
		return
	}
	if !ok {
		s.backOff(d.id) // another gateway drives it
		return
	}
	d.lease = rev
	held := true
	defer func() {
		if held {
			s.st.releaseLease(context.WithoutCancel(s.ctx), d.id, d.lease)
		}
	}()

	if err := d.load(); err != nil {
		s.log.Warn("channel driver: read binding", "session", string(d.id), "err", err)
		return
	}
	if d.binding == nil {
		return
	}
	msgs := make(chan *nats.Msg, driverBuffer)
	sub, err := s.cfg.NATS.ChanSubscribe(s.cfg.Subjects.Events(d.id), msgs)
	if err != nil {
		s.log.Warn("channel driver: subscribe", "session", string(d.id), "err", err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.cfg.NATS.FlushTimeout(s.cfg.Timeout); err != nil {
		s.log.Warn("channel driver: subscribe", "session", string(d.id), "err", err)
		return
	}

	qctx, cancel := context.WithCancel(s.hard)
	d.chat = newQueue(string(d.id), s.cfg.Retry, s.log)
	d.hooks = newQueue(string(d.id)+" webhooks", s.cfg.HookRetry, s.log)
	d.runs.Go(func() { d.chat.run(qctx) })
	d.runs.Go(func() { d.hooks.run(qctx) })
	defer func() {
		cancel()
		d.runs.Wait()
		d.store(context.WithoutCancel(s.ctx))
	}()

	d.processed = d.binding.Cursor
	d.stored = d.binding.Cursor
	d.setThread()
	if err := d.replay(); err != nil {
		s.log.Warn("channel driver: replay the running turn", "session", string(d.id), "err", err)
	}
	if err := d.catchUp(-1); err != nil {
		s.log.Warn("channel driver: catch up", "session", string(d.id), "err", err)
	}

	renew := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer renew.Stop()
	save := time.NewTicker(time.Second)
	defer save.Stop()
	idle := time.NewTimer(s.cfg.IdleAfter)
	defer idle.Stop()
	for {
		select {
		case <-s.ctx.Done():
			d.drain()
			return
		case m := <-msgs:
			d.live(m)
			if d.deleted {
				d.drain()
				if err := s.st.unbind(context.WithoutCancel(s.ctx), d.binding); err != nil {
					s.log.Warn("channel driver: forget a deleted session's binding", "session", string(d.id), "err", err)
				}
				d.chat = nil // nothing left to store
				return
			}
			resetTimer(idle, s.cfg.IdleAfter)
		case <-d.reload:
			if err := d.load(); err != nil {
				s.log.Warn("channel driver: read binding", "session", string(d.id), "err", err)
			} else if d.binding != nil {
				d.setThread()
			}
		case <-renew.C:
			rev, err := s.st.renew(s.ctx, d.id, s.cfg.Gateway, d.lease)
			if err != nil {
				if s.ctx.Err() != nil {
					continue
				}
				s.log.Warn("channel driver: lease lost: stopping", "session", string(d.id), "err", err)
				held = false
				return
			}
			d.lease = rev
		case <-save.C:
			d.store(s.ctx)
		case <-idle.C:
			if !d.chat.empty() || !d.hooks.empty() || len(msgs) > 0 {
				idle.Reset(s.cfg.IdleAfter)
				continue
			}
			return
		}
	}
}

// drain waits for the queues to deliver what they hold, until the service
// gives up waiting (Close's deadline).
func (d *driver) drain() {
	select {
	case <-d.chat.drained():
	case <-d.s.hard.Done():
		return
	}
	select {
	case <-d.hooks.drained():
	case <-d.s.hard.Done():
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

// load reads the binding and decides as whom to read history.
func (d *driver) load() error {
	b, _, err := d.s.st.binding(d.s.ctx, d.id)
	if err != nil {
		return err
	}
	d.binding = b
	if b == nil {
		return nil
	}
	owner, tenant := b.Owner, b.Tenant
	if e, ok := d.s.catalogEntry(d.id); ok {
		owner, tenant = e.owner, e.tenant
	}
	d.p = session.Principal{User: owner, Tenant: tenant, Via: "channel"}
	return nil
}

// setThread starts rendering into the binding's thread, if it has one
// this driver does not render yet.
func (d *driver) setThread() {
	b := d.binding
	if b.Thread == nil || (d.thread != nil && d.thread.th == *b.Thread) {
		return
	}
	ch := d.s.channel(b.Thread.Platform)
	if ch == nil {
		d.s.log.Warn("channel driver: no adapter for the thread's platform: its messages are not posted",
			"session", string(d.id), "platform", b.Thread.Platform)
		return
	}
	d.thread = newThread(ch, *b.Thread, d.chat, d.s.link(d.id), &d.s.cfg, b.View)
}

// replay rebuilds the running turn's output from history, without posting
// anything, when a previous driver stopped in the middle of a turn.
func (d *driver) replay() error {
	v := d.binding.View
	if d.thread == nil || v == nil || v.Turn == 0 || v.TurnStart <= 0 || v.TurnStart > d.processed {
		return nil
	}
	until := d.processed
	after := v.TurnStart - 1
	for after < until {
		evs, more, err := d.s.cfg.Sessions.History(d.s.ctx, d.p, d.id, after, historyPage)
		if err != nil {
			return err
		}
		for _, raw := range evs {
			var ev session.Event
			if err := json.Unmarshal(raw, &ev); err != nil {
				return fmt.Errorf("decode event of %s: %w", d.id, err)
			}
			if ev.Seq > until {
				break
			}
			d.thread.event(&ev, true)
			after = ev.Seq
		}
		if !more || len(evs) == 0 {
			break
		}
	}
	d.thread.resume(d.processed)
	return nil
}

// live handles an event from NATS.
func (d *driver) live(m *nats.Msg) {
	if session.ControlKind(m.Header.Get(session.HeaderControl)) == session.ControlDeleted {
		d.deleted = true
		return
	}
	var ev session.Event
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		d.s.log.Warn("channel driver: skip undecodable event", "session", string(d.id), "err", err)
		return
	}
	if ev.Seq <= d.processed {
		return
	}
	if ev.Seq > d.processed+1 {
		if err := d.catchUp(ev.Seq - 1); err != nil {
			d.s.log.Warn("channel driver: fill a gap from history", "session", string(d.id), "err", err)
		}
		if ev.Seq <= d.processed {
			return
		}
	}
	d.event(&ev, m.Data)
}

// catchUp reads history after the last processed event, up to upTo (or
// everything, when upTo is negative).
func (d *driver) catchUp(upTo session.Seq) error {
	for upTo < 0 || d.processed < upTo {
		evs, more, err := d.s.cfg.Sessions.History(d.s.ctx, d.p, d.id, d.processed, historyPage)
		if err != nil {
			return err
		}
		for _, raw := range evs {
			var ev session.Event
			if err := json.Unmarshal(raw, &ev); err != nil {
				return fmt.Errorf("decode event of %s: %w", d.id, err)
			}
			if ev.Seq != d.processed+1 {
				continue
			}
			d.event(&ev, raw)
		}
		if !more || len(evs) == 0 {
			break
		}
	}
	if upTo >= 0 && d.processed < upTo {
		return errors.New("history ends before the live event")
	}
	return nil
}

// event renders ev into the thread and queues its webhook deliveries.
func (d *driver) event(ev *session.Event, raw json.RawMessage) {
	if d.thread != nil {
		d.thread.event(ev, false)
	}
	for _, sub := range d.binding.Hooks {
		if !sub.wants(ev.Kind) || d.s.cfg.Webhooks == nil {
			continue
		}
		target, body, attempt := sub.Target, append(json.RawMessage(nil), raw...), 0
		d.hooks.push(&job{first: ev.Seq, last: ev.Seq, what: "webhook " + target, run: func(ctx context.Context) error {
			attempt++
			return d.s.cfg.Webhooks.Deliver(ctx, target, d.id, body, attempt)
		}})
	}
	d.processed = ev.Seq
}

// store writes the cursor (what has been delivered) and the thread's view.
func (d *driver) store(ctx context.Context) {
	if d.chat == nil {
		return
	}
	cursor := min(d.chat.delivered(d.processed), d.hooks.delivered(d.processed))
	var v *view
	var vb []byte
	if d.thread != nil {
		v = d.thread.snapshot(cursor)
		vb, _ = json.Marshal(v)
	}
	if cursor == d.stored && bytes.Equal(vb, d.lastView) {
		return
	}
	_, err := d.s.st.updateBinding(ctx, d.id, func(b *Binding) {
		b.Cursor = max(b.Cursor, cursor)
		if v != nil {
			b.View = v
		}
	})
	if err != nil {
		d.s.log.Warn("channel driver: store cursor", "session", string(d.id), "err", err)
		return
	}
	d.stored, d.lastView = cursor, vb
}
