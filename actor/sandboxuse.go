package actor

import (
	"context"

	"github.com/atriumhq/atrium/session"
)

// sandboxUse is this session's use of its sandbox: the box the host keeps
// for it across activations, the sandbox operation running outside turns
// (putting it to sleep), the state its last sandbox event logged, and a
// sleep timer that fired and waits for the session to be able to act on it.
// The sandbox itself, its timers and its awake flag belong to the host's
// boxes (sandboxes.go), which outlive the actor.
//
// It is a plain value owned by the actor's goroutine. Unit-tested in
// sandboxuse_test.go.
type sandboxUse struct {
	// box is the session's sandbox, kept by the host across activations;
	// nil until the session uses a sandbox on this node.
	box *box
	// op is the sandbox op running outside turns (putting it to sleep);
	// turns wait for it.
	op *boxOp
	// sandboxState is the state of the last sandbox event.
	sandboxState session.SandboxState
	// sleepDue is the generation of a sleep timer that fired; 0 if none.
	sleepDue uint64
}

// idle reports whether no sandbox op runs and no fired sleep timer waits.
func (u *sandboxUse) idle() bool { return u.op == nil && u.sleepDue == 0 }

// sleepFired records that the sandbox's sleep timer of generation gen fired
// (the manager passed it on in a place request); a passivating session
// leaves it to its next activation.
func (u *sandboxUse) sleepFired(gen uint64, p phase) {
	if gen != 0 && p != phasePassivating {
		u.sleepDue = gen
	}
}

// takeSleep returns the generation of a sleep timer that fired once a
// session in phase p can act on it: an active one. A session still opening,
// draining or waking keeps it for later; one that is going away forgets it
// (the place request that carried it goes back to the manager, and so to
// the next activation). A draining session is not going away yet: the place
// request that carried the timer makes it serve again (onDrained), and a
// timer forgotten then was never acted on, which left the sandbox awake for
// good (its fired timer still counted as armed at later activations).
func (u *sandboxUse) takeSleep(p phase) (uint64, bool) {
	if u.sleepDue == 0 {
		return 0, false
	}
	switch p {
	case phaseNew, phaseOpening, phaseDraining, phaseWaking:
		return 0, false // Not yet.
	case phaseActive:
	default:
		u.sleepDue = 0
		return 0, false
	}
	gen := u.sleepDue
	u.sleepDue = 0
	return gen, true
}

// startOp records a sandbox op that cancel stops.
func (u *sandboxUse) startOp(cancel context.CancelFunc) *boxOp {
	op := &boxOp{cancel: cancel}
	u.op = op
	return op
}

// opDone records the end of op; it reports false for an op that is no
// longer current (cancelled by a teardown).
func (u *sandboxUse) opDone(op *boxOp) bool {
	if op != u.op {
		return false
	}
	u.op = nil
	return true
}

// cancelOp stops the running op, if any.
func (u *sandboxUse) cancelOp() {
	if u.op != nil {
		u.op.cancel()
		u.op = nil
	}
}
