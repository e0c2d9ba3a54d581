package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// Freeze stops the current run with SIGSTOP, as a very long GC pause or a
// stalled host would: its sockets stay open, its timers stop firing, while
// its sandboxes (other processes) keep running and fill their pipes. Thaw
// resumes it; the test's end thaws it too.
func (p *Proc) Freeze() {
	p.t.Helper()
	pid := p.Pid()
	if pid == 0 {
		p.t.Fatalf("%s: freeze before start", p.Name)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		p.t.Fatalf("SIGSTOP %s: %v", p.Name, err)
	}
	p.t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
}

// Thaw resumes a process Freeze stopped.
func (p *Proc) Thaw() {
	p.t.Helper()
	if err := syscall.Kill(p.Pid(), syscall.SIGCONT); err != nil {
		p.t.Fatalf("SIGCONT %s: %v", p.Name, err)
	}
}

// TestCluster_FreezeOwner: freeze the node owning a busy session (SIGSTOP)
// for three lease TTLs, so that the other node takes the session over and
// writes after it; then thaw it. The thawed node's timers have not fired
// yet, the turn output and the prompts that reached it during the freeze
// are waiting in its pipes and sockets: it must not publish one event
// under a seq the new owner took (issue 21, finding 1), and a raw
// subscriber of the events subject must never receive two different events
// for one seq: it receives only what the events stream stored.
//
// Four freezes in a row, each of the node that took the session over at
// the one before: a node thawed a moment before must take it over. A third
// freeze in a row was once not taken over within a minute in fresh-clone
// CI (2026-11-26 04:06; the node thawed 0.4 s before logged no lease end
// and no rescue). Cause: the node frozen before had sent, at its thaw, a
// catalog write whose lease check passed just before the freeze, over the
// entry of the node that took the session over; when that node froze in
// turn, its rescue read the catalog only and found no session of it.
// Owner entries are now written with a compare-and-set on a revision read
// before the check, and the rescue takes what the gone node held from the
// ownership records (actor: TestCatalog_OwnerEntryNotWrittenAfterAPause,
// TestCluster_RescueDespiteStaleCatalog).
func TestCluster_FreezeOwner(t *testing.T) {
	const freezes = 4
	c := StartCluster(t, Options{})
	ttl := c.opts.LeaseTTL
	s := c.CreateSession(0, "freeze", shellHarness)
	tap := c.Tap(s.ID)
	wa := c.Watch(0, s.ID, 0)
	wb := c.Watch(1, s.ID, 0)
	// Every turn streams for about a second, so that a turn is running
	// whenever a node freezes; two prompters keep prompts arriving.
	turn := streamLines(400, "0.0025")
	pr1 := c.StartPrompter(s.ID, turn)
	pr2 := c.StartPrompter(s.ID, "echo tick")
	pr1.WaitAcked(t, 2)

	for i := range freezes {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		lease, ok, err := c.LeaseOf(ctx, s.ID)
		cancel()
		if err != nil || !ok {
			t.Fatalf("freeze %d: lease of the active session %s: %+v, held %v, %v", i, s.ID, lease, ok, err)
		}
		owner := c.Node(lease.Node)
		wa.WaitFor(t, "a turn streaming", func(evs []recorded) bool {
			return len(evs) > 0 && evs[len(evs)-1].Kind == session.KindOutput
		})
		owner.Freeze()
		frozenAt := time.Now()
		t.Logf("freeze %d: froze %s (lease revision %d) at seq %d", i, owner.Name, lease.Revision, wa.LastSeq())
		next := c.WaitOwner(s.ID, owner.Name)
		t.Logf("freeze %d: %s took the session over %v after the freeze", i, next.Node, time.Since(frozenAt).Round(time.Millisecond))
		pr2.WaitAcked(t, 2)
		// Stay frozen three TTLs in all: the fault the issue reproduced.
		// This is the fault's length, not a wait for something.
		if rest := 3*ttl - time.Since(frozenAt); rest > 0 {
			time.Sleep(rest)
		}
		owner.Thaw()
		t.Logf("freeze %d: thawed %s after %v; %s owns the session (revision %d)",
			i, owner.Name, time.Since(frozenAt).Round(time.Millisecond), next.Node, next.Revision)
		owner.WaitReady()
		pr2.WaitAcked(t, 3)
		for _, f := range tap.staleForks(frozenAt) {
			t.Errorf("freeze %d: two writers on NATS after %s thawed: it published an event made after the freeze:\n%s", i, owner.Name, f)
		}
	}
	for _, f := range tap.Forks() {
		// Even an event whose publish was under way at the instant of a
		// freeze (checked, then frozen before the socket write), which
		// goes out at the thaw, must not reach the events subject: the
		// stream refuses it (its Msg-Id is taken) and republishes only
		// what it stored.
		t.Errorf("two different events for one seq on the events subject:\n%s", f)
	}
	pr1.Stop()
	pr2.Stop()
	acked := pr1.Acked()
	for k, v := range pr2.Acked() {
		acked[k] = v
	}
	h := c.checkConsistent(t, s.ID, acked, nil, wa, wb)
	a1, f1, _ := pr1.Stats()
	a2, f2, _ := pr2.Stats()
	t.Logf("%d prompts acked, %d failed; history %d events", a1+a2, f1+f2, len(h))
	for _, p := range c.Nodes {
		if n := strings.Count(p.Log(), "the node lease was not renewed within its safe window"); n > 0 {
			t.Logf("%s refused %d writes after a pause", p.Name, n)
		}
	}
}

// TestCluster_StartTogether: every process of a fresh cluster (no stream or
// bucket made yet) starts at the same moment, as a first install with
// podManagementPolicy: Parallel does: all become ready (two processes
// creating one R3 bucket at once can both see their request time out while
// the cluster forms; start-up retries), and the cluster works.
func TestCluster_StartTogether(t *testing.T) {
	c := StartCluster(t, Options{Together: true})
	s := c.CreateSession(1, "together", shellHarness)
	w := c.Watch(0, s.ID, 0)
	cid, seq, _ := c.SendUntilAcked(0, s.ID, "echo hello")
	w.WaitFor(t, "turn_finished", turnFinished)
	c.checkConsistent(t, s.ID, map[string]session.Seq{cid: seq}, nil, w)

	// Every stream and bucket any process made follows nats.replicas: 3,
	// whichever process made it first (issue 21, finding 4).
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	names := c.js.StreamNames(ctx)
	n := 0
	for name := range names.Name() {
		st, err := c.js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		n++
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want the configured 3", name, r)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatalf("list streams: %v", err)
	}
	if n < 4 {
		t.Errorf("only %d streams exist; want at least the catalog, owners, events and nodes", n)
	}
}

// staleForks returns the seqs published with two different events where a
// later publication is an event made (its time field, the publisher's
// clock, which is this machine's) at or after since: a writer that
// published something it made after being frozen at since.
func (tap *EventTap) staleForks(since time.Time) []string {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	var out []string
	for seq, raws := range tap.seen {
		for _, r := range raws[1:] {
			if r == raws[0] {
				continue
			}
			var ev session.Event
			if json.Unmarshal([]byte(r), &ev) != nil || !ev.Time.Time.Before(since) {
				out = append(out, fmt.Sprintf("seq %d was published first as\n  %s\nthen as\n  %s", seq, raws[0], r))
			}
		}
	}
	return out
}

// TestCluster_FreezeHibernatedOwner: a hibernated session's node (the one
// whose disk has its file, which gateways ask first) is frozen; once its
// lease has ended, a prompt is served by another node at once, not after
// the request timeout: the gateway asks a node whose lease is live instead
// of the frozen one, which still listens on its place subjects (issue 21,
// finding 5).
func TestCluster_FreezeHibernatedOwner(t *testing.T) {
	c := StartCluster(t, Options{HibernateAfter: time.Second})
	s := c.CreateSession(0, "freeze hibernated", shellHarness)
	c.SendUntilAcked(0, s.ID, "echo one")
	owner := c.Node(c.WaitOwner(s.ID, "").Node)
	// Hibernated: the record is released.
	waitUntil(t, "the session hibernating", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, ok, err := c.LeaseOf(ctx, s.ID)
		switch {
		case err != nil:
			return err
		case ok:
			return fmt.Errorf("still held by %s", l.Node)
		}
		return nil
	})
	owner.Freeze()
	defer owner.Thaw()
	waitUntil(t, "the lease of "+owner.Name+" ending", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := c.owners(ctx)
		if err != nil {
			return err
		}
		if _, err := kv.Get(ctx, session.NodeLeaseKey(owner.Name)); err == nil {
			return errors.New("still there")
		}
		return nil
	})
	for i := range c.Gateways {
		// One attempt, bounded by the gateway's own request timeout (10
		// s): asking the frozen node would use all of it.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		seq, err := c.Client(i).Send(ctx, s.ID, "echo two", client.NewClientID())
		cancel()
		if err != nil {
			t.Fatalf("a prompt through %s to a session whose node is frozen: %v", c.Gateways[i].Name, err)
		}
		t.Logf("prompt through %s acked at seq %d", c.Gateways[i].Name, seq)
	}
}
