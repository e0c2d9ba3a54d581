package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
)

// dialBatch opens a WebSocket offering atrium.v1+batch before atrium.v1, as
// the Go client and the web UI do.
func (e *env) dialBatch(id session.ID, user string, after session.Seq) *wsClient {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, wsURL(e.srv.URL, id, after), &websocket.DialOptions{
		HTTPHeader:   http.Header{"Authorization": {"Bearer dev:" + user}},
		Subprotocols: []string{session.SubprotocolBatch, session.Subprotocol},
	})
	if err != nil {
		e.t.Fatalf("dial: %v (%v)", err, resp)
	}
	if c.Subprotocol() != session.SubprotocolBatch {
		e.t.Fatalf("subprotocol %q, want %s", c.Subprotocol(), session.SubprotocolBatch)
	}
	c.SetReadLimit(-1)
	return readWS(e.t, c)
}

// batchedEvents reads frames until it has n events, and returns the events
// and the type of the frame each came in.
func (w *wsClient) batchedEvents(n int) (evs [][]byte, types []string) {
	w.t.Helper()
	for len(evs) < n {
		raw := w.nextRaw()
		var f struct {
			Type   string            `json:"type"`
			Event  json.RawMessage   `json:"event"`
			Events []json.RawMessage `json:"events"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			w.t.Fatalf("bad frame %s", raw)
		}
		switch f.Type {
		case session.FrameEvent:
			evs = append(evs, f.Event)
			types = append(types, f.Type)
		case session.FrameEvents:
			if len(f.Events) == 0 {
				w.t.Fatalf("empty events frame %s", raw)
			}
			for _, ev := range f.Events {
				evs = append(evs, ev)
				types = append(types, f.Type)
			}
		case session.FramePresence:
		default:
			w.t.Fatalf("want event frames, got %s", raw)
		}
	}
	return evs, types
}

func TestWS_BatchedHistory(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "batch")
	const n = 2500 // several history pages, several 64 KiB frames
	for range n - 1 {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "history line of some length to fill frames"})
	}
	c := e.dialBatch(s.ID, "alice", 10)
	if h := c.nextOf(session.FrameHello); h["last_seq"] != float64(n) {
		t.Fatalf("hello %v", h)
	}
	evs, types := c.batchedEvents(n - 10)
	checkSeqs(t, evs, 11, n)
	for i, typ := range types {
		if typ != session.FrameEvents {
			t.Fatalf("history event %d came in a %s frame", i+11, typ)
		}
	}

	// Live events come one to a frame; a gap is refetched as a batch.
	e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "live"})
	evs, types = c.batchedEvents(1)
	checkSeqs(t, evs, n+1, n+1)
	if types[0] != session.FrameEvent {
		t.Fatalf("live event came in a %s frame", types[0])
	}
	e.node.DropNext(3)
	for range 4 {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "x"})
	}
	evs, types = c.batchedEvents(4)
	checkSeqs(t, evs, n+2, n+5)
	if types[0] != session.FrameEvents {
		t.Fatalf("gap refetched in %v frames, want events", types)
	}

	// A client offering only atrium.v1 gets one event per frame.
	old := e.dial(s.ID, "alice", session.Seq(n))
	old.nextOf(session.FrameHello)
	checkSeqs(t, old.events(5), n+1, n+5)
}
