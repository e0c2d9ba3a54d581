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

// TestDeltaBuffer_Burst: 2,000 deltas of one message arriving at once make
// one frame per deltaFlushBytes of text, whose concatenation is the text.
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
		got := f.all()
		if len(got) != want.Len()/deltaFlushBytes {
			t.Fatalf("%d frames before the timer for %d bytes, want %d (one per %d bytes)", len(got), want.Len(), want.Len()/deltaFlushBytes, deltaFlushBytes)
		}
		time.Sleep(deltaFlushEvery)
		synctest.Wait()
		got = f.all()
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
		if len(got) > want.Len()/deltaFlushBytes+1 {
			t.Fatalf("%d frames for %d bytes", len(got), want.Len())
		}
		b.close()
	})
}

// TestDeltaBuffer_Boundaries: another message's delta, flush and the timer
// each send the pending text; after close deltas pass through.
func TestDeltaBuffer_Boundaries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &frames{}
		b := newDeltaBuffer(f.publish)
		b.add(delta("m1", "a"))
		b.add(delta("m1", "b"))
		b.add(delta("m2", "c")) // sends "ab"
		if got := f.all(); len(got) != 1 || got[0].Text != "ab" || got[0].MessageID != "m1" {
			t.Fatalf("after a new message: %+v", got)
		}
		b.flush() // sends "c"
		if got := f.all(); len(got) != 2 || got[1].Text != "c" || got[1].MessageID != "m2" {
			t.Fatalf("after flush: %+v", got)
		}
		b.add(delta("m2", "d"))
		time.Sleep(deltaFlushEvery - time.Millisecond)
		synctest.Wait()
		if got := f.all(); len(got) != 2 {
			t.Fatalf("sent before deltaFlushEvery: %+v", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := f.all(); len(got) != 3 || got[2].Text != "d" {
			t.Fatalf("after deltaFlushEvery: %+v", got)
		}
		b.add(delta("m2", ""))
		b.add(delta("m2", "e"))
		b.close() // sends "e"
		b.add(delta("m2", "f"))
		got := f.all()
		if len(got) != 5 || got[3].Text != "e" || got[4].Text != "f" {
			t.Fatalf("after close: %+v", got)
		}
	})
}
