package session

// Prompt is a queued prompt: a durable message event waiting for its turn.
type Prompt struct {
	Seq  Seq // seq of the message event
	Text string
	By   string
	// Cancelled is set by CancelPrompt while the prompt waits: its turn
	// starts and at once finishes cancelled, without running.
	Cancelled bool
}

// Turn is the running turn.
type Turn struct {
	N         int64
	Prompt    Prompt
	Cancelled bool // cancel was requested
	// Approvals pending an answer, by approval id.
	Approvals map[string]bool
}

// Turns is the turn queue state machine of a session: prompts from any driver
// are queued and run one at a time in arrival order. It does no I/O; the
// session actor owns it and performs the effects. The zero value is an empty
// queue whose first turn is 1.
type Turns struct {
	queue   []Prompt
	running *Turn
	last    int64 // number of the last turn started
}

// Restore sets the number of the last turn started (from the log) and
// whether it is still considered running (it is not, after a crash).
func (t *Turns) Restore(lastTurn int64) { t.last = lastTurn }

// Enqueue appends p to the queue.
func (t *Turns) Enqueue(p Prompt) { t.queue = append(t.queue, p) }

// Next starts the next turn if none is running and one is queued.
func (t *Turns) Next() (*Turn, bool) {
	if t.running != nil || len(t.queue) == 0 {
		return nil, false
	}
	p := t.queue[0]
	t.queue[0] = Prompt{}
	t.queue = t.queue[1:]
	t.last++
	t.running = &Turn{N: t.last, Prompt: p, Approvals: map[string]bool{}}
	return t.running, true
}

// Running returns the running turn, or nil.
func (t *Turns) Running() *Turn { return t.running }

// Queued returns the number of prompts waiting.
func (t *Turns) Queued() int { return len(t.queue) }

// LastTurn returns the number of the last turn started.
func (t *Turns) LastTurn() int64 { return t.last }

// Finish ends turn n. It reports false if n is not the running turn.
func (t *Turns) Finish(n int64) bool {
	if t.running == nil || t.running.N != n {
		return false
	}
	t.running = nil
	return true
}

// Cancel marks the running turn cancelled. It returns the turn, or an error
// wrapping ErrConflict when nothing is running.
func (t *Turns) Cancel() (*Turn, error) {
	if t.running == nil {
		return nil, Errorf(CodeConflict, "no turn is running")
	}
	t.running.Cancelled = true
	return t.running, nil
}

// CancelPrompt cancels the turn of the prompt at seq: the running turn if it
// is that prompt's (returned, marked cancelled), or the queued prompt, which
// is marked so that its turn finishes cancelled without running (nil
// returned). It returns an error wrapping ErrConflict when the prompt is
// neither running nor queued: its turn has finished, or it is no prompt.
func (t *Turns) CancelPrompt(seq Seq) (*Turn, error) {
	if t.running != nil && t.running.Prompt.Seq == seq {
		t.running.Cancelled = true
		return t.running, nil
	}
	for i := range t.queue {
		if t.queue[i].Seq == seq {
			t.queue[i].Cancelled = true
			return nil, nil
		}
	}
	return nil, Errorf(CodeConflict, "the prompt at seq %d is neither running nor queued", seq)
}

// RequestApproval records that turn n waits for an answer to approval id.
func (t *Turns) RequestApproval(n int64, id string) error {
	if t.running == nil || t.running.N != n {
		return Errorf(CodeConflict, "turn %d is not running", n)
	}
	if _, dup := t.running.Approvals[id]; dup {
		return Errorf(CodeConflict, "approval %q is already pending", id)
	}
	t.running.Approvals[id] = true
	return nil
}

// ResolveApproval removes pending approval id of the running turn and returns
// that turn's number.
func (t *Turns) ResolveApproval(id string) (int64, error) {
	if t.running == nil || !t.running.Approvals[id] {
		return 0, Errorf(CodeNotFound, "no pending approval %q", id)
	}
	delete(t.running.Approvals, id)
	return t.running.N, nil
}

// Pending reports whether approval id of the running turn waits for an
// answer.
func (t *Turns) Pending(id string) bool { return t.running != nil && t.running.Approvals[id] }

// Idle reports whether nothing is running or queued, so the session may
// hibernate.
func (t *Turns) Idle() bool { return t.running == nil && len(t.queue) == 0 }
