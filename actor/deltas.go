package actor

import (
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Bounds of delta coalescing.
const (
	// deltaFlushEvery is how long consecutive deltas of one message are
	// gathered into one frame: watchers get at most about one frame per
	// message this often (a 2,000-chunk burst would otherwise overflow a
	// watcher's 1,024-frame queue and close it as a slow consumer).
	deltaFlushEvery = 10 * time.Millisecond
	// deltaFlushBytes sends the gathered text once it is this long.
	deltaFlushBytes = 16 << 10
)

// deltaBuffer coalesces the delta frames of an agent turn: consecutive
// deltas of one message become one frame, sent deltaFlushEvery after the
// first of them, when deltaFlushBytes accumulate, when another message's
// delta comes, or at flush (before each event of the turn, so a watcher
// gets a message's text before the agent_message, and at the end of the
// turn). Deltas stay live text only: the durable agent_message is
// unchanged.
type deltaBuffer struct {
	publish func(session.DeltaFrame)
	every   time.Duration

	mu      sync.Mutex
	turn    int64           // guarded by mu: of the pending text
	message string          // guarded by mu: of the pending text
	text    strings.Builder // guarded by mu: pending text; empty when nothing is pending
	timer   *time.Timer     // guarded by mu: sends the pending text; nil when none
	gen     uint64          // guarded by mu: the timer's generation
	closed  bool            // guarded by mu
}

func newDeltaBuffer(publish func(session.DeltaFrame)) *deltaBuffer {
	return &deltaBuffer{publish: publish, every: deltaFlushEvery}
}

// add gathers d.
func (b *deltaBuffer) add(d session.DeltaFrame) {
	if d.Text == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		b.publish(d)
		return
	}
	if b.text.Len() > 0 && (b.turn != d.Turn || b.message != d.MessageID) {
		b.flushLocked()
	}
	b.turn, b.message = d.Turn, d.MessageID
	b.text.WriteString(d.Text)
	if b.text.Len() >= deltaFlushBytes {
		b.flushLocked()
		return
	}
	if b.timer == nil {
		b.gen++
		gen := b.gen
		b.timer = time.AfterFunc(b.every, func() { b.fire(gen) })
	}
}

// fire sends the text gathered since the timer of generation gen started.
func (b *deltaBuffer) fire(gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen == b.gen && b.timer != nil {
		b.flushLocked()
	}
}

// flush sends the pending text now.
func (b *deltaBuffer) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

// close sends the pending text; later deltas are sent as they come.
func (b *deltaBuffer) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	b.closed = true
}

func (b *deltaBuffer) flushLocked() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
		b.gen++
	}
	if b.text.Len() == 0 {
		return
	}
	d := session.DeltaFrame{Type: session.FrameDelta, Turn: b.turn, MessageID: b.message, Text: b.text.String()}
	b.text.Reset()
	b.publish(d)
}
