package actor

import (
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
)

// TestHost_ResumeFromJustPublished resumes from each event the moment it is
// published: the history read must accept after=<that seq>, although the
// actor may not yet have heard from its committer that the event is durable.
func TestHost_ResumeFromJustPublished(t *testing.T) {
	e := newEnv(t)
	// The first turn blocks, so the prompts below only queue: the events
	// are mostly messages, produced as fast as the committer goes.
	id := e.create("alice", command("sleep", "60"))
	w := e.watch(id)
	for range 200 {
		e.prompt(id, "alice", "p")
	}
	// Every published event is immediately a valid resume point.
	deadline := time.Now().Add(30 * time.Second)
	for checked := 0; checked < 200 && time.Now().Before(deadline); {
		m, ok := w.next(5 * time.Second)
		if !ok {
			t.Fatalf("no event after %d checks", checked)
		}
		if m.Header.Get(session.HeaderControl) != "" {
			continue
		}
		ev := w.evs[len(w.evs)-1]
		rep, err := e.tryCmd(id, "alice", session.Command{Op: session.OpHistory, After: ev.Seq})
		if err == nil {
			err = rep.Err()
		}
		if err != nil {
			t.Fatalf("history after just-published seq %d: %v", ev.Seq, err)
		}
		if rep.LastSeq < ev.Seq {
			t.Fatalf("history says last_seq %d after seq %d was published", rep.LastSeq, ev.Seq)
		}
		checked++
	}
}

// TestHost_ReadsDoNotKeepAwake polls info and history faster than the
// hibernation timeout: the session still hibernates.
func TestHost_ReadsDoNotKeepAwake(t *testing.T) {
	e := newEnv(t, withHibernate(150*time.Millisecond))
	id := e.create("alice", shell())
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, ok := e.catalog(id)
		if ok && c.State == session.StateHibernated {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a session polled with info and history every 20ms never hibernated")
		}
		// Plain requests: once the session sleeps they find no responder
		// (as a gateway's GET would, which then reads the catalog).
		_, _ = e.request(e.subj.Cmd(id), "alice", session.Command{Op: session.OpInfo}, time.Second)
		_, _ = e.request(e.subj.Cmd(id), "alice", session.Command{Op: session.OpHistory}, time.Second)
		time.Sleep(20 * time.Millisecond) // the poll interval under test, not synchronization
	}
}
