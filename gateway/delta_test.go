package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
)

// publishDelta publishes a delta frame as the session's node does, on the
// same connection as its events (so NATS keeps their order).
func (e *env) publishDelta(id session.ID, messageID, text string) []byte {
	e.t.Helper()
	b, err := json.Marshal(session.DeltaFrame{Type: session.FrameDelta, Turn: 1, MessageID: messageID, Text: text})
	if err != nil {
		e.t.Fatalf("encode delta: %v", err)
	}
	if err := e.node.nc.Publish(session.Subjects{}.Delta(id), b); err != nil {
		e.t.Fatalf("publish delta: %v", err)
	}
	return b
}

// liveWS dials id and reads until the connection is live: the hello, the
// history, and one event appended after the hello, which only a live
// connection's queue delivers. It returns the connection and the seq of
// that event.
func (e *env) liveWS(id session.ID, user string) (*wsClient, session.Seq) {
	e.t.Helper()
	c := e.dial(id, user, 0)
	hello := c.nextOf(session.FrameHello)
	last := session.Seq(hello["last_seq"].(float64))
	seq := e.node.Append(id, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "probe"})
	checkSeqs(e.t, c.events(int(seq)), 1, seq)
	if seq <= last {
		e.t.Fatalf("probe event %d is not after the hello's last_seq %d", seq, last)
	}
	return c, seq
}

func TestDelta_WebSocket(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "deltas")
	c, last := e.liveWS(s.ID, "alice")

	d1 := e.publishDelta(s.ID, "m1", "Hel")
	d2 := e.publishDelta(s.ID, "m1", "lo \"there\"\n")
	seq := e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "Hello"})
	d3 := e.publishDelta(s.ID, "m2", "next")

	want := []string{string(d1), string(d2), "event", string(d3)}
	for i, w := range want {
		raw := c.nextRaw()
		for strings.Contains(string(raw), `"type":"presence"`) {
			raw = c.nextRaw()
		}
		if w == "event" {
			var f session.EventFrame
			if err := json.Unmarshal(raw, &f); err != nil || f.Type != session.FrameEvent || seqOf(t, f.Event) != seq {
				t.Fatalf("frame %d: got %s, want event %d", i, raw, seq)
			}
			continue
		}
		if string(raw) != w {
			t.Fatalf("frame %d: got %s, want %s", i, raw, w)
		}
	}
	if seq != last+1 {
		t.Fatalf("event seq %d, want %d", seq, last+1)
	}

	// Deltas are not history: REST has none, and a client resuming from
	// the start gets events only, then the deltas published after it.
	code, body := e.call("GET", "/v1/sessions/"+string(s.ID)+"/events", "alice", nil)
	if code != 200 || strings.Contains(string(body), `"type":"delta"`) || strings.Contains(string(body), `"m1"`) {
		t.Fatalf("history %d %s", code, body)
	}
	r := e.dial(s.ID, "alice", 0)
	r.nextOf(session.FrameHello)
	checkSeqs(t, r.events(int(seq)), 1, seq) // events() fails on any other frame but presence.
	probe := e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "probe"})
	checkSeqs(t, r.events(1), probe, probe) // from r's queue: r is live now
	d4 := e.publishDelta(s.ID, "m2", "live")
	raw := r.nextRaw()
	for strings.Contains(string(raw), `"type":"presence"`) {
		raw = r.nextRaw()
	}
	if string(raw) != string(d4) {
		t.Fatalf("resumed client got %s, want %s", raw, d4)
	}
}

// nextBlock returns the next SSE event block (an event with or without an
// id), skipping comments.
func (c *sseClient) nextBlock() sseEvent {
	c.t.Helper()
	var ev sseEvent
	for {
		l, ok := c.line()
		if !ok {
			c.t.Fatal("stream ended")
		}
		switch {
		case l == "":
			if ev.kind != "" || ev.data != "" {
				return ev
			}
		case strings.HasPrefix(l, ":"):
		case strings.HasPrefix(l, "id: "):
			ev.id = l[4:]
		case strings.HasPrefix(l, "event: "):
			ev.kind = l[7:]
		case strings.HasPrefix(l, "data: "):
			ev.data += l[6:]
		default:
			c.t.Fatalf("unexpected SSE line %q", l)
		}
	}
}

func TestDelta_SSE(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "sse deltas")
	c := e.stream(s.ID, "alice", nil, "")
	if ev := c.nextBlock(); ev.id != "1" {
		t.Fatalf("first SSE event %+v", ev)
	}
	// An event appended now reaches the stream through its live queue,
	// so the stream is live once it arrives.
	probe := e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "probe"})
	if ev := c.nextBlock(); ev.id != strconv.FormatInt(probe, 10) {
		t.Fatalf("probe %+v", ev)
	}
	d1 := e.publishDelta(s.ID, "m1", "line one\nline two")
	seq := e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "x"})
	d2 := e.publishDelta(s.ID, "m1", "more")

	if ev := c.nextBlock(); ev.id != "" || ev.kind != session.FrameDelta || ev.data != string(d1) {
		t.Fatalf("first delta %+v, want data %s", ev, d1)
	}
	if ev := c.nextBlock(); ev.id != strconv.FormatInt(seq, 10) || ev.kind != string(session.KindOutput) {
		t.Fatalf("event %+v, want id %d", ev, seq)
	}
	if ev := c.nextBlock(); ev.id != "" || ev.kind != session.FrameDelta || ev.data != string(d2) {
		t.Fatalf("second delta %+v, want data %s", ev, d2)
	}

	// Resuming by Last-Event-ID: the events after it, no past deltas.
	r := e.stream(s.ID, "alice", http.Header{"Last-Event-ID": {"1"}}, "")
	for want := session.Seq(2); want <= seq; want++ {
		if ev := r.nextBlock(); ev.id != strconv.FormatInt(want, 10) {
			t.Fatalf("resumed stream: %+v, want id %d", ev, want)
		}
	}
}

// TestDelta_ResumeWhileStreaming resumes clients again and again while the
// node streams messages: deltas of message k, then its durable event. A
// client must never get a delta of a message whose event it has already
// received (that text is in the history it was given), and its events stay
// gap-free.
func TestDelta_ResumeWhileStreaming(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "deltas while resuming")
	var mu sync.Mutex
	msgSeq := map[session.Seq]int{} // seq of message k's event → k; guarded by mu
	// Each token makes the producer stream a burst of messages while a
	// client resumes and reads to the burst's end; done says it ended.
	tokens, done := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		k := 0
		for range tokens {
			for range 300 {
				k++
				id := "m" + strconv.Itoa(k)
				e.publishDelta(s.ID, id, "a")
				e.publishDelta(s.ID, id, "b")
				seq := e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: id})
				mu.Lock()
				msgSeq[seq] = k
				mu.Unlock()
			}
			done <- struct{}{}
		}
	})
	last := session.Seq(0)
	deltas := 0
	check := func(c *wsClient, upTo session.Seq) {
		t.Helper()
		seen := map[int]bool{} // messages whose event this client has received
		for last < upTo {
			raw := c.nextRaw()
			var f struct {
				Type      string          `json:"type"`
				Event     json.RawMessage `json:"event"`
				MessageID string          `json:"message_id"`
			}
			if err := json.Unmarshal(raw, &f); err != nil {
				t.Fatalf("bad frame %s", raw)
			}
			switch f.Type {
			case session.FrameEvent:
				seq := seqOf(t, f.Event)
				if seq != last+1 {
					t.Fatalf("event %d after %d", seq, last)
				}
				last = seq
				mu.Lock()
				k, ok := msgSeq[seq]
				mu.Unlock()
				if ok {
					seen[k] = true
				}
			case session.FrameDelta:
				deltas++
				k, _ := strconv.Atoi(strings.TrimPrefix(f.MessageID, "m"))
				if seen[k] {
					t.Fatalf("delta of message %d after its event", k)
				}
			case session.FramePresence:
			default:
				t.Fatalf("unexpected frame %s", raw)
			}
		}
	}
	for range 10 {
		tokens <- struct{}{}
		c := e.dial(s.ID, "alice", last)
		c.nextOf(session.FrameHello)
		check(c, last+50)
		<-done
		check(c, session.Seq(len(e.node.Events(s.ID))))
		_ = c.c.Close(websocket.StatusNormalClosure, "")
	}
	close(tokens)
	wg.Wait()
	// A client that has read an event appended after its hello is live
	// (that event came from its queue, not from history): a delta
	// published now reaches it, before the next event.
	c := e.dial(s.ID, "alice", last)
	hello := c.nextOf(session.FrameHello)
	if got := session.Seq(hello["last_seq"].(float64)); got != last {
		t.Fatalf("hello last_seq %d, want %d", got, last)
	}
	check(c, e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "probe"}))
	e.publishDelta(s.ID, "m0", "end")
	probe := e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "end"})
	before := deltas
	check(c, probe)
	if deltas != before+1 {
		t.Fatalf("live client got %d deltas before the last event, want 1", deltas-before)
	}
	t.Logf("%d deltas delivered", deltas)
}
