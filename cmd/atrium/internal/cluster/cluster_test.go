package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// streamLines is a prompt of the shell harness printing n numbered lines,
// pausing between them so that the turn streams for a while.
func streamLines(n int, pause string) string {
	if pause == "" {
		return fmt.Sprintf(`for i in $(seq 1 %d); do echo line $i; done`, n)
	}
	return fmt.Sprintf(`for i in $(seq 1 %d); do echo line $i; sleep %s; done`, n, pause)
}

// outputLines returns the stdout lines of the output events of evs, in
// order.
func outputLines(evs []recorded) []string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.outputText())
	}
	var out []string
	for l := range strings.SplitSeq(b.String(), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// upTo returns the events of evs with seq ≤ last.
func upTo(evs []recorded, last session.Seq) []recorded {
	for i, e := range evs {
		if e.Seq > last {
			return evs[:i]
		}
	}
	return evs
}

// settle waits until both watchers have seen the whole history as it is
// now, and returns the history.
func (c *Cluster) settle(t *testing.T, id session.ID, ws ...*Watcher) []recorded {
	t.Helper()
	h := c.History(0, id)
	if len(h) == 0 {
		t.Fatalf("the history of %s is empty", id)
	}
	last := h[len(h)-1].Seq
	for _, w := range ws {
		w.WaitSeq(t, last)
	}
	return h
}

// checkConsistent checks the invariants every test ends with: the history
// has seq 1..N once each; every acknowledged prompt is in it at its seq;
// each watcher saw exactly the history's events (no gap, duplicate or
// fork); NATS never carried two different events with one seq.
func (c *Cluster) checkConsistent(t *testing.T, id session.ID, acked map[string]session.Seq, tap *EventTap, ws ...*Watcher) []recorded {
	t.Helper()
	h := c.settle(t, id, ws...)
	checkContiguous(t, "history", h, 0)
	if h2 := c.History(1, id); len(h2) < len(h) {
		t.Errorf("history through %s has %d events, through %s %d", c.Gateways[1].Name, len(h2), c.Gateways[0].Name, len(h))
	} else {
		checkSameEvents(t, "history through "+c.Gateways[1].Name, h2[:len(h)], h)
	}
	checkAcked(t, h, acked)
	last := h[len(h)-1].Seq
	for _, w := range ws {
		evs := upTo(w.Events(), last)
		checkContiguous(t, "watcher on "+w.Name, evs, w.After)
		checkSameEvents(t, "watcher on "+w.Name, evs, h)
	}
	if tap != nil {
		for _, f := range tap.Forks() {
			t.Errorf("two writers on NATS: %s", f)
		}
	}
	// The events stream, which a later takeover replays, holds each seq
	// of the history once, with the history's bytes. (Queued turns may
	// still be adding events: later seqs are not compared.)
	stored, err := c.StreamEvents(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range h {
		switch raws := stored[e.Seq]; {
		case len(raws) == 0:
			t.Errorf("the events stream lacks seq %d (%s)", e.Seq, e.Kind)
		case len(raws) > 1:
			t.Errorf("the events stream holds seq %d %d times: %q", e.Seq, len(raws), raws)
		case raws[0] != e.Raw:
			t.Errorf("the events stream holds another event at seq %d than the history:\n  stream  %s\n  history %s", e.Seq, raws[0], e.Raw)
		}
	}
	return h
}

// TestCluster_CrossGatewayFanout: watchers of one session on both gateways
// see the same sequence while a turn streams output.
func TestCluster_CrossGatewayFanout(t *testing.T) {
	c := StartCluster(t, Options{})
	s := c.CreateSession(0, "fan-out", shellHarness)
	wa := c.Watch(0, s.ID, 0)
	wb := c.Watch(1, s.ID, 0)
	tap := c.Tap(s.ID)

	cid, seq, _ := c.SendUntilAcked(1, s.ID, streamLines(200, "0.005"))
	wa.WaitFor(t, "turn_finished", turnFinished)
	wb.WaitFor(t, "turn_finished", turnFinished)
	h := c.checkConsistent(t, s.ID, map[string]session.Seq{cid: seq}, tap, wa, wb)

	last := h[len(h)-1].Seq
	a, b := upTo(wa.Events(), last), upTo(wb.Events(), last)
	if len(a) != len(b) {
		t.Fatalf("gateway-a's watcher saw %d events, gateway-b's %d", len(a), len(b))
	}
	for i := range a {
		if a[i].Raw != b[i].Raw {
			t.Fatalf("event %d differs between the gateways:\n  a %s\n  b %s", i, a[i].Raw, b[i].Raw)
		}
	}
	lines := outputLines(a)
	if len(lines) != 200 {
		t.Fatalf("the turn's output has %d lines, want 200: %q", len(lines), lines)
	}
	for i, l := range lines {
		if want := fmt.Sprintf("line %d", i+1); l != want {
			t.Fatalf("output line %d is %q, want %q", i, l, want)
		}
	}
	if n := countKind(a, session.KindOutput); n < 2 {
		t.Errorf("the turn streamed %d output events; want several", n)
	}
}

// TestCluster_KillOwner: kill -9 the node owning a session while a turn
// streams; the other node takes it over, watchers carry on without gaps or
// duplicates, every acknowledged prompt is in the history and seq continues.
func TestCluster_KillOwner(t *testing.T) {
	c := StartCluster(t, Options{})
	s := c.CreateSession(0, "kill", shellHarness)
	tap := c.Tap(s.ID)
	wa := c.Watch(0, s.ID, 0)
	wb := c.Watch(1, s.ID, 0)

	c.SendUntilAcked(0, s.ID, streamLines(1000, "0.01"))
	wa.WaitFor(t, "the turn streaming", func(evs []recorded) bool { return countKind(evs, session.KindOutput) >= 10 })
	pr := c.StartPrompter(s.ID, "echo tick")
	pr.WaitAcked(t, 5)

	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	lease, ok, err := c.LeaseOf(ctx, s.ID)
	if err != nil || !ok {
		t.Fatalf("lease of the active session %s: %+v, held %v, %v", s.ID, lease, ok, err)
	}
	before := wa.LastSeq()
	owner := c.Node(lease.Node)
	t0 := time.Now()
	owner.Kill()
	t.Logf("killed %s (lease revision %d) at seq %d", owner.Name, lease.Revision, before)
	// A client resuming by cursor while nobody owns the session.
	resumeAt := max(before-5, 0)
	wr := c.Watch(1, s.ID, resumeAt)

	cid, seq, ackAt := c.SendUntilAcked(1, s.ID, "echo after the kill")
	takeover := ackAt.Sub(t0)
	next := c.WaitOwner(s.ID, owner.Name)
	t.Logf("takeover: %s holds the lease (revision %d); first prompt acked %v after the kill, at seq %d", next.Node, next.Revision, takeover.Round(time.Millisecond), seq)
	if next.Revision <= lease.Revision {
		t.Errorf("the new lease's revision %d is not above the dead owner's %d: the fencing token did not advance", next.Revision, lease.Revision)
	}
	if seq <= before {
		t.Errorf("the first prompt after the takeover got seq %d, not after the %d seen before the kill", seq, before)
	}
	pr.WaitAcked(t, 5)
	pr.Stop()
	acked := pr.Acked()
	acked[cid] = seq
	h := c.checkConsistent(t, s.ID, acked, tap, wa, wb, wr)
	a, f, _ := pr.Stats()
	t.Logf("%d prompts acked, %d failed during the takeover; history %d events; watchers reconnected %d and %d times",
		a, f, len(h), wa.Reconnects(), wb.Reconnects())
}

// TestCluster_PartitionOwner: cut the owning node off NATS; it stops its
// session actors before its lease can expire, the other node takes over,
// and there is never a second writer, even after the partition heals.
func TestCluster_PartitionOwner(t *testing.T) {
	c := StartCluster(t, Options{})
	s := c.CreateSession(0, "partition", shellHarness)
	tap := c.Tap(s.ID)
	wa := c.Watch(0, s.ID, 0)
	wb := c.Watch(1, s.ID, 0)

	c.SendUntilAcked(0, s.ID, streamLines(1000, "0.01"))
	wa.WaitFor(t, "the turn streaming", func(evs []recorded) bool { return countKind(evs, session.KindOutput) >= 10 })
	pr := c.StartPrompter(s.ID, "echo tick")
	pr.WaitAcked(t, 5)

	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	lease, ok, err := c.LeaseOf(ctx, s.ID)
	if err != nil || !ok {
		t.Fatalf("lease of the active session %s: %+v, held %v, %v", s.ID, lease, ok, err)
	}
	i := c.NodeIndex(lease.Node)
	if i < 0 {
		t.Fatalf("the lease names %q, not one of this cluster's nodes", lease.Node)
	}
	old := c.Nodes[i]
	logBefore := len(old.Log())
	c.Proxies[i].Partition()
	t.Logf("partitioned %s from NATS (lease revision %d)", old.Name, lease.Revision)

	next := c.WaitOwner(s.ID, old.Name)
	if next.Revision <= lease.Revision {
		t.Errorf("the new lease's revision %d is not above the partitioned owner's %d", next.Revision, lease.Revision)
	}
	pr.WaitAcked(t, 5)

	// The partitioned node stopped the session because it could not renew
	// its lease, and did so before the lease expired: before the new
	// owner could create it.
	var lostAt time.Time
	waitUntil(t, old.Name+" logging that it lost the lease of "+string(s.ID), func() error {
		var err error
		lostAt, err = logLineTime(old.Log()[logBefore:], "ownership lease lost", "session="+string(s.ID))
		return err
	})
	created := next.Acquired
	if created.IsZero() {
		t.Fatalf("the new lease has no acquired time: %s", next.Raw)
	}
	t.Logf("%s stopped the session at %s; %s created the lease at %s", old.Name, lostAt.Format(time.StampMilli), next.Node, created.Format(time.StampMilli))
	if !lostAt.Before(created) {
		t.Errorf("%s stopped the session at %s, not before %s took the lease at %s: two writers overlapped",
			old.Name, lostAt.Format(time.StampMilli), next.Node, created.Format(time.StampMilli))
	}

	c.Proxies[i].Heal()
	old.WaitReady()
	// Give a stale writer every chance to show itself: more prompts and
	// events after the old node is back on NATS.
	pr.WaitAcked(t, 10)
	pr.Stop()
	h := c.checkConsistent(t, s.ID, pr.Acked(), tap, wa, wb)
	if l, ok, err := c.LeaseOf(ctx, s.ID); err == nil && ok && l.Node == old.Name && l.Revision <= next.Revision {
		t.Errorf("the healed node holds the lease at an old revision %d (new owner's %d)", l.Revision, next.Revision)
	}
	t.Logf("history %d events", len(h))
}

// TestCluster_RollingRestart: SIGTERM and restart every node and gateway in
// turn while a client prompts continuously: nothing acknowledged is lost.
func TestCluster_RollingRestart(t *testing.T) {
	c := StartCluster(t, Options{})
	s := c.CreateSession(0, "rolling", shellHarness)
	tap := c.Tap(s.ID)
	wa := c.Watch(0, s.ID, 0)
	wb := c.Watch(1, s.ID, 0)
	pr := c.StartPrompter(s.ID, "echo tick")
	pr.WaitAcked(t, 5)
	for _, p := range c.All() {
		p.Terminate()
		t.Logf("%s stopped cleanly", p.Name)
		p.Restart()
		pr.WaitAcked(t, 5)
	}
	pr.Stop()
	h := c.checkConsistent(t, s.ID, pr.Acked(), tap, wa, wb)
	a, f, last := pr.Stats()
	t.Logf("%d prompts acked, %d failed (last: %v); history %d events; watchers reconnected %d and %d times",
		a, f, last, len(h), wa.Reconnects(), wb.Reconnects())
	if wa.Reconnects() == 0 || wb.Reconnects() == 0 {
		t.Errorf("a watcher never reconnected (%d, %d) although its gateway restarted", wa.Reconnects(), wb.Reconnects())
	}
}

// TestCluster_SpreadSessions: 1,000 sessions created through both gateways
// are placed on both nodes.
func TestCluster_SpreadSessions(t *testing.T) {
	const n = 1000
	// A long lease: this test is about placement, not expiry.
	c := StartCluster(t, Options{LeaseTTL: 10 * time.Second})
	clients := []*client.Client{c.Client(0), c.Client(1)}
	ids := make([]session.ID, n)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		first   error
		retries []string
	)
	sem := make(chan struct{}, 32)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			req := client.CreateRequest{Title: fmt.Sprintf("spread %d", i), Harness: session.Harness{Command: []string{"true"}}}
			s, err := clients[i%2].CreateSession(ctx, req)
			for try := 0; err != nil && !client.Terminal(err) && try < 3; try++ {
				// unavailable says retry; a client does.
				mu.Lock()
				retries = append(retries, err.Error())
				mu.Unlock()
				s, err = clients[i%2].CreateSession(ctx, req)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = fmt.Errorf("create session %d: %w", i, err)
			}
			ids[i] = s.ID
		})
	}
	wg.Wait()
	if len(retries) > 0 {
		t.Logf("%d creations were retried; first: %s", len(retries), retries[0])
	}
	if first != nil {
		t.Fatal(first)
	}
	var perNode map[string]int
	waitUntil(t, "a lease for every session", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		leases, err := c.Leases(ctx)
		if err != nil {
			return err
		}
		perNode = map[string]int{}
		missing := 0
		for _, id := range ids {
			l, ok := leases[string(id)]
			if !ok {
				missing++
				continue
			}
			perNode[l.Node]++
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d sessions hold no lease (per node: %v)", missing, n, perNode)
		}
		return nil
	})
	t.Logf("sessions per node: %v", perNode)

	// `atrium cluster status --json` shows the same placement.
	status := c.ClusterStatus(0)
	shown := map[string]int{}
	for _, nd := range status.Nodes {
		for _, l := range nd.Leases {
			shown[nd.ID]++
			if l.Node != "" && l.Node != nd.ID {
				t.Errorf("cluster status lists session %s under %s but its lease names %s", l.Session, nd.ID, l.Node)
			}
		}
	}
	for _, p := range c.Nodes {
		if shown[p.Name] < perNode[p.Name] {
			t.Errorf("cluster status lists %d sessions on %s, the owners bucket %d (status: %v)", shown[p.Name], p.Name, perNode[p.Name], shown)
		}
	}
	if len(perNode) != len(c.Nodes) {
		t.Fatalf("sessions are on %d nodes (%v), want all %d", len(perNode), perNode, len(c.Nodes))
	}
	for _, p := range c.Nodes {
		// A fair placement puts n/2 on each; 20% is more than ten
		// standard deviations below.
		if got := perNode[p.Name]; got < n/5 {
			t.Errorf("%s hosts %d of %d sessions: placement is lopsided (%v)", p.Name, got, n, perNode)
		}
	}
}
