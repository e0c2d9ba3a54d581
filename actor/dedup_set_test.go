package actor

import (
	"fmt"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestHost_PromptDedupPastTheWindow sends more prompts than the actor
// remembers in one activation, so that every new client_id is looked up in
// the history (and the history starts answering from its prompt set): a
// retry of a forgotten prompt still gets its original seq, and nothing is
// recorded twice.
func TestHost_PromptDedupPastTheWindow(t *testing.T) {
	e := newEnv(t)
	id := e.create("alice", command("sleep", "3600")) // the first turn holds; later prompts only queue
	prompt := func(clientID string) session.Seq {
		t.Helper()
		rep := e.cmd(id, "alice", session.Command{Op: session.OpPrompt, Text: "p " + clientID, ClientID: clientID})
		if rep.Error != nil || rep.Seq == 0 {
			t.Fatalf("prompt %s: %+v", clientID, rep)
		}
		return rep.Seq
	}
	seqs := map[string]session.Seq{}
	// Past the first recentWindow prompts every new one is looked up; the
	// history builds its prompt set a few lookups in, and later prompts
	// are added to it as they commit. The second recentWindow pushes those
	// out of the actor's memory too.
	n := 2*recentWindow + 64
	for i := range n {
		cid := fmt.Sprintf("c-%d", i)
		seqs[cid] = prompt(cid)
	}
	late := fmt.Sprintf("c-%d", recentWindow+40) // committed after the set was built, then forgotten
	for _, cid := range []string{"c-0", "c-1", "c-63", late, fmt.Sprintf("c-%d", n-1)} {
		if got := prompt(cid); got != seqs[cid] {
			t.Errorf("retry of %s got seq %d, want %d", cid, got, seqs[cid])
		}
	}
	if s := prompt("c-new"); s <= seqs[fmt.Sprintf("c-%d", n-1)] {
		t.Errorf("a new client_id got seq %d, not a new one", s)
	}
	evs := decode(t, e.history(id, "alice"))
	checkContiguous(t, evs)
	for _, cid := range []string{"c-0", "c-1", "c-63", late, "c-new"} {
		if got := messagesBy(evs, "alice", cid); got != 1 {
			t.Errorf("%d message events with client_id %s, want 1", got, cid)
		}
	}
}
