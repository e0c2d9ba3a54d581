package actor

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// pauseNode makes the node's lease look as it does to a process thawed
// after a pause of d: its last renewal started d ago, and the renewal
// goroutine has yet to run.
func pauseNode(h *Host, d time.Duration) {
	h.node.mu.Lock()
	h.node.renewed = time.Now().Add(-d)
	h.node.mu.Unlock()
}

// TestHost_PausedOwnerPublishesNothing: a node whose lease was last renewed
// longer ago than its safe window (a process paused by SIGSTOP, a long GC
// pause, a frozen VM) publishes nothing, although no flag says the lease is
// lost yet: the prompt that reaches it is not acknowledged and no event
// appears on the session's subject (issue 21, finding 1). The lease TTL is
// long so that the renewal goroutine does not run during the test.
func TestHost_PausedOwnerPublishesNothing(t *testing.T) {
	const ttl = 30 * time.Second
	e := newEnv(t, func(c *Config) { c.LeaseTTL = ttl })
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo one")
	w.until("turn 1 finished", finished(1))

	if err := e.host.mayWrite(id); err != nil {
		t.Fatalf("before the pause: %v", err)
	}
	pauseNode(e.host, leaseSafeAge(ttl)+time.Second)
	if err := e.host.mayWrite(id); !errors.Is(err, errLeaseStale) {
		t.Fatalf("after a pause past the safe window: %v, want errLeaseStale", err)
	}
	rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpPrompt, Text: "echo two", ClientID: "after-pause"})
	if err == nil && rep.Error == nil {
		t.Fatalf("a prompt to a node paused past its lease was acknowledged at seq %d", rep.Seq)
	}
	// Nothing reaches the events subject: no message event for it, nor
	// anything else.
	for {
		m, ok := w.next(500 * time.Millisecond)
		if !ok {
			break
		}
		if m.Header.Get(session.HeaderControl) != "" {
			continue
		}
		var ev session.Event
		_ = json.Unmarshal(m.Data, &ev)
		t.Errorf("the paused node published seq %d (%s): %s", ev.Seq, ev.Kind, m.Data)
	}
}

// TestLease_SafeWindow: the node lease is held for writing for
// leaseSafeAge after the start of its last renewal, on the monotonic clock,
// and only under the incarnation that renewed it.
func TestLease_SafeWindow(t *testing.T) {
	h := &Host{cfg: Config{LeaseTTL: 3 * time.Second}}
	n := &nodeLease{h: h, inc: "i1", renewed: time.Now()}
	h.node = n
	if err := n.holds("i1"); err != nil {
		t.Fatalf("fresh lease: %v", err)
	}
	if err := n.holds("i0"); !errors.Is(err, errLeaseLost) {
		t.Fatalf("another incarnation: %v, want errLeaseLost", err)
	}
	n.renewed = time.Now().Add(-2 * time.Second) // = leaseSafeAge(3s)
	if err := n.holds("i1"); !errors.Is(err, errLeaseStale) {
		t.Fatalf("renewed 2s ago with a 3s TTL: %v, want errLeaseStale", err)
	}
	if err := h.nodeMayWrite(); !errors.Is(err, errLeaseStale) {
		t.Fatalf("nodeMayWrite: %v, want errLeaseStale", err)
	}
	n.inc = ""
	if err := n.holds(""); !errors.Is(err, errLeaseLost) {
		t.Fatalf("no lease: %v, want errLeaseLost", err)
	}
}
