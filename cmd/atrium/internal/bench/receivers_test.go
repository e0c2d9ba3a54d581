package bench

import (
	"os"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

const wireTime = "2026-11-26T01:00:00.000000000Z"

func newTestSink() *sink {
	s := &sink{}
	s.hist.Store(NewHistogram())
	return s
}

func TestReceiver_EventsFrame(t *testing.T) {
	s, rc := newTestSink(), &receiver{}
	rc.last.Store(6)
	ev := func(seq string) string {
		return `{"seq":` + seq + `,"epoch":"e","time":"` + wireTime + `","kind":"message","by":"u","data":{"text":"a}\"{"}}`
	}
	rc.onFrame(s, []byte(session.EventsFrameHead+ev("7")+","+ev("8")+","+ev("9")+session.EventsFrameTail))
	if d, g, l := s.delivered.Load(), s.gaps.Load(), rc.last.Load(); d != 3 || g != 0 || l != 9 {
		t.Fatalf("delivered %d gaps %d last %d, want 3 0 9", d, g, l)
	}
	rc.onFrame(s, []byte(session.EventsFrameHead+ev("11")+session.EventsFrameTail))
	if g := s.gaps.Load(); g != 1 {
		t.Fatalf("gaps %d after seq 11 following 9, want 1", g)
	}
	rc.onFrame(s, []byte(session.EventsFrameHead+`{"seq":12`))
	if g, d := s.gaps.Load(), s.delivered.Load(); g != 2 || d != 4 {
		t.Fatalf("a cut frame: gaps %d delivered %d, want 2 4", g, d)
	}
}

func TestReceiver_Centrifugo(t *testing.T) {
	s, rc := newTestSink(), &receiver{}
	pub := func(off string) string {
		return `{"push":{"channel":"c","pub":{"data":{"seq":0,"time":"` + wireTime + `","kind":"message"},"offset":` + off + `}}}`
	}
	pongs := 0
	rc.onCentrifugo(s, []byte(pub("1")+"\n"+"{}"+"\n"+pub("2")+"\n"+`{"id":3,"rpc":{}}`), func() { pongs++ })
	if d, g, l := s.delivered.Load(), s.gaps.Load(), rc.last.Load(); d != 2 || g != 0 || l != 2 || pongs != 1 {
		t.Fatalf("delivered %d gaps %d last %d pongs %d, want 2 0 2 1", d, g, l, pongs)
	}
	rc.onCentrifugo(s, []byte(pub("4")), func() { pongs++ })
	if g := s.gaps.Load(); g != 1 {
		t.Fatalf("gaps %d after offset 4 following 2, want 1", g)
	}
	rc.onCentrifugo(s, []byte(`{"push":{"channel":"c","pub":{"data":{}}}}`), func() {})
	if g := s.gaps.Load(); g != 2 {
		t.Fatalf("a publication without offset: gaps %d, want 2", g)
	}
}

func TestPidCPU(t *testing.T) {
	// Burn some CPU so that at least one clock tick is counted.
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	if got := pidCPU(os.Getpid()); got <= 0 {
		t.Fatalf("pidCPU(self) = %s, want > 0", got)
	}
	if got := pidCPU(-1); got != 0 {
		t.Fatalf("pidCPU(-1) = %s, want 0", got)
	}
}
