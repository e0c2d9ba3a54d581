package gateway

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// DefaultHistoryCacheBytes is the default size of a gateway's history
// cache (Config.HistoryCacheBytes).
const DefaultHistoryCacheBytes = 64 << 20

// History cache limits: one session's tail keeps at most a quarter of the
// cache, and a tail nobody read or extended for histCacheIdle is dropped.
const (
	histCacheIdle       = 5 * time.Minute
	histCacheEventBytes = 48 // bookkeeping counted per event beside its bytes
)

// histCache keeps, per session watched from this gateway, a contiguous run
// of its latest events: the node's bytes, as history pages and live events
// brought them. A watcher that resumes is sent what the cache holds after
// its resume point instead of reading those pages from the node again (the
// node still answers one small history request, which authorises the
// watcher and says where the log ends and its epoch).
//
// Published events never change, and a run of another epoch is dropped, and
// so is the run of a deleted session. But a history page may carry the
// log's last events before they are captured into the events stream, and
// should the node then lose its lease the next owner drops them and writes
// other events with those seqs (actor/takeover.go). So a run is checked
// before it is used: the owner is asked for the newest event a page brought
// into it, and unless it has the same bytes the run is dropped
// (feed.openCached); a page or a live event that disagrees with the run
// drops it too. A run grows
// only by the event right after its end: a live event that skips ahead
// (NATS dropped one) is not cached, and the run grows again when the feed
// refetches the gap.
type histCache struct {
	max int // bytes, all sessions; 0: off

	mu       sync.Mutex
	runs     map[session.ID]*histRun // guarded by mu
	bytes    int                     // guarded by mu: the size of every run
	lastTrim time.Time               // guarded by mu: when idle runs were dropped last
}

// histRun is the cached run of one session's events: events[i] has seq
// first+i. Its slices are only appended to (or replaced), so a slice of
// events handed out stays valid without the lock.
type histRun struct {
	epoch  string
	first  session.Seq
	events []json.RawMessage
	bytes  int
	used   time.Time // last read or extended
	// pageHi is the newest seq a history page brought into the run: live
	// events (after it) come from the events stream and are the owner's;
	// page events may not be, and pageHi is the one to check (see probe).
	pageHi session.Seq
}

func (r *histRun) next() session.Seq { return r.first + session.Seq(len(r.events)) }

func newHistCache(maxBytes int) *histCache {
	return &histCache{max: max(maxBytes, 0), runs: make(map[session.ID]*histRun)}
}

// probe returns the event of id's run to check against the owner before
// the run is used, its seq and the run's epoch, if the run holds the event
// after seq after: the newest event a history page brought (pageHi), or
// the run's last if the pages' events were trimmed away.
func (c *histCache) probe(id session.ID, after session.Seq) (seq session.Seq, raw json.RawMessage, epoch string, ok bool) {
	if c.max == 0 {
		return 0, nil, "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.runs[id]
	if r == nil || after < r.first-1 || after >= r.next()-1 {
		return 0, nil, "", false
	}
	seq = r.pageHi
	if seq < r.first || seq >= r.next() {
		seq = r.next() - 1
	}
	return seq, r.events[seq-r.first], r.epoch, true
}

// agrees reports whether the events first, first+1, … of evs that r holds
// too are the same bytes.
func (r *histRun) agrees(first session.Seq, evs []json.RawMessage) bool {
	for i, ev := range evs {
		seq := first + session.Seq(i)
		if seq < r.first {
			continue
		}
		if seq >= r.next() {
			break
		}
		if !bytes.Equal(r.events[seq-r.first], ev) {
			return false
		}
	}
	return true
}

// since returns the cached events of id in epoch after seq after: the
// first has seq after+1. The slice is shared: it must not be modified.
func (c *histCache) since(id session.ID, epoch string, after session.Seq) []json.RawMessage {
	if c.max == 0 || epoch == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.runs[id]
	if r == nil || r.epoch != epoch || after < r.first-1 || after >= r.next()-1 {
		return nil
	}
	r.used = time.Now()
	i := int(after - r.first + 1)
	return r.events[i:len(r.events):len(r.events)]
}

// addPage caches evs, the events first, first+1, … of id in epoch that a
// history page brought. A page after the cached run (or of another epoch)
// starts a new run: the latest events are the ones resumes read. So does a
// page that disagrees with the run about an event: the run holds events
// the owner no longer has (see feed.openCached).
func (c *histCache) addPage(id session.ID, epoch string, first session.Seq, evs []json.RawMessage) {
	if c.max == 0 || epoch == "" || len(evs) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.runs[id]
	last := first + session.Seq(len(evs)) - 1
	switch {
	case r == nil || r.epoch != epoch || first > r.next() || !r.agrees(first, evs):
		c.dropLocked(id)
		r = &histRun{epoch: epoch, first: first}
		c.runs[id] = r
	case last < r.next():
		r.used = time.Now()
		return // cached already
	}
	r.pageHi = max(r.pageHi, last)
	c.appendLocked(id, r, evs[r.next()-first:])
}

// addLive caches a live event of id, raw with seq seq, if it is the one
// right after the cached run. An event of another epoch, or one that the
// run holds with other bytes, drops the run.
func (c *histCache) addLive(id session.ID, seq session.Seq, raw json.RawMessage) {
	if c.max == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.runs[id]
	if r == nil {
		return
	}
	epoch, ok := scanEventEpoch(raw)
	if !ok || string(epoch) != r.epoch {
		c.dropLocked(id)
		return
	}
	switch {
	case seq == r.next():
		c.appendLocked(id, r, []json.RawMessage{raw})
	case seq >= r.first && seq < r.next() && !bytes.Equal(r.events[seq-r.first], raw):
		c.dropLocked(id)
	}
}

// drop forgets id's run (the session was deleted).
func (c *histCache) drop(id session.ID) {
	if c.max == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(id)
}

// expire drops the runs nobody read or extended for histCacheIdle.
func (c *histCache) expire(now time.Time) {
	if c.max == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, r := range c.runs {
		if now.Sub(r.used) > histCacheIdle {
			c.dropLocked(id)
		}
	}
}

func (c *histCache) dropLocked(id session.ID) {
	if r := c.runs[id]; r != nil {
		c.bytes -= r.bytes
		delete(c.runs, id)
	}
}

// appendLocked appends evs to r, then trims r to a quarter of the cache
// (oldest events first) and the cache to its size (least recently used
// runs first, r last).
func (c *histCache) appendLocked(id session.ID, r *histRun, evs []json.RawMessage) {
	r.used = time.Now()
	n := 0
	for _, ev := range evs {
		n += len(ev) + histCacheEventBytes
	}
	r.events = append(r.events, evs...)
	r.bytes += n
	c.bytes += n
	if limit := c.max / 4; r.bytes > limit {
		// Down to 3/4 of the limit, so that trimming is rare.
		i, cut := 0, 0
		for i < len(r.events) && r.bytes-cut > limit-limit/4 {
			cut += len(r.events[i]) + histCacheEventBytes
			i++
		}
		// A new backing array: the old one may be held by readers, and
		// must not keep the dropped events alive for long.
		r.events = append([]json.RawMessage(nil), r.events[i:]...)
		r.first += session.Seq(i)
		r.bytes -= cut
		c.bytes -= cut
		if len(r.events) == 0 {
			c.dropLocked(id)
		}
	}
	for c.bytes > c.max && len(c.runs) > 1 {
		var oldID session.ID
		var old *histRun
		for rid, o := range c.runs {
			if o != r && (old == nil || o.used.Before(old.used)) {
				oldID, old = rid, o
			}
		}
		c.dropLocked(oldID)
	}
}

// scanEventEpoch returns the epoch of an event encoded as the node encodes
// events ({"seq":N,"epoch":"…",…}), or false.
func scanEventEpoch(b []byte) ([]byte, bool) {
	b, ok := bytes.CutPrefix(b, []byte(`{"seq":`))
	if !ok {
		return nil, false
	}
	i := bytes.IndexByte(b, ',')
	if i < 0 {
		return nil, false
	}
	if b, ok = bytes.CutPrefix(b[i:], []byte(`,"epoch":"`)); !ok {
		return nil, false
	}
	end := bytes.IndexByte(b, '"')
	if end < 0 || bytes.IndexByte(b[:end], '\\') >= 0 {
		return nil, false
	}
	return b[:end], true
}
