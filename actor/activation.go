package actor

import (
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
)

// phase is where a session actor is in its life.
type phase int

const (
	phaseNew         phase = iota // waiting for the place request that says create or open
	phaseOpening                  // opening or creating the history, subscribing
	phaseActive                   // serving its Cmd subject
	phaseDraining                 // Cmd subscription draining before hibernation
	phaseWaking                   // re-subscribing after a drain that found new work
	phaseClosing                  // closing the history before hibernation
	phasePassivating              // asked the manager to stop it; bounces place requests
	phaseDeleting                 // delete in progress
)

var phaseNames = [...]string{"new", "opening", "active", "draining", "waking", "closing", "passivating", "deleting"}

func (p phase) String() string {
	if p >= 0 && int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// phaseMoves lists, for each phase, the phases a session may move to from
// it. Passivating is reachable from everywhere: a lost lease stops the
// session whatever it was doing.
var phaseMoves = [...][]phase{
	phaseNew:         {phaseOpening, phasePassivating},
	phaseOpening:     {phaseActive, phasePassivating},
	phaseActive:      {phaseDraining, phaseDeleting, phasePassivating},
	phaseDraining:    {phaseWaking, phaseClosing, phaseDeleting, phasePassivating},
	phaseWaking:      {phaseActive, phaseDeleting, phasePassivating},
	phaseClosing:     {phasePassivating},
	phasePassivating: {phasePassivating},
	phaseDeleting:    {phasePassivating},
}

// canMove reports whether a session in phase from may move to phase to.
func canMove(from, to phase) bool {
	if from < 0 || int(from) >= len(phaseMoves) {
		return false
	}
	for _, p := range phaseMoves[from] {
		if p == to {
			return true
		}
	}
	return false
}

// activation is the life-cycle state of one session actor: the phase, the
// flags that qualify it, and the requests that wait on it (place requests
// answered once the Cmd subscription is live, commands that arrived before
// the history was open), and the Cmd subscription that makes the session
// reachable. It is a plain value owned by the actor's goroutine, like every
// component of sessionActor; it starts no goroutine and does no I/O (the
// actor subscribes and drains), so its transitions are unit-tested on their
// own (activation_test.go).
//
// The phase changes through move and the named transitions below, which
// check phaseMoves; the one exception left is onLeaseLost (lease.go), which
// still assigns phasePassivating directly (a move the table allows from
// every phase).
type activation struct {
	phase phase

	// shutting: the host is closing; the session hibernates once quiet,
	// and queued prompts stay in the log for the next node.
	shutting bool
	// lost: the lease was lost; the actor stopped serving at once.
	lost bool
	// shutdownSlept: the sandbox was put to sleep for the host's shutdown.
	shutdownSlept bool
	// deleteStarted: the removal of the history, sandbox and catalog entry
	// began (off the actor).
	deleteStarted bool
	// metered: counted in the node's active sessions gauge.
	metered bool

	// sub is the Cmd subscription while the session serves; draining
	// the one being drained before hibernation or deletion.
	sub      *nats.Subscription
	draining *nats.Subscription

	creator   *placeMsg   // the create request being served
	waiting   []*placeMsg // place requests answered once the Cmd subscription is live
	early     []*cmdMsg   // commands that arrived before the history was open
	openErr   error       // why activation failed
	deleteMsg *nats.Msg   // the delete request, answered once the session is removed

	// log, if set, is told of a move phaseMoves does not list (a bug);
	// the move is made anyway, as it was before the table existed.
	log *slog.Logger
}

// move sets the phase to p, reporting a move phaseMoves does not allow.
func (a *activation) move(p phase) {
	if !canMove(a.phase, p) && a.log != nil {
		a.log.Error("bug: a session moved between phases that do not connect", "from", a.phase, "to", p)
	}
	a.phase = p
}

// serving reports whether the session takes commands and runs turns: active,
// or between hibernating and serving again.
func (a *activation) serving() bool {
	switch a.phase {
	case phaseActive, phaseDraining, phaseWaking:
		return true
	}
	return false
}

// toOpening is the move to phaseOpening.
func (a *activation) toOpening() { a.move(phaseOpening) }

// toActive is the move to phaseActive, after opening or waking.
func (a *activation) toActive() { a.move(phaseActive) }

// toDraining is the move to phaseDraining; a session being deleted stays
// deleting while its subscription drains.
func (a *activation) toDraining() {
	if a.phase != phaseDeleting {
		a.move(phaseDraining)
	}
}

// toWaking is the move to phaseWaking: work arrived while draining.
func (a *activation) toWaking() { a.move(phaseWaking) }

// toClosing is the move to phaseClosing.
func (a *activation) toClosing() { a.move(phaseClosing) }

// toPassivating is the move to phasePassivating.
func (a *activation) toPassivating() { a.move(phasePassivating) }

// toDeleting is the move to phaseDeleting; deleteMsg is answered at the end.
func (a *activation) toDeleting(msg *nats.Msg) {
	a.move(phaseDeleting)
	a.deleteMsg = msg
}

// takeWaiting returns the waiting place requests and forgets them.
func (a *activation) takeWaiting() []*placeMsg {
	w := a.waiting
	a.waiting = nil
	return w
}

// takeEarly returns the commands that arrived before the history was open
// and forgets them.
func (a *activation) takeEarly() []*cmdMsg {
	e := a.early
	a.early = nil
	return e
}
