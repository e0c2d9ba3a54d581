package actor

import (
	"github.com/atriumhq/atrium/session"
)

// turnQueue is the session's turn queue and what it remembers about turns:
// the queue state machine (session.Turns: prompts in arrival order, one
// turn at a time, approvals), the runner of the running turn, how the last
// turn ended (EnvPreviousTurn), the recent prompts that deduplicate retries
// by client_id, and the trace links from prompts to their turns.
//
// It is a plain value owned by the actor's goroutine. The runner itself
// runs on its own goroutine (turn.go) and talks to the actor only through
// messages; turnQueue holds the pointer that tells the current runner's
// messages from a finished one's. Unit-tested in turnqueue_test.go.
type turnQueue struct {
	turns  session.Turns
	runner *runner       // the running turn's runner; nil if none runs
	prev   *previousTurn // how the last turn ended (EnvPreviousTurn)
	recent recentPrompts
	traces turnTraces // links turns to the commands that queued them
}

// resume starts the queue of an opened history: turns are numbered after
// lastTurn, queue holds the acknowledged prompts whose turn has not started,
// and prompted says the history holds prompts recent does not know.
func (q *turnQueue) resume(lastTurn int64, queue []session.Prompt, prev *previousTurn, prompted bool) {
	q.turns.Restore(lastTurn)
	for _, p := range queue {
		q.turns.Enqueue(p)
	}
	q.prev = prev
	q.recent.partial = prompted
}

// owns reports whether r runs the current turn: messages from another
// runner are stale.
func (q *turnQueue) owns(r *runner) bool { return r == q.runner }

// idle reports whether no turn runs and none is queued.
func (q *turnQueue) idle() bool { return q.runner == nil && q.turns.Idle() }

// exited records the end of the running turn: the queue moves on and prev
// says how the turn ended, with the reason a failed turn gives or, failing
// that, its last error.
func (q *turnQueue) exited(m *turnExited) {
	q.runner = nil
	q.turns.Finish(m.r.turn)
	q.prev = &previousTurn{Turn: m.r.turn, Status: m.status, ExitCode: m.code}
	if m.status != session.TurnOK {
		q.prev.Reason = m.reason
		if n := len(m.errors); n > 0 && m.reason == "" {
			q.prev.Reason = m.errors[n-1].Message
		}
	}
}
