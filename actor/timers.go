package actor

import "time"

// timers are the session actor's timers: hibernate_after (idle), the drain
// grace of a closing host, the catalog write delay (catalog.go) and the
// periodic checkpoint (checkpoint.go). A timer's callback runs on the
// runtime's timer goroutine and only sends the actor a message; the actor
// acts on it in Receive, where a stale tick (its timer was stopped or
// re-armed meanwhile) is recognised and ignored. The sandbox's sleep timer
// belongs to the host's boxes (sandboxes.go), which outlive the actor, and
// approval timeouts to the agent runtime (agent_turn.go).
//
// timers is a plain value owned by the actor's goroutine. Unit-tested in
// timers_test.go.
type timers struct {
	idleTimer *time.Timer // runs while idle; its tick carries idleGen
	idleGen   uint64      // generation of idleTimer; stale ticks are ignored
	touched   bool        // a request arrived in this Receive: restart idleTimer

	// catalogTimer runs while a catalog update waits for CatalogInterval.
	catalogTimer *time.Timer
	// ckptTimer runs while active (CheckpointInterval).
	ckptTimer *time.Timer
	// drainTimer cancels the running turn DrainGrace after the host began
	// closing.
	drainTimer *time.Timer
}

// touch records that a request arrived, which restarts the idle timer.
func (t *timers) touch() { t.touched = true }

// rearmIdle decides the idle timer's fate at the end of a Receive: while
// idle is false it is stopped; while idle is true it keeps running, unless
// a request arrived since the last call, which restarts it. It reports the
// generation of the timer the caller must start with startIdle, if one.
// (Deciding apart from starting keeps the timer's callback from being
// allocated at every Receive.)
func (t *timers) rearmIdle(idle bool) (gen uint64, start bool) {
	touched := t.touched
	t.touched = false
	if !idle {
		t.stopIdle()
		return 0, false
	}
	if t.idleTimer != nil && !touched {
		return 0, false
	}
	t.stopIdle()
	t.idleGen++
	return t.idleGen, true
}

// startIdle starts the idle timer rearmIdle asked for; fire runs when it
// expires and must send the actor the generation rearmIdle returned.
func (t *timers) startIdle(after time.Duration, fire func()) {
	t.idleTimer = time.AfterFunc(after, fire)
}

// idleFired reports whether a tick of generation gen is the running idle
// timer's, which it then forgets.
func (t *timers) idleFired(gen uint64) bool {
	if gen != t.idleGen || t.idleTimer == nil {
		return false
	}
	t.idleTimer = nil
	return true
}

func (t *timers) stopIdle() {
	if t.idleTimer != nil {
		t.idleTimer.Stop()
		t.idleTimer = nil
	}
}

// armDrain starts the drain timer unless it runs already.
func (t *timers) armDrain(grace time.Duration, fire func()) {
	if t.drainTimer == nil {
		t.drainTimer = time.AfterFunc(grace, fire)
	}
}

func (t *timers) stopDrain() {
	if t.drainTimer != nil {
		t.drainTimer.Stop()
		t.drainTimer = nil
	}
}
