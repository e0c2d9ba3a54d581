package gateway_test

import (
	"bytes"
	"testing"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
)

// historyLimits returns the limits of the history commands the node got
// since it had got skip of them.
func (e *env) historyLimits(skip int) []int {
	var out []int
	for _, c := range e.node.commands(session.OpHistory)[skip:] {
		out = append(out, c.Limit)
	}
	return out
}

// TestWS_ResumeFromCache: a resume reads from the node only one event (the
// answer that authorises it and says where the log ends); the rest comes
// from the gateway's cache, filled by the pages an earlier resume read and
// by live events, with the node's bytes, gap-free. A gap in the live stream
// stops the cache growing until a page fills it; a viewer removed from the
// session is refused by the node before anything cached is sent.
func TestWS_ResumeFromCache(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "cache")
	const n = 2500 // three pages
	for range n - 1 {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "history line"})
	}
	first := e.dialBatch(s.ID, "alice", 0)
	first.nextOf(session.FrameHello)
	evs, _ := first.batchedEvents(n)
	checkSeqs(t, evs, 1, n)
	if got := e.historyLimits(0); len(got) != 3 || got[0] == 1 {
		t.Fatalf("first resume read history with limits %v, want 3 full pages", got)
	}
	// Live events extend the cache while someone watches.
	for range 5 {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "live"})
	}
	evs, _ = first.batchedEvents(5)
	checkSeqs(t, evs, n+1, n+5)

	for _, tc := range []struct {
		name  string
		after session.Seq
		batch bool
	}{{"batch from 0", 0, true}, {"v1 from 10", 10, false}, {"batch from the live part", n + 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			skip := len(e.node.commands(session.OpHistory))
			var c *wsClient
			if tc.batch {
				c = e.dialBatch(s.ID, "alice", tc.after)
			} else {
				c = e.dial(s.ID, "alice", tc.after)
			}
			defer func() { _ = c.c.Close(websocket.StatusNormalClosure, "") }()
			if h := c.nextOf(session.FrameHello); h["last_seq"] != float64(n+5) {
				t.Fatalf("hello %v", h)
			}
			var evs [][]byte
			if tc.batch {
				evs, _ = c.batchedEvents(int(n + 5 - tc.after))
			} else {
				evs = c.events(int(n + 5 - tc.after))
			}
			checkSeqs(t, evs, tc.after+1, n+5)
			committed := e.node.Events(s.ID)
			for i, ev := range evs {
				if !bytes.Equal(ev, committed[int(tc.after)+i]) {
					t.Fatalf("event %d differs from the node's:\n%s\n%s", int(tc.after)+i+1, ev, committed[int(tc.after)+i])
				}
			}
			if got := e.historyLimits(skip); len(got) != 1 || got[0] != 1 {
				t.Fatalf("resume from the cache read history with limits %v, want one of 1", got)
			}
		})
	}

	// Two events lost by NATS: the cache stops at n+5, and a resume reads
	// the rest from the node.
	e.node.DropNext(2)
	for range 4 {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "after a gap"})
	}
	evs, _ = first.batchedEvents(4) // the gap is refetched (and cached)
	checkSeqs(t, evs, n+6, n+9)
	skip := len(e.node.commands(session.OpHistory))
	c := e.dialBatch(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	evs, _ = c.batchedEvents(n + 9)
	checkSeqs(t, evs, 1, n+9)
	if got := e.historyLimits(skip); len(got) != 1 || got[0] != 1 {
		t.Fatalf("resume after a refetched gap read history with limits %v, want one of 1", got)
	}

	// The node decides who may read: bob, a viewer until removed, is sent
	// nothing once removed.
	e.member(s.ID, "alice", "bob", session.RoleViewer)
	b := e.dialBatch(s.ID, "bob", 0)
	b.nextOf(session.FrameHello)
	b.batchedEvents(n + 9)
	_ = b.c.Close(websocket.StatusNormalClosure, "")
	e.member(s.ID, "alice", "bob", session.RoleNone)
	conn, resp, err := dialRaw(t, e.srv.URL, s.ID, "bob", 0, nil)
	if err == nil { // the catalog had not caught up: the node refuses.
		if f := readWS(t, conn).next(); f["type"] != session.FrameError {
			t.Fatalf("removed viewer was sent %v", f)
		}
	} else if resp == nil || resp.StatusCode != 404 && resp.StatusCode != 403 {
		t.Fatalf("removed viewer's resume: %v %v", resp, err)
	}
}

// TestWS_ResumeCacheOff: with the cache off every resume reads full pages.
func TestWS_ResumeCacheOff(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.HistoryCacheBytes = -1 })
	s := e.create("alice", "no cache")
	for range 1500 {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "x"})
	}
	for range 2 {
		skip := len(e.node.commands(session.OpHistory))
		c := e.dialBatch(s.ID, "alice", 0)
		c.nextOf(session.FrameHello)
		evs, _ := c.batchedEvents(1501)
		checkSeqs(t, evs, 1, 1501)
		if got := e.historyLimits(skip); len(got) != 2 || got[0] == 1 || got[1] == 1 {
			t.Fatalf("history limits %v, want two full pages", got)
		}
		_ = c.c.Close(websocket.StatusNormalClosure, "")
	}
}

// BenchmarkResume replays 10,000 events to a new atrium.v1+batch WebSocket
// (after=0), with the gateway's history cache and without it (every page
// from the node, here the fake node's memory).
func BenchmarkResume(b *testing.B) {
	for _, bc := range []struct {
		name  string
		cache int
	}{{"cache", 0}, {"no_cache", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			e := newEnv(b, func(c *gateway.Config) { c.HistoryCacheBytes = bc.cache })
			s := e.create("alice", "bench resume")
			const n = 10_000
			for range n - 1 {
				e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "a line of output of some length"})
			}
			c := e.dialBatch(s.ID, "alice", 0) // fills the cache
			c.nextOf(session.FrameHello)
			c.batchedEvents(n)
			_ = c.c.Close(websocket.StatusNormalClosure, "")
			b.ResetTimer()
			for b.Loop() {
				c := e.dialBatch(s.ID, "alice", 0)
				c.nextOf(session.FrameHello)
				if evs, _ := c.batchedEvents(n); len(evs) != n {
					b.Fatalf("%d events", len(evs))
				}
				_ = c.c.Close(websocket.StatusNormalClosure, "")
			}
		})
	}
}

// rewriteTail makes the fake node forget id's events after keep and commit
// add other events after them, unpublished: what the next owner does with a
// tail that was never captured (actor/takeover.go).
func (e *env) rewriteTail(id session.ID, keep session.Seq, add int) {
	n := e.node
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.sessions[id]
	s.events = s.events[:keep]
	s.entry.LastSeq = keep
	n.drop = add
	for range add {
		n.appendLocked(s, session.KindOutput, session.BySystem, session.OutputData{Turn: 1, Stream: "stdout", Text: "written again"})
	}
}

// TestWS_ResumeCacheStaleTail: a cached run whose last events the owner no
// longer has (dropped, or written again with other bytes) is never sent; the
// resume reads the owner's history instead.
func TestWS_ResumeCacheStaleTail(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "stale")
	for range 1499 {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "first writing"})
	}
	resume := func(t *testing.T, last session.Seq) {
		t.Helper()
		c := e.dialBatch(s.ID, "alice", 0)
		defer func() { _ = c.c.Close(websocket.StatusNormalClosure, "") }()
		if h := c.nextOf(session.FrameHello); h["last_seq"] != float64(last) {
			t.Fatalf("hello %v, want last_seq %d", h, last)
		}
		evs, _ := c.batchedEvents(int(last))
		committed := e.node.Events(s.ID)
		for i, ev := range evs {
			if !bytes.Equal(ev, committed[i]) {
				t.Fatalf("event %d is not the node's:\n%s\n%s", i+1, ev, committed[i])
			}
		}
	}
	resume(t, 1500) // fills the cache
	t.Run("written again, then live events", func(t *testing.T) {
		// The next owner's own live events of the rewritten seqs were
		// lost: the run learns only of the ones after, which follow it.
		e.rewriteTail(s.ID, 1450, 50)
		w := e.dialBatch(s.ID, "alice", 1500)
		w.nextOf(session.FrameHello)
		for range 5 {
			e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "live after"})
		}
		evs, _ := w.batchedEvents(5) // the hub has cached them by now
		checkSeqs(t, evs, 1501, 1505)
		_ = w.c.Close(websocket.StatusNormalClosure, "")
		resume(t, 1505)
	})
	for _, tc := range []struct {
		name      string
		keep      session.Seq
		add, last int
	}{{"written again", 1400, 100, 1500}, {"dropped", 1450, 0, 1450}, {"dropped and more written", 1300, 300, 1600}} {
		t.Run(tc.name, func(t *testing.T) {
			resume(t, session.Seq(len(e.node.Events(s.ID)))) // the run ends where the log does
			e.rewriteTail(s.ID, tc.keep, tc.add)
			resume(t, session.Seq(tc.last))
		})
	}
}
