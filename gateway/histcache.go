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
// Committed events never change, so a cached run stays true as long as the
// session's epoch is the same; a run of another epoch is dropped, and so is
// the run of a deleted session. A run grows only by the event right after
// its end: a live event that skips ahead (NATS dropped one) is not cached,
// and the run grows again when the feed refetches the gap.
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
}

func (r *histRun) next() session.Seq { return r.first + session.Seq(len(r.events)) }

func newHistCache(maxBytes int) *histCache {
	return &histCache{max: max(maxBytes, 0), runs: make(map[session.ID]*histRun)}
}

// holds reports whether the cache has the event after seq after of id, in
// whatever epoch.
func (c *histCache) holds(id session.ID, after session.Seq) bool {
	if c.max == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.runs[id]
	return r != nil && after >= r.first-1 && after < r.next()-1
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
// starts a new run: the latest events are the ones resumes read.
func (c *histCache) addPage(id session.ID, epoch string, first session.Seq, evs []json.RawMessage) {
	if c.max == 0 || epoch == "" || len(evs) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.runs[id]
	last := first + session.Seq(len(evs)) - 1
	switch {
	case r == nil || r.epoch != epoch || first > r.next():
		c.dropLocked(id)
		r = &histRun{epoch: epoch, first: first}
		c.runs[id] = r
	case last < r.next():
		r.used = time.Now()
		return // cached already
	}
	c.appendLocked(id, r, evs[r.next()-first:])
}

// addLive caches a live event of id, raw with seq seq, if it is the one
// right after the cached run. An event of another epoch drops the run.
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
	if seq == r.next() {
		c.appendLocked(id, r, []json.RawMessage{raw})
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
