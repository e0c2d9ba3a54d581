package gateway_test

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestWS_LiveEventsCoalesced: live events that a batch client's writer
// takes from its queue together go out in one events frame (a live event
// alone still in its own event frame), in seq order, with no gap or
// duplicate; an atrium.v1 client watching the same bursts gets one event
// per frame.
func TestWS_LiveEventsCoalesced(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "live batch")
	b := e.dialBatch(s.ID, "alice", 1)
	b.nextOf(session.FrameHello)
	v1 := e.dial(s.ID, "alice", 1)
	v1.nextOf(session.FrameHello)

	// A lone live event: an event frame.
	e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "alone"})
	evs, types := b.batchedEvents(1)
	checkSeqs(t, evs, 2, 2)
	if types[0] != session.FrameEvent {
		t.Fatalf("a lone live event came in a %s frame", types[0])
	}
	checkSeqs(t, v1.events(1), 2, 2)

	// Bursts, until one reaches the writer faster than it writes (the
	// first usually does).
	next, coalesced := session.Seq(3), false
	for burst := 0; burst < 20 && !coalesced; burst++ {
		const n = 300
		for range n {
			e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "burst"})
		}
		evs, types := b.batchedEvents(n)
		checkSeqs(t, evs, next, next+n-1)
		for _, typ := range types {
			coalesced = coalesced || typ == session.FrameEvents
		}
		checkSeqs(t, v1.events(n), next, next+n-1)
		next += n
	}
	if !coalesced {
		t.Fatal("20 bursts of 300 live events, and never two in one events frame")
	}
}
