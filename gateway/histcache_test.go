package gateway

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

func cacheEvent(seq session.Seq, epoch string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"seq":%d,"epoch":"%s","time":"2026-11-26T00:00:00Z","kind":"output","by":"system","data":{"text":"x"}}`, seq, epoch))
}

func cacheEvents(from, to session.Seq, epoch string) []json.RawMessage {
	var evs []json.RawMessage
	for seq := from; seq <= to; seq++ {
		evs = append(evs, cacheEvent(seq, epoch))
	}
	return evs
}

// checkRun fails unless evs are the events from..to.
func checkRun(t *testing.T, evs []json.RawMessage, from, to session.Seq) {
	t.Helper()
	if len(evs) != int(to-from+1) {
		t.Fatalf("%d events, want %d..%d", len(evs), from, to)
	}
	for i, ev := range evs {
		if seq, _, ok := scanEventHead(ev); !ok || seq != from+session.Seq(i) {
			t.Fatalf("event %d is %s, want seq %d", i, ev, from+session.Seq(i))
		}
	}
}

func TestHistCache(t *testing.T) {
	const id, other = session.ID("s1"), session.ID("s2")
	t.Run("pages and live events make one run", func(t *testing.T) {
		c := newHistCache(1 << 20)
		c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
		c.addPage(id, "e1", 5, cacheEvents(5, 20, "e1")) // overlaps: only 11..20 added
		c.addLive(id, 21, cacheEvent(21, "e1"))
		c.addLive(id, 23, cacheEvent(23, "e1")) // after a gap: not cached
		checkRun(t, c.since(id, "e1", 0), 1, 21)
		checkRun(t, c.since(id, "e1", 15), 16, 21)
		if !holds(c, id, 0) || !holds(c, id, 20) || holds(c, id, 21) {
			t.Fatal("holds disagrees with the run 1..21")
		}
		if evs := c.since(id, "e1", 21); evs != nil {
			t.Fatalf("after the run: %d events", len(evs))
		}
		c.addPage(id, "e1", 22, cacheEvents(22, 23, "e1")) // the gap refetched
		c.addLive(id, 24, cacheEvent(24, "e1"))
		checkRun(t, c.since(id, "e1", 0), 1, 24)
	})
	t.Run("another epoch is never served and replaces the run", func(t *testing.T) {
		c := newHistCache(1 << 20)
		c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
		if evs := c.since(id, "e2", 0); evs != nil {
			t.Fatal("served a run of another epoch")
		}
		c.addLive(id, 11, cacheEvent(11, "e2"))
		if holds(c, id, 0) || c.bytes != 0 {
			t.Fatalf("a live event of another epoch left the run (%d bytes)", c.bytes)
		}
		c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
		c.addPage(id, "e2", 1, cacheEvents(1, 3, "e2"))
		checkRun(t, c.since(id, "e2", 0), 1, 3)
	})
	t.Run("a page beyond the run starts a new one", func(t *testing.T) {
		c := newHistCache(1 << 20)
		c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
		c.addPage(id, "e1", 50, cacheEvents(50, 60, "e1"))
		if holds(c, id, 5) {
			t.Fatal("kept the old run")
		}
		checkRun(t, c.since(id, "e1", 49), 50, 60)
	})
	t.Run("deleted session", func(t *testing.T) {
		c := newHistCache(1 << 20)
		c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
		c.drop(id)
		if holds(c, id, 0) || c.bytes != 0 || c.since(id, "e1", 0) != nil {
			t.Fatal("run of a deleted session kept")
		}
	})
	t.Run("a run keeps a quarter of the cache, its latest events", func(t *testing.T) {
		size := len(cacheEvent(100, "e1")) + histCacheEventBytes
		c := newHistCache(400 * size) // a run keeps at most 100 events
		for seq := session.Seq(1); seq <= 1000; seq++ {
			c.addPage(id, "e1", seq, []json.RawMessage{cacheEvent(seq, "e1")})
			if c.bytes > c.max/4 {
				t.Fatalf("run of %d bytes, limit %d", c.bytes, c.max/4)
			}
		}
		evs := c.since(id, "e1", c.runs[id].first-1)
		if len(evs) < 50 {
			t.Fatalf("kept %d events", len(evs))
		}
		checkRun(t, evs, 1001-session.Seq(len(evs)), 1000)
	})
	t.Run("the least recently used run goes first", func(t *testing.T) {
		size := len(cacheEvent(10, "e1")) + histCacheEventBytes
		c := newHistCache(100 * size)
		c.addPage(other, "e1", 1, cacheEvents(1, 20, "e1"))
		c.addPage("s3", "e1", 1, cacheEvents(1, 20, "e1"))
		c.runs[other].used = time.Now().Add(-time.Minute)
		c.since("s3", "e1", 0)
		for i := range 5 {
			sid := session.ID(fmt.Sprint("n", i))
			c.addPage(sid, "e1", 1, cacheEvents(1, 20, "e1"))
			if c.bytes > c.max {
				t.Fatalf("cache of %d bytes, limit %d", c.bytes, c.max)
			}
		}
		if holds(c, other, 0) {
			t.Fatal("the least recently used run was kept")
		}
	})
	t.Run("idle runs expire", func(t *testing.T) {
		c := newHistCache(1 << 20)
		c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
		c.addPage(other, "e1", 1, cacheEvents(1, 10, "e1"))
		c.runs[other].used = time.Now().Add(-histCacheIdle - time.Second)
		c.expire(time.Now())
		if !holds(c, id, 0) || holds(c, other, 0) {
			t.Fatal("expiry kept the idle run or dropped the used one")
		}
	})
	t.Run("off", func(t *testing.T) {
		c := newHistCache(0)
		c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
		if holds(c, id, 0) || c.since(id, "e1", 0) != nil {
			t.Fatal("a cache of size 0 kept events")
		}
	})
}

// holds reports whether c has the event after seq after of id.
func holds(c *histCache, id session.ID, after session.Seq) bool {
	_, _, _, ok := c.probe(id, after)
	return ok
}

// TestHistCache_Disagreement: a page or a live event that the run holds with
// other bytes (the owner dropped an uncaptured tail and wrote other events
// with its seqs) drops the run; one that agrees changes nothing.
func TestHistCache_Disagreement(t *testing.T) {
	const id = session.ID("s1")
	other := func(seq session.Seq) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"seq":%d,"epoch":"e1","time":"2026-11-26T00:00:01Z","kind":"output","by":"system","data":{"text":"y"}}`, seq))
	}
	c := newHistCache(1 << 20)
	c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
	c.addPage(id, "e1", 5, cacheEvents(5, 10, "e1")) // agrees
	c.addLive(id, 7, cacheEvent(7, "e1"))            // a duplicate that agrees
	c.addLive(id, 11, cacheEvent(11, "e1"))
	if seq, raw, epoch, ok := c.probe(id, 0); !ok || seq != 10 || string(raw) != string(cacheEvent(10, "e1")) || epoch != "e1" {
		t.Fatalf("probe: %d %s %q %v, want the newest page event, 10", seq, raw, epoch, ok)
	}
	c.addLive(id, 9, other(9))
	if holds(c, id, 0) || c.bytes != 0 {
		t.Fatal("a live event that disagrees left the run")
	}
	c.addPage(id, "e1", 1, cacheEvents(1, 10, "e1"))
	c.addPage(id, "e1", 8, []json.RawMessage{cacheEvent(8, "e1"), other(9), other(10), other(11)})
	checkRun(t, c.since(id, "e1", 7), 8, 11)
	if holds(c, id, 3) {
		t.Fatal("a page that disagrees did not start a new run")
	}
	if evs := c.since(id, "e1", 8); string(evs[0]) != string(other(9)) {
		t.Fatalf("event 9 is %s", evs[0])
	}
}
