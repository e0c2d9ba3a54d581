package actor

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

func TestTurnQueue_RestoreAndRun(t *testing.T) {
	var q turnQueue
	prev := &previousTurn{Turn: 4, Status: session.TurnOK}
	q.resume(4, []session.Prompt{{Seq: 20, Text: "a", By: "alice"}, {Seq: 21, Text: "b", By: "bob"}}, prev, true)
	if q.idle() || q.turns.Queued() != 2 || q.prev != prev || !q.recent.partial {
		t.Fatalf("restored: idle %v queued %d prev %v partial %v", q.idle(), q.turns.Queued(), q.prev, q.recent.partial)
	}
	turn, ok := q.turns.Next()
	if !ok || turn.N != 5 || turn.Prompt.Seq != 20 {
		t.Fatalf("next turn %+v %v, want turn 5 of prompt 20", turn, ok)
	}
	r := &runner{turn: turn.N}
	q.runner = r
	if !q.owns(r) || q.owns(&runner{turn: 5}) {
		t.Fatal("owns does not tell the running turn's runner from another")
	}
	q.exited(&turnExited{r: r, status: session.TurnOK, code: 0})
	if q.runner != nil || q.owns(r) {
		t.Fatal("the runner of an ended turn is still current")
	}
	if *q.prev != (previousTurn{Turn: 5, Status: session.TurnOK}) {
		t.Fatalf("prev %+v", *q.prev)
	}
	if q.idle() {
		t.Fatal("idle with a prompt queued")
	}
	turn, _ = q.turns.Next()
	r = &runner{turn: turn.N}
	q.runner = r
	q.exited(&turnExited{r: r, status: session.TurnOK})
	if !q.idle() {
		t.Fatal("not idle after the queue ran")
	}
}

func TestTurnQueue_ExitedReason(t *testing.T) {
	tests := map[string]struct {
		exit *turnExited
		want previousTurn
	}{
		"ok keeps no reason": {
			&turnExited{status: session.TurnOK, reason: "ignored"},
			previousTurn{Turn: 1, Status: session.TurnOK},
		},
		"failed with a reason": {
			&turnExited{status: session.TurnFailed, code: 2, reason: "sandbox gone",
				errors: []session.ErrorData{{Message: "other"}}},
			previousTurn{Turn: 1, Status: session.TurnFailed, ExitCode: 2, Reason: "sandbox gone"},
		},
		"failed without a reason takes the last error": {
			&turnExited{status: session.TurnFailed, code: -1,
				errors: []session.ErrorData{{Message: "first"}, {Message: "last"}}},
			previousTurn{Turn: 1, Status: session.TurnFailed, ExitCode: -1, Reason: "last"},
		},
		"cancelled with nothing to say": {
			&turnExited{status: session.TurnCancelled, code: -1},
			previousTurn{Turn: 1, Status: session.TurnCancelled, ExitCode: -1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var q turnQueue
			q.turns.Enqueue(session.Prompt{Seq: 2, Text: "x"})
			turn, _ := q.turns.Next()
			tc.exit.r = &runner{turn: turn.N}
			q.runner = tc.exit.r
			q.exited(tc.exit)
			if *q.prev != tc.want {
				t.Fatalf("prev %+v, want %+v", *q.prev, tc.want)
			}
			if !q.idle() {
				t.Fatal("turn not finished in the queue")
			}
		})
	}
}
