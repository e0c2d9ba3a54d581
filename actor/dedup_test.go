package actor

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// messagesBy counts the message events of evs by user with clientID.
func messagesBy(evs []session.Event, user, clientID string) int {
	n := 0
	for _, ev := range evs {
		if ev.Kind != session.KindMessage || ev.By != user {
			continue
		}
		var d session.MessageData
		if json.Unmarshal(ev.Data, &d) == nil && d.ClientID == clientID {
			n++
		}
	}
	return n
}

// TestHost_PromptDedupAfterHibernation retries prompts after the session
// hibernated and woke: the retry gets the original seq and records nothing,
// whether the prompt was sent before the last wake or two wakes ago, while
// the same client_id from another user, or a new one, is a new prompt.
func TestHost_PromptDedupAfterHibernation(t *testing.T) {
	e := newEnv(t, withHibernate(200*time.Millisecond))
	id := e.create("alice", command("true"))
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	prompt := func(user, clientID string) session.Seq {
		t.Helper()
		rep := e.cmd(id, user, session.Command{Op: session.OpPrompt, Text: "echo " + clientID, ClientID: clientID})
		if rep.Error != nil || rep.Seq == 0 {
			t.Fatalf("prompt %s by %s: %+v", clientID, user, rep)
		}
		return rep.Seq
	}
	hibernate := func() {
		t.Helper()
		eventually(t, "session hibernated", func() bool { _, held := leaseOf(e.host, id); return !held })
	}
	first := prompt("alice", "c-1")
	hibernate()
	if got := prompt("alice", "c-1"); got != first {
		t.Errorf("retry after a wake got seq %d, want %d", got, first)
	}
	bob := prompt("bob", "c-1") // another user's client_id is another prompt
	if bob == first {
		t.Errorf("bob's prompt with alice's client_id got her seq %d", first)
	}
	fresh := prompt("alice", "c-2")
	if fresh == first || fresh == bob {
		t.Errorf("a new client_id got seq %d (alice's c-1 %d, bob's %d)", fresh, first, bob)
	}
	hibernate()
	for _, c := range []struct {
		user, clientID string
		want           session.Seq
	}{
		{"alice", "c-1", first}, // sent two wakes ago
		{"bob", "c-1", bob},
		{"alice", "c-2", fresh},
	} {
		if got := prompt(c.user, c.clientID); got != c.want {
			t.Errorf("%s's retry of %s after the second wake got seq %d, want %d", c.user, c.clientID, got, c.want)
		}
	}
	evs := decode(t, e.history(id, "alice"))
	checkContiguous(t, evs)
	for _, c := range []struct{ user, clientID string }{{"alice", "c-1"}, {"bob", "c-1"}, {"alice", "c-2"}} {
		if n := messagesBy(evs, c.user, c.clientID); n != 1 {
			t.Errorf("%d message events by %s with client_id %s, want 1; events:%s", n, c.user, c.clientID, summarize(evs))
		}
	}
}

// TestCluster_PromptDedupAfterTakeover retries a prompt, acknowledged by
// node a, on node b once node a died: node b, which took the session over,
// answers with the original seq and records no second prompt.
func TestCluster_PromptDedupAfterTakeover(t *testing.T) {
	c := newNATSCluster(t)
	prov := newProvider(t)
	store := blobtest.StartS3(t).Open(t, "checkpoints/")
	a := startNode(t, "a", c.url(0), prov, store, withReplicas(3))
	e := gatewayEnv(t, c.url(2))
	id := e.create("alice", shell())
	if rep := served(t, e, id, session.Command{Op: session.OpMember, User: "bob", Role: session.RoleDriver}); rep.Error != nil {
		t.Fatalf("add bob: %v", rep.Error)
	}
	p := session.Command{Op: session.OpPrompt, Text: "echo one", ClientID: "c-1"}
	first := served(t, e, id, p)
	if first.Error != nil || first.Seq == 0 {
		t.Fatalf("prompt: %+v", first)
	}
	waitTurn(t, e, id, 1)
	startNode(t, "b", c.url(1), prov, store, withReplicas(3))
	a.nc.Close()

	if rep := served(t, e, id, p); rep.Error != nil || rep.Seq != first.Seq {
		t.Errorf("retry on the new owner = %+v, want seq %d", rep, first.Seq)
	}
	rep, err := e.tryCmdWithin(id, "bob", p, 20*time.Second) // the session is active on node b now
	if err != nil || rep.Error != nil || rep.Seq == 0 || rep.Seq == first.Seq {
		t.Errorf("bob's prompt with alice's client_id = %+v, %v; want a new seq", rep, err)
	}
	fin, evs := waitTurn(t, e, id, 2)
	if fin.Status != session.TurnOK {
		t.Errorf("bob's turn finished %+v", fin)
	}
	checkContiguous(t, evs)
	if n := messagesBy(evs, "alice", "c-1"); n != 1 {
		t.Errorf("%d message events by alice with client_id c-1, want 1; events:%s", n, summarize(evs))
	}
	if n := messagesBy(evs, "bob", "c-1"); n != 1 {
		t.Errorf("%d message events by bob with client_id c-1, want 1; events:%s", n, summarize(evs))
	}
}

// TestRecentPrompts_Evict checks that the cache forgets its oldest prompt
// past recentWindow and then says the history must be asked.
func TestRecentPrompts_Evict(t *testing.T) {
	var r recentPrompts
	for i := range recentWindow {
		r.add(fmt.Sprintf("alice\x00c-%d", i), &recentPrompt{seq: session.Seq(i + 1), durable: true})
	}
	if r.partial || r.get("alice\x00c-0") == nil {
		t.Fatalf("full cache: partial %v, oldest %v", r.partial, r.get("alice\x00c-0"))
	}
	r.add("alice\x00c-new", &recentPrompt{seq: recentWindow + 1, durable: true})
	if !r.partial || r.get("alice\x00c-0") != nil || r.get("alice\x00c-1") == nil || r.get("alice\x00c-new") == nil {
		t.Errorf("after one more: partial %v, oldest %v, second %v, newest %v",
			r.partial, r.get("alice\x00c-0"), r.get("alice\x00c-1"), r.get("alice\x00c-new"))
	}
}
