package actor

import (
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Bounds of delta coalescing.
const (
	// deltaFlushEvery is the window in which consecutive deltas of one
	// message are gathered into one frame: watchers get about one frame
	// this often during a burst (a 2,000-chunk burst would otherwise
	// overflow a watcher's 1,024-frame queue and close it as a slow
	// consumer).
	deltaFlushEvery = 10 * time.Millisecond
	// deltaFlushBytes sends the gathered text once it is this long.
	deltaFlushBytes = 16 << 10
)

// deltaBuffer coalesces the delta frames of an agent turn. A delta that
// comes when none was sent for deltaFlushEvery goes out at once (the first
// token is not delayed) and opens a window; the deltas of one message that
// come within it are gathered into one frame, sent when the window ends
// (and a new one opens), when deltaFlushBytes accumulate, when another
// message's delta comes, or at flush (before each event of the turn, so a
// watcher gets a message's text before the agent_message, and at the end
// of the turn). A burst thus reaches watchers as about one frame per
// deltaFlushEvery. Deltas stay live text only: the durable agent_message
// is unchanged.
type deltaBuffer struct {
	publish func(session.DeltaFrame)
	every   time.Duration

	mu      sync.Mutex
	turn    int64           // guarded by mu: of the pending text
	message string          // guarded by mu: of the pending text
	text    strings.Builder // guarded by mu: pending text; empty when nothing is pending
	timer   *time.Timer     // guarded by mu: ends the window; nil when no window is open
	gen     uint64          // guarded by mu: the timer's generation
	closed  bool            // guarded by mu
}

func newDeltaBuffer(publish func(session.DeltaFrame)) *deltaBuffer {
	return &deltaBuffer{publish: publish, every: deltaFlushEvery}
}

// add sends d, or gathers it while a window is open.
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
		b.sendLocked()
	}
	if b.timer == nil {
		// Quiet until now: at once, and a window opens.
		d.Type = session.FrameDelta
		b.publish(d)
		b.openLocked()
		return
	}
	b.turn, b.message = d.Turn, d.MessageID
	b.text.WriteString(d.Text)
	if b.text.Len() >= deltaFlushBytes {
		b.sendLocked()
	}
}

// openLocked opens a window of b.every.
func (b *deltaBuffer) openLocked() {
	b.gen++
	gen := b.gen
	b.timer = time.AfterFunc(b.every, func() { b.fire(gen) })
}

// fire ends the window of generation gen: the text gathered in it is sent
// and a new window opens; with nothing gathered, none does.
func (b *deltaBuffer) fire(gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen != b.gen || b.timer == nil {
		return
	}
	b.timer = nil
	if b.text.Len() > 0 && !b.closed {
		b.sendLocked()
		b.openLocked()
	}
}

// flush sends the pending text now (the window stays open).
func (b *deltaBuffer) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sendLocked()
}

// close sends the pending text; later deltas are sent as they come.
func (b *deltaBuffer) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sendLocked()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
		b.gen++
	}
	b.closed = true
}

// sendLocked publishes the pending text as one frame.
func (b *deltaBuffer) sendLocked() {
	if b.text.Len() == 0 {
		return
	}
	d := session.DeltaFrame{Type: session.FrameDelta, Turn: b.turn, MessageID: b.message, Text: b.text.String()}
	b.text.Reset()
	b.publish(d)
}
