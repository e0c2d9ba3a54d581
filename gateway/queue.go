package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
)

// event is one event of a session's log as the gateway handles it: the
// node's bytes, never re-encoded, and the few fields the gateway reads. Live
// events are parsed once per gateway and shared by every watcher.
type event struct {
	seq    session.Seq
	kind   session.Kind
	raw    json.RawMessage            // the event as the node encoded it
	frame  []byte                     // {"type":"event","event":raw}, when built
	wire   []byte                     // frame as a WebSocket text frame, header and all (frame is its tail)
	member *session.MemberChangedData // the data of a member_changed event
	recv   time.Time                  // when a live event arrived from NATS (fan-out lag)
}

// parseEvent reads an encoded event's seq and kind (and member change).
// withFrame also builds its WebSocket frame. The event is not validated:
// the node encodes it, and the gateway passes its bytes on.
func parseEvent(raw json.RawMessage, withFrame bool) (*event, error) {
	ev := new(event)
	if err := parseEventInto(ev, raw, withFrame); err != nil {
		return nil, err
	}
	return ev, nil
}

// parseEventInto is parseEvent into ev, which it overwrites.
func parseEventInto(ev *event, raw json.RawMessage, withFrame bool) error {
	seq, kind, ok := scanEventHead(raw)
	if !ok {
		var head struct {
			Seq  session.Seq  `json:"seq"`
			Kind session.Kind `json:"kind"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return fmt.Errorf("decode event: %w", err)
		}
		seq, kind = head.Seq, head.Kind
	}
	if seq <= 0 {
		return fmt.Errorf("decode event: seq %d is not positive", seq)
	}
	*ev = event{seq: seq, kind: kind, raw: raw}
	if kind == session.KindMemberChanged {
		var d struct {
			Data session.MemberChangedData `json:"data"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return fmt.Errorf("decode member_changed event %d: %w", seq, err)
		}
		ev.member = &d.Data
	}
	if withFrame {
		ev.buildFrame()
	}
	return nil
}

// scanEventHead reads seq and kind from the head of an event encoded as the
// node encodes events, {"seq":N,"epoch":"…","time":"…","kind":"…",…}, with
// no escapes in those strings, without decoding the rest (an event may be
// tens of kilobytes). It reports false for anything else, which is then
// decoded in full.
func scanEventHead(b []byte) (session.Seq, session.Kind, bool) {
	b, ok := bytes.CutPrefix(b, []byte(`{"seq":`))
	if !ok {
		return 0, "", false
	}
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	seq, ok := parseDigits(b[:i])
	if !ok {
		return 0, "", false
	}
	b = b[i:]
	var kind []byte
	for _, key := range []string{`,"epoch":"`, `,"time":"`, `,"kind":"`} {
		if b, ok = bytes.CutPrefix(b, []byte(key)); !ok {
			return 0, "", false
		}
		end := bytes.IndexByte(b, '"')
		if end < 0 || bytes.IndexByte(b[:end], '\\') >= 0 {
			return 0, "", false
		}
		kind, b = b[:end], b[end+1:]
	}
	if len(b) == 0 || b[0] != ',' && b[0] != '}' {
		return 0, "", false
	}
	return seq, internKind(kind), true
}

// internKind returns the kind named by b, without allocating for the kinds
// of the contract.
func internKind(b []byte) session.Kind {
	for _, k := range [...]session.Kind{ // most frequent first
		session.KindOutput, session.KindAgent, session.KindMessage, session.KindTurnStarted,
		session.KindTurnFinished, session.KindSandbox, session.KindApprovalRequested,
		session.KindApprovalResolved, session.KindSessionCreated, session.KindMemberChanged,
		session.KindPROpened, session.KindError,
	} {
		if string(b) == string(k) {
			return k
		}
	}
	return session.Kind(b)
}

func (ev *event) buildFrame() {
	ev.wire, ev.frame = appendTextFrame(len(ev.raw)+len(`{"type":"event","event":}`), func(b []byte) []byte {
		return session.AppendEventFrame(b, ev.raw)
	})
}

// out is one item of a connection's send queue: an event, or a complete
// frame (presence, ack, error, delta).
type out struct {
	ev    *event
	frame []byte
	// delta marks frame as a delta frame (streaming agent text), queued
	// when the hub had dispatched events up to after (0: none yet).
	delta bool
	after session.Seq
}

// ending says how and why a connection ends.
type ending struct {
	code   websocket.StatusCode // WebSocket close code; 0: just drop the connection
	reason string
	// drain delivers what is already queued before closing.
	drain bool
}

// queue is a connection's bounded send queue. Producers never block: push
// fails when limit items wait, and the producer then ends the connection as a
// slow consumer. The connection's single writer takes everything queued at
// once, and hands back the emptied slice when it is small (maxSpare), so an
// idle queue holds at most that.
type queue struct {
	wake chan struct{} // capacity 1: something was queued or the queue ended

	mu        sync.Mutex
	items     []out   // guarded by mu
	limit     int     // guarded by mu (set once)
	end       *ending // guarded by mu; set once
	heartbeat bool    // guarded by mu
}

func (q *queue) init(limit int) {
	q.wake = make(chan struct{}, 1)
	q.limit = limit
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// push queues o and wakes the writer. It returns false when the queue is
// full; it drops o and returns true when the queue has ended.
func (q *queue) push(o out) bool {
	if !q.add(o) {
		return false
	}
	q.signal()
	return true
}

// add is push without waking the writer: the caller signals later (a
// topic's paced broadcast, see topic.broadcastLocked).
func (q *queue) add(o out) bool {
	q.mu.Lock()
	if q.end != nil {
		q.mu.Unlock()
		return true
	}
	if len(q.items) >= q.limit {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, o)
	q.mu.Unlock()
	return true
}

// finish ends the queue with e unless it has ended already, and reports
// whether it did. Unless e.drain, what waits is dropped.
func (q *queue) finish(e ending) bool {
	q.mu.Lock()
	if q.end != nil {
		q.mu.Unlock()
		return false
	}
	q.end = &e
	if !e.drain {
		q.items = nil
	}
	q.mu.Unlock()
	q.signal()
	return true
}

// beat asks the writer for a heartbeat.
func (q *queue) beat() {
	q.mu.Lock()
	q.heartbeat = true
	q.mu.Unlock()
	q.signal()
}

// take returns everything queued, the ending if the queue has ended, and
// whether a heartbeat is due. spare, if not nil, is an empty slice that the
// queue fills next (see recycle), so that a busy queue does not allocate.
func (q *queue) take(spare []out) (items []out, end *ending, heartbeat bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	items, q.items = q.items, spare
	heartbeat, q.heartbeat = q.heartbeat, false
	return items, q.end, heartbeat
}

// maxSpare is the capacity of the largest slice handed back to a queue. An
// idle queue holds at most that much.
const maxSpare = 16

// recycle returns items, once written, emptied for the next take, or nil if
// it is too big to keep.
func recycle(items []out) []out {
	if cap(items) > maxSpare {
		return nil
	}
	clear(items) // drop the references to events and frames.
	return items[:0]
}

// ended reports whether the queue has ended.
func (q *queue) ended() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.end != nil
}
