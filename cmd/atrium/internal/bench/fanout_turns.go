package bench

import "sync"

// turns interleaves the phases of the fan-out's sides (Atrium, raw NATS,
// Centrifugo), which run concurrently, each with its servers and receivers
// open: one phase runs at a time, in round-robin order, so the sides'
// phases at each step of their ramps run seconds apart, under the same
// background load, instead of a minute apart. A side joins when its
// connections are open (or quits when it cannot open them); no phase starts
// until every side has joined or quit, and no side closes its connections
// until every side is done.
type turns struct {
	mu     sync.Mutex
	cond   *sync.Cond
	n      int
	joined []bool // guarded by mu: joined or quit
	done   []bool // guarded by mu: finished or quit
	cur    int    // guarded by mu: whose turn it is
}

func newTurns(n int) *turns {
	t := &turns{n: n, joined: make([]bool, n), done: make([]bool, n)}
	t.cond = sync.NewCond(&t.mu)
	return t
}

// turn is one side's handle on a turns; a zero turn (no turns) runs every
// phase at once, as a side measured alone does.
type turn struct {
	t *turns
	i int
}

// join marks side i ready and waits until every side has joined or quit.
func (u turn) join() {
	if u.t == nil {
		return
	}
	t := u.t
	t.mu.Lock()
	defer t.mu.Unlock()
	t.joined[u.i] = true
	t.cond.Broadcast()
	for !all(t.joined) {
		t.cond.Wait()
	}
}

// run runs phase in side i's turn and passes the turn on.
func (u turn) run(phase func()) {
	if u.t == nil {
		phase()
		return
	}
	t := u.t
	t.mu.Lock()
	for t.cur != u.i {
		t.cond.Wait()
	}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.advanceLocked()
		t.mu.Unlock()
	}()
	phase()
}

// finish marks side i done and waits until every side is, so that no side
// closes its connections while another measures.
func (u turn) finish() {
	if u.t == nil {
		return
	}
	t := u.t
	t.mu.Lock()
	defer t.mu.Unlock()
	t.quitLocked(u.i)
	for !all(t.done) {
		t.cond.Wait()
	}
}

// quit takes side i out without waiting (it failed, or has finished and
// returned); it may be called after finish.
func (u turn) quit() {
	if u.t == nil {
		return
	}
	u.t.mu.Lock()
	defer u.t.mu.Unlock()
	u.t.quitLocked(u.i)
}

func (t *turns) quitLocked(i int) {
	t.joined[i], t.done[i] = true, true
	if t.cur == i {
		t.advanceLocked()
	}
	t.cond.Broadcast()
}

// advanceLocked gives the turn to the next side that is not done.
func (t *turns) advanceLocked() {
	for k := 1; k <= t.n; k++ {
		if j := (t.cur + k) % t.n; !t.done[j] {
			t.cur = j
			break
		}
	}
	t.cond.Broadcast()
}

func all(b []bool) bool {
	for _, v := range b {
		if !v {
			return false
		}
	}
	return true
}
