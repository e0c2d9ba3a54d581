package actor

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// TestCluster_DivergedLocalTail: node a commits event N to its history file
// but stops before the stream captured it (as a node that loses its lease
// between the commit and the PubAck leaves it), node b takes the session
// over from the stream, which ends at N-1, and writes its own N, N+1, …,
// then hibernates and lets the lease go. When node a activates the session
// again, its file is behind the stream and its event N is not the stream's:
// it must not replay N+1… onto its own N, but take the stream's history, event
// for event and byte for byte, and continue seq after it.
func TestCluster_DivergedLocalTail(t *testing.T) {
	c := newNATSCluster(t)
	prov := newProvider(t)
	store := blobtest.StartS3(t).Open(t, "checkpoints/")
	a := startNode(t, "a", c.url(0), prov, store, withReplicas(3))
	e := gatewayEnv(t, c.url(2))
	id := e.create("alice", shell())
	if rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo one"}); rep.Error != nil {
		t.Fatalf("prompt on node a: %v", rep.Error)
	}
	waitTurn(t, e, id, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := a.host.Close(ctx); err != nil {
		t.Fatalf("close node a: %v", err)
	}

	// Node a's un-captured tail: one more event in its file, encoded as
	// the committer writes it, which the stream never got.
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), e.subj.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	streamLastSeq := func() session.Seq {
		t.Helper()
		m, err := stream.GetLastMsgForSubject(t.Context(), e.subj.Events(id))
		if err != nil {
			t.Fatalf("last event in the stream: %v", err)
		}
		seq, err := seqOf(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	hist, err := a.dir.Open(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	captured, _ := hist.LastSeq(t.Context())
	if got := streamLastSeq(); got != captured {
		t.Fatalf("node a closed with seq %d in its file and %d in the stream, want them equal", captured, got)
	}
	meta, err := hist.Meta(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := captured + 1
	mineEv := encodeEvent(n, meta.Epoch, time.Now(), session.KindMessage, "alice",
		mustMarshal(session.MessageData{Text: "echo only on node a", ClientID: "lost"}))
	if err := hist.Append(t.Context(), []session.Stored{mineEv}); err != nil {
		t.Fatalf("append node a's un-captured event: %v", err)
	}
	hist.Close()
	mine := mineEv.JSON

	// Node b takes over from the stream and writes N, N+1, … of its own.
	b := startNode(t, "b", c.url(1), prov, store, withReplicas(3), withHibernate(300*time.Millisecond))
	rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo two"})
	if rep.Error != nil {
		t.Fatalf("prompt on node b: %v", rep.Error)
	}
	if rep.Seq != n {
		t.Fatalf("node b's prompt has seq %d, want %d (the seq node a's lost event has)", rep.Seq, n)
	}
	waitTurn(t, e, id, 2)
	// Node b served the prompt (the only node up); whether it still holds
	// the session right after the turn is a race with its 300ms idle
	// timer, so the checkpoint it writes when it lets go is what proves it.
	eventually(t, "node b hibernated the session and checkpointed it", func() bool {
		if _, held := leaseOf(b.host, id); held {
			return false
		}
		m, _, err := b.host.readCheckpoint(t.Context(), id)
		return err == nil && m != nil && m.Node == "b" && m.LastSeq > n
	})
	if err := b.host.Close(ctx); err != nil {
		t.Fatalf("close node b: %v", err)
	}
	hist, err = b.dir.Open(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	theirs, more, err := hist.Range(t.Context(), 0, 1<<20, 0)
	hist.Close()
	if err != nil || more {
		t.Fatalf("node b's history: %v (more %v)", err, more)
	}

	// The state the check is for: node a's file is behind the stream, and
	// its last event is not the stream's event of that seq.
	if last := streamLastSeq(); int(last) != len(theirs) || last <= n {
		t.Fatalf("the stream ends at seq %d; want node b's %d events, past node a's %d", last, len(theirs), n)
	}
	if bytes.Equal(theirs[n-1], mine) {
		t.Fatalf("node b's event %d is node a's: %s", n, mine)
	}
	hist, err = a.dir.Open(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := hist.LastSeq(t.Context())
	evs, _, err := hist.Range(t.Context(), n-1, 1, 0)
	hist.Close()
	if err != nil || local != n || len(evs) != 1 || !bytes.Equal(evs[0], mine) {
		t.Fatalf("node a's file ends at %d with %q (%v), want its own event %d", local, evs, err, n)
	}

	// Node a comes back on the same history directory and activates the
	// session: it serves the stream's history, not its own fork.
	a2 := startNode(t, "a", c.url(0), prov, store, withReplicas(3), func(c *Config) { c.Histories = HistoriesOf(a.dir) })
	got := historyOf(t, e, id)
	if _, ok := leaseOf(a2.host, id); !ok {
		t.Fatalf("node a does not hold the session: %+v", a2.host.Leases())
	}
	for i, raw := range got {
		if bytes.Equal(raw, mine) {
			t.Errorf("node a serves its un-captured event as event %d: %s", i+1, raw)
		}
	}
	if len(got) != len(theirs) {
		t.Fatalf("node a serves %d events, want node b's %d:%s\nnode b's:%s", len(got), len(theirs),
			summarize(decode(t, got)), summarize(decode(t, theirs)))
	}
	for i := range theirs {
		if !bytes.Equal(got[i], theirs[i]) {
			t.Fatalf("event %d on node a differs from node b's:\n node a %s\n node b %s", i+1, got[i], theirs[i])
		}
	}

	// seq continues after the stream's last event.
	rep = served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo three"})
	if rep.Error != nil {
		t.Fatalf("prompt on node a: %v", rep.Error)
	}
	if want := session.Seq(len(theirs) + 1); rep.Seq != want {
		t.Errorf("node a's prompt has seq %d, want %d", rep.Seq, want)
	}
	fin, all := waitTurn(t, e, id, 3)
	if fin.Status != session.TurnOK {
		t.Errorf("turn 3 on node a: %+v", fin)
	}
	checkContiguous(t, all)
	if got := outputText(t, all, 3, "stdout"); got != "three\n" {
		t.Errorf("turn 3 stdout %q", got)
	}
	var msgs []string
	for _, ev := range all {
		if ev.Kind == session.KindMessage {
			msgs = append(msgs, data[session.MessageData](t, ev).Text)
		}
	}
	if want := []string{"echo one", "echo two", "echo three"}; !slices.Equal(msgs, want) {
		t.Errorf("prompts in the history %q, want %q", msgs, want)
	}
}
