package actor

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/atriumhq/atrium/session"
)

// frames records what a deltaBuffer publishes.
type frames struct {
	mu  sync.Mutex
	got []session.DeltaFrame
}

func (f *frames) publish(d session.DeltaFrame) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, d)
}

func (f *frames) all() []session.DeltaFrame {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]session.DeltaFrame(nil), f.got...)
}

func delta(msg, text string) session.DeltaFrame {
	return session.DeltaFrame{Type: session.FrameDelta, Turn: 1, MessageID: msg, Text: text}
}

// TestDeltaBuffer_Burst: of 2,000 deltas of one message arriving at once,
// the first goes out at once and the rest as one frame per deltaFlushBytes
// of text and one when the window ends; the frames concatenate to the text.
func TestDeltaBuffer_Burst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &frames{}
		b := newDeltaBuffer(f.publish)
		var want strings.Builder
		for i := range 2000 {
			s := fmt.Sprintf("word%d ", i)
			want.WriteString(s)
			b.add(delta("m1", s))
		}
		max := 2 + want.Len()/deltaFlushBytes
		if got := f.all(); len(got) < 1 || got[0].Text != "word0 " || len(got) > max {
			t.Fatalf("%d frames before the window ended (first %+v), want the first delta and at most %d", len(got), got[0], max)
		}
		time.Sleep(deltaFlushEvery)
		synctest.Wait()
		got := f.all()
		var text strings.Builder
		for _, d := range got {
			if d.MessageID != "m1" || d.Turn != 1 || d.Type != session.FrameDelta {
				t.Fatalf("frame %+v", d)
			}
			text.WriteString(d.Text)
		}
		if text.String() != want.String() {
			t.Fatalf("concatenated frames differ from the deltas: %d bytes, want %d", text.Len(), want.Len())
		}
		if len(got) > max {
			t.Fatalf("%d frames for %d bytes, want at most %d", len(got), want.Len(), max)
		}
		b.close()
	})
}

// TestDeltaBuffer_Boundaries: a delta after a quiet window goes out at
// once; within a window, another message's delta, flush and the window's
// end each send the gathered text; after close deltas pass through.
func TestDeltaBuffer_Boundaries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &frames{}
		b := newDeltaBuffer(f.publish)
		texts := func() string {
			var l []string
			for _, d := range f.all() {
				l = append(l, d.MessageID+":"+d.Text)
			}
			return strings.Join(l, " ")
		}
		b.add(delta("m1", "a")) // at once
		b.add(delta("m1", "b"))
		b.add(delta("m2", "c")) // sends "b"
		if got := texts(); got != "m1:a m1:b" {
			t.Fatalf("after a new message: %s", got)
		}
		b.flush() // sends "c"
		b.add(delta("m2", "d"))
		if got := texts(); got != "m1:a m1:b m2:c" {
			t.Fatalf("after flush: %s", got)
		}
		time.Sleep(deltaFlushEvery - time.Millisecond)
		synctest.Wait()
		if got := texts(); got != "m1:a m1:b m2:c" {
			t.Fatalf("sent before the window ended: %s", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := texts(); got != "m1:a m1:b m2:c m2:d" {
			t.Fatalf("after the window: %s", got)
		}
		time.Sleep(deltaFlushEvery) // a quiet window: none opens after it
		synctest.Wait()
		b.add(delta("m2", "e")) // at once
		b.add(delta("m2", ""))
		b.add(delta("m2", "f"))
		b.close() // sends "f"
		b.add(delta("m2", "g"))
		if got := texts(); got != "m1:a m1:b m2:c m2:d m2:e m2:f m2:g" {
			t.Fatalf("after close: %s", got)
		}
	})
}
