package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// DefaultFanoutPace is the default of Config.FanoutPace.
const DefaultFanoutPace = 20 * time.Millisecond

// paceWatchers is the number of local watchers at which a topic's pacing
// reaches the full Config.FanoutPace; below, it is that much shorter.
const paceWatchers = 1000

// hubBuffer is the capacity of the channel that every NATS subscription of
// the hub delivers into. When it is full NATS drops messages; watchers then
// see a gap and refetch it from history, and presence is republished.
const hubBuffer = 8192

// watcher is one connection (WebSocket or SSE) watching a session. Its queue
// is filled by the hub and by the connection's reader, and drained by the
// connection's writer.
type watcher struct {
	conn  string // connection id shown in presence
	user  string
	since session.Time
	sse   bool         // SSE streams get events only, no presence frames
	token string       // the API token the connection authenticated with; "" if none
	role  atomic.Value // session.Role; follows member_changed events
	// deltas is set (before joining) on WebSocket and SSE watchers, which
	// are sent the session's streaming agent text.
	deltas bool
	// live is set by the feed once it has replayed history: from then on
	// the hub queues delta frames for the watcher. A delta that arrives
	// while history is replayed is dropped: it may be of a message whose
	// durable agent_message the replay has written already.
	live atomic.Bool
	q    queue
	// typing is until when the watcher's user is typing a prompt; zero
	// when not. Guarded by the mu of the watcher's topic.
	typing time.Time
}

func (s *Server) newWatcher(user string, sse bool) *watcher {
	w := &watcher{
		conn:  "c_" + randomToken(8),
		user:  user,
		since: session.Time{Time: time.Now().UTC()},
		sse:   sse,
	}
	w.q.init(s.sendQueue)
	w.role.Store(session.RoleNone)
	return w
}

func (w *watcher) getRole() session.Role  { return w.role.Load().(session.Role) }
func (w *watcher) setRole(r session.Role) { w.role.Store(r) }

// hub fans out each watched session's events, streaming agent text (delta
// frames) and presence to its local watchers. A session with local watchers
// is a topic with one NATS subscription to its events, one to its deltas and
// one to its presence; every subscription
// delivers into one channel, drained by one dispatcher goroutine (run), so the
// hub's cost does not grow with connections.
type hub struct {
	s    *Server
	msgs chan *nats.Msg
	// pace is the least time between two wake-ups of the writers of a
	// topic with paceWatchers local watchers or more (see
	// topic.broadcastLocked); 0 wakes them at every broadcast.
	pace time.Duration
	// hist caches the latest events of watched sessions for resumes.
	hist *histCache

	// kick (capacity 1) tells the maintenance loop that topics are dirty.
	kick chan struct{}

	mu     sync.Mutex
	topics map[session.ID]*topic         // guarded by mu
	subs   map[*nats.Subscription]*topic // guarded by mu
	dirty  map[*topic]struct{}           // guarded by mu: presence to flush
	typing map[*topic]struct{}           // guarded by mu: topics with a watcher typing
}

// topic is one session watched from this gateway.
type topic struct {
	id                  session.ID
	evSub, prSub, dlSub *nats.Subscription // set at creation
	refs                int                // guarded by hub.mu
	// lastSeq is the seq of the newest event the hub has dispatched to the
	// topic, 0 before the first. Owned by the dispatcher (hub.run).
	lastSeq session.Seq

	mu       sync.Mutex
	watchers map[*watcher]struct{}     // guarded by mu
	remote   map[string]remotePresence // guarded by mu: other gateways' watchers
	presence []byte                    // guarded by mu: the last presence frame sent
	publish  bool                      // guarded by mu: our list must be published at the next flush
	// nextFlush is the earliest time of the next presence flush.
	nextFlush time.Time // guarded by mu

	// Paced broadcast (see broadcastLocked): lastWake is when the
	// watchers' writers were last woken; while armed, waker (created at
	// the first use) will wake them again.
	lastWake time.Time   // guarded by mu
	armed    bool        // guarded by mu
	waker    *time.Timer // guarded by mu
}

type remotePresence struct {
	watchers []session.Watcher
	seen     time.Time
}

func newHub(s *Server, histBytes int) *hub {
	return &hub{
		pace:   s.fanoutPace,
		s:      s,
		msgs:   make(chan *nats.Msg, hubBuffer),
		hist:   newHistCache(histBytes),
		kick:   make(chan struct{}, 1),
		topics: make(map[session.ID]*topic),
		subs:   make(map[*nats.Subscription]*topic),
		dirty:  make(map[*topic]struct{}),
		typing: make(map[*topic]struct{}),
	}
}

// join adds w to id's topic, subscribing to the session if w is its first
// local watcher. When join returns, every event the session publishes from
// then on reaches w's queue: the subscription is registered with the server
// (flushed), so a history read made after join overlaps the live stream.
func (h *hub) join(ctx context.Context, id session.ID, w *watcher) (*topic, error) {
	h.mu.Lock()
	t := h.topics[id]
	if t == nil {
		var err error
		t, err = h.subscribeLocked(id)
		if err != nil {
			h.mu.Unlock()
			return nil, err
		}
	}
	t.refs++
	h.mu.Unlock()

	t.add(w)
	h.markDirty(t)
	ctx, cancel := context.WithTimeout(ctx, h.s.reqTimeout)
	defer cancel()
	if err := h.s.nc.FlushWithContext(ctx); err != nil {
		h.leave(t, w)
		return nil, natsError(fmt.Errorf("flush subscription to session %s: %w", id, err))
	}
	return t, nil
}

func (h *hub) subscribeLocked(id session.ID) (*topic, error) {
	t := &topic{id: id, watchers: make(map[*watcher]struct{}), remote: make(map[string]remotePresence)}
	var err error
	if t.evSub, err = h.s.nc.ChanSubscribe(h.s.subj.Events(id), h.msgs); err != nil {
		return nil, natsError(fmt.Errorf("subscribe to events of %s: %w", id, err))
	}
	if t.prSub, err = h.s.nc.ChanSubscribe(h.s.subj.Presence(id), h.msgs); err != nil {
		_ = t.evSub.Unsubscribe()
		return nil, natsError(fmt.Errorf("subscribe to presence of %s: %w", id, err))
	}
	if t.dlSub, err = h.s.nc.ChanSubscribe(h.s.subj.Delta(id), h.msgs); err != nil {
		_ = t.evSub.Unsubscribe()
		_ = t.prSub.Unsubscribe()
		return nil, natsError(fmt.Errorf("subscribe to deltas of %s: %w", id, err))
	}
	h.topics[id] = t
	h.subs[t.evSub] = t
	h.subs[t.prSub] = t
	h.subs[t.dlSub] = t
	h.s.metrics.sessions.Inc()
	return t, nil
}

// leave removes w from t, unsubscribing when it was the last local watcher
// (and then telling other gateways at once that we have none).
func (h *hub) leave(t *topic, w *watcher) {
	t.remove(w)
	h.mu.Lock()
	t.refs--
	last := t.refs == 0
	if last {
		h.unsubscribeLocked(t)
	}
	h.mu.Unlock()
	if !last {
		h.markDirty(t)
		return
	}
	t.mu.Lock()
	msg := t.localPresenceLocked(h.s.id)
	t.mu.Unlock()
	h.s.publishPresence(t.id, msg)
}

// markDirty schedules a presence flush of t. Flushes are debounced, so that
// many watchers joining at once cost a few presence frames, not one each.
func (h *hub) markDirty(t *topic) {
	h.mu.Lock()
	if h.topics[t.id] == t {
		h.dirty[t] = struct{}{}
	}
	h.mu.Unlock()
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// flushPresence publishes the lists of this gateway's watchers that changed
// and sends presence frames where the merged list changed. A frame costs its
// size times the watchers it goes to, so a busy topic is flushed less often
// (presenceSpacing); a topic not due yet is marked dirty again, which arms
// the next flush.
func (h *hub) flushPresence(now time.Time) {
	h.mu.Lock()
	dirty := h.dirty
	h.dirty = make(map[*topic]struct{})
	h.mu.Unlock()
	var later []*topic
	for t := range dirty {
		t.mu.Lock()
		if now.Before(t.nextFlush) {
			t.mu.Unlock()
			later = append(later, t)
			continue
		}
		t.nextFlush = now.Add(h.s.presenceSpacing(len(t.watchers)))
		var msg []byte
		if t.publish {
			t.publish = false
			msg = t.localPresenceLocked(h.s.id)
		}
		t.sendPresenceLocked(h.s)
		t.mu.Unlock()
		if msg != nil {
			h.s.publishPresence(t.id, msg)
		}
	}
	for _, t := range later {
		h.markDirty(t)
	}
}

// presenceSpacing is the least time between two presence flushes of a topic
// with n local watchers: presenceDebounce per ten watchers, at most the
// presence interval.
func (s *Server) presenceSpacing(n int) time.Duration {
	return min(presenceDebounce*time.Duration(max(1, n/10)), s.presenceEvery)
}

func (h *hub) unsubscribeLocked(t *topic) {
	if h.topics[t.id] != t {
		return
	}
	delete(h.topics, t.id)
	delete(h.subs, t.evSub)
	delete(h.subs, t.prSub)
	delete(h.subs, t.dlSub)
	delete(h.dirty, t)
	delete(h.typing, t)
	_ = t.evSub.Unsubscribe()
	_ = t.prSub.Unsubscribe()
	_ = t.dlSub.Unsubscribe()
	t.mu.Lock()
	if t.waker != nil {
		t.waker.Stop()
	}
	t.mu.Unlock()
	h.s.metrics.sessions.Dec()
}

// run dispatches NATS messages to topics until the server closes.
func (h *hub) run() {
	for {
		select {
		case <-h.s.ctx.Done():
			return
		case m := <-h.msgs:
			h.dispatch(m)
		}
	}
}

func (h *hub) dispatch(m *nats.Msg) {
	h.mu.Lock()
	t := h.subs[m.Sub]
	h.mu.Unlock()
	if t == nil {
		return // the topic ended while the message waited.
	}
	if m.Sub == t.prSub {
		var pm session.PresenceMessage
		if err := json.Unmarshal(m.Data, &pm); err != nil {
			h.s.log.Warn("skip undecodable presence message", "session", string(t.id), "err", err)
			return
		}
		if pm.Gateway != h.s.id && t.onPresence(pm, time.Now()) {
			h.markDirty(t)
		}
		return
	}
	if m.Sub == t.dlSub {
		if !isDeltaFrame(m.Data) {
			h.s.log.Warn("skip undecodable delta frame", "session", string(t.id))
			return
		}
		t.broadcastDelta(h.s, out{frame: m.Data, delta: true, after: t.lastSeq})
		return
	}
	if session.ControlKind(m.Header.Get(session.HeaderControl)) == session.ControlDeleted {
		h.hist.drop(t.id)
		t.closeAll(ending{code: 1000, reason: reasonDeleted, drain: true})
		return
	}
	ev, err := parseEvent(m.Data, true)
	if err != nil {
		h.s.log.Warn("skip undecodable event", "session", string(t.id), "err", err)
		return
	}
	ev.recv = time.Now()
	t.lastSeq = max(t.lastSeq, ev.seq)
	h.hist.addLive(t.id, ev.seq, ev.raw)
	t.broadcast(h.s, out{ev: ev})
}

// isDeltaFrame reports whether b is a JSON object whose type is delta, as
// the node encodes a session.DeltaFrame. It is passed on as is, so it must
// at least be one JSON value (SSE writes it as one data line).
func isDeltaFrame(b []byte) bool {
	return bytes.HasPrefix(b, []byte(`{"type":"`+session.FrameDelta+`"`)) && json.Valid(b)
}

// close ends the hub's subscriptions. Connections have ended by then.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.topics {
		h.unsubscribeLocked(t)
	}
}

// topicsSnapshot returns the current topics.
func (h *hub) topicsSnapshot() []*topic {
	h.mu.Lock()
	defer h.mu.Unlock()
	ts := make([]*topic, 0, len(h.topics))
	for _, t := range h.topics {
		ts = append(ts, t)
	}
	return ts
}

// refreshPresence republishes this gateway's watchers of every topic and
// forgets other gateways' lists that were not refreshed in time.
func (h *hub) refreshPresence(now time.Time) {
	h.hist.expire(now) // idle history runs go on the same period.
	for _, t := range h.topicsSnapshot() {
		t.mu.Lock()
		msg := t.localPresenceLocked(h.s.id)
		expired := false
		for gw, rp := range t.remote {
			if now.Sub(rp.seen) > h.s.presenceTTL {
				delete(t.remote, gw)
				expired = true
			}
		}
		t.mu.Unlock()
		h.s.publishPresence(t.id, msg)
		if expired {
			h.markDirty(t)
		}
	}
}

// tokenWatchers returns the watchers that authenticated with an API token.
func (h *hub) tokenWatchers() []*watcher {
	var out []*watcher
	for _, t := range h.topicsSnapshot() {
		t.mu.Lock()
		for w := range t.watchers {
			if w.token != "" {
				out = append(out, w)
			}
		}
		t.mu.Unlock()
	}
	return out
}

// heartbeat asks every SSE writer for a heartbeat.
func (h *hub) heartbeat() {
	for _, t := range h.topicsSnapshot() {
		t.mu.Lock()
		for w := range t.watchers {
			if w.sse {
				w.q.beat()
			}
		}
		t.mu.Unlock()
	}
}

func (t *topic) add(w *watcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.watchers[w] = struct{}{}
	t.publish = true
}

func (t *topic) remove(w *watcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.watchers, w)
	t.publish = true
}

// broadcast queues o to every watcher; a watcher whose queue is full is
// closed as a slow consumer. It never blocks.
func (t *topic) broadcast(s *Server, o out) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.broadcastLocked(s, o, true)
}

// broadcastLocked queues o to every watcher (but SSE streams unless toSSE).
//
// Broadcasts are paced: the writers of a topic are woken at most once per
// period, Config.FanoutPace for paceWatchers local watchers and more,
// proportionally less for fewer (a broadcast's cost is in its watchers).
// The first broadcast after a quiet period wakes them at once; one that
// comes sooner is only queued, and a timer wakes every writer when the
// period ends, so each then writes all that came meanwhile with one system
// call (and to an atrium.v1+batch client in one events frame). Waking a
// writer and writing to its socket cost about the same whether one event or
// ten wait, and so does the client's read: at a rate above one broadcast per
// period, pacing divides the fan-out's CPU by the events per period, for at
// most one period of added latency; below, it adds none.
func (t *topic) broadcastLocked(s *Server, o out, toSSE bool) {
	wake := t.paceLocked(s.hub.paceFor(len(t.watchers)), time.Now())
	n := 0
	for w := range t.watchers {
		if w.sse && !toSSE {
			continue
		}
		if w.q.add(o) {
			if wake {
				w.q.signal()
			}
			n++
			continue
		}
		if w.q.finish(ending{code: session.CloseSlowConsumer, reason: reasonSlowConsumer}) {
			s.metrics.slow.Inc()
		}
	}
	if o.ev != nil {
		s.metrics.fanout.Add(float64(n))
	}
}

// broadcastDelta queues a delta frame to every watcher that takes deltas
// and is live; like broadcast, it closes a watcher whose queue is full.
func (t *topic) broadcastDelta(s *Server, o out) {
	t.mu.Lock()
	defer t.mu.Unlock()
	wake := t.paceLocked(s.hub.paceFor(len(t.watchers)), time.Now())
	for w := range t.watchers {
		if !w.deltas || !w.live.Load() {
			continue
		}
		if w.q.add(o) {
			if wake {
				w.q.signal()
			}
			continue
		}
		if w.q.finish(ending{code: session.CloseSlowConsumer, reason: reasonSlowConsumer}) {
			s.metrics.slow.Inc()
		}
	}
}

// paceFor returns the pacing period of a topic with n local watchers.
func (h *hub) paceFor(n int) time.Duration {
	return h.pace * time.Duration(min(n, paceWatchers)) / paceWatchers
}

// paceLocked reports whether a broadcast at now wakes the writers at once:
// pace has passed since they were last woken (or pace is 0). Otherwise it
// arms the timer that wakes them when it has.
func (t *topic) paceLocked(pace time.Duration, now time.Time) bool {
	if since := now.Sub(t.lastWake); pace <= 0 || since >= pace || since < 0 {
		t.lastWake = now
		return true
	}
	if !t.armed {
		t.armed = true
		if d := t.lastWake.Add(pace).Sub(now); t.waker == nil {
			t.waker = time.AfterFunc(d, t.wakeAll)
		} else {
			t.waker.Reset(d)
		}
	}
	return false
}

// wakeAll wakes every watcher's writer at the end of a pacing period.
func (t *topic) wakeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.armed = false
	t.lastWake = time.Now()
	for w := range t.watchers {
		w.q.signal()
	}
}

// closeAll ends every watcher's connection.
func (t *topic) closeAll(e ending) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for w := range t.watchers {
		w.q.finish(e)
	}
}

// onPresence records another gateway's watchers of t. It reports whether
// a flush is needed: the list changed, or the gateway is new to t, in which
// case it should hear about our watchers now rather than at the next refresh.
func (t *topic) onPresence(pm session.PresenceMessage, now time.Time) (flush bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, known := t.remote[pm.Gateway]
	if len(pm.Watchers) == 0 {
		delete(t.remote, pm.Gateway)
		return known
	}
	t.remote[pm.Gateway] = remotePresence{watchers: pm.Watchers, seen: now}
	if !known && len(t.watchers) > 0 {
		t.publish = true
	}
	return !known || !slices.Equal(old.watchers, pm.Watchers)
}

// localPresenceLocked returns the presence message listing this gateway's
// watchers of t.
func (t *topic) localPresenceLocked(gateway string) []byte {
	pm := session.PresenceMessage{Gateway: gateway, Watchers: make([]session.Watcher, 0, len(t.watchers))}
	for w := range t.watchers {
		pm.Watchers = append(pm.Watchers, w.presenceLocked())
	}
	sortWatchers(pm.Watchers)
	b, _ := json.Marshal(pm) // plain strings and times always encode.
	return b
}

// sendPresenceLocked sends a presence frame to the local WebSocket watchers
// if the merged list of watchers changed since the last one.
func (t *topic) sendPresenceLocked(s *Server) {
	var all []session.Watcher
	for w := range t.watchers {
		all = append(all, w.presenceLocked())
	}
	for _, rp := range t.remote {
		all = append(all, rp.watchers...)
	}
	sortWatchers(all)
	if all == nil {
		all = []session.Watcher{}
	}
	frame, _ := json.Marshal(session.PresenceFrame{Type: session.FramePresence, Watchers: all})
	if bytes.Equal(frame, t.presence) {
		return
	}
	t.presence = frame
	t.broadcastLocked(s, out{frame: frame}, false)
}

// presenceLocked returns w as presence lists it; the topic's mu is held.
func (w *watcher) presenceLocked() session.Watcher {
	return session.Watcher{User: w.user, Conn: w.conn, Since: w.since, Typing: !w.typing.IsZero()}
}

// setTyping marks w, a watcher of session id, as typing until until (the
// zero time: not typing). Only a change between typing and not is sent as
// presence, so a client repeating its typing frame costs no frames.
func (h *hub) setTyping(id session.ID, w *watcher, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[id]
	if t == nil {
		return
	}
	t.mu.Lock()
	_, ok := t.watchers[w]
	changed := ok && w.typing.IsZero() != until.IsZero()
	if ok {
		w.typing = until
		if changed {
			t.publish = true
		}
		if !until.IsZero() {
			h.typing[t] = struct{}{}
		}
	}
	t.mu.Unlock()
	if changed {
		h.dirty[t] = struct{}{}
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
}

// expireTyping ends the typing of watchers whose typing frame is older than
// the typing TTL.
func (h *hub) expireTyping(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kick := false
	for t := range h.typing {
		t.mu.Lock()
		left, changed := false, false
		for w := range t.watchers {
			switch {
			case w.typing.IsZero():
			case !now.Before(w.typing):
				w.typing = time.Time{}
				changed = true
			default:
				left = true
			}
		}
		if changed {
			t.publish = true
		}
		t.mu.Unlock()
		if !left {
			delete(h.typing, t)
		}
		if changed {
			h.dirty[t] = struct{}{}
			kick = true
		}
	}
	if kick {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
}

func sortWatchers(ws []session.Watcher) {
	slices.SortFunc(ws, func(a, b session.Watcher) int {
		if c := a.Since.Compare(b.Since.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Conn, b.Conn)
	})
}

// publishPresence publishes a presence message. Presence is best effort: a
// lost message is repaired by the next refresh.
func (s *Server) publishPresence(id session.ID, msg []byte) {
	if err := s.nc.Publish(s.subj.Presence(id), msg); err != nil {
		s.log.Debug("publish presence", "session", string(id), "err", err)
	}
}
