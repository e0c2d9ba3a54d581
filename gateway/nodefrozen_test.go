package gateway_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// TestGateway_NodeFailoverFrozen: node-a serves a session, receives a
// command and freezes (SIGSTOP): it keeps its connection and so its
// subscription, and never answers. When its lease ends the gateway sends
// the command again, which reaches only the frozen node until another node
// has taken the session over (the rescue, here a place request a moment
// later); the command is then answered by that node, well before the
// gateway's request timeout. Before, the retry followed node-a again, whose
// lease had already ended, and waited the whole request timeout (issue 21).
func TestGateway_NodeFailoverFrozen(t *testing.T) {
	f := newFailoverEnv(t)
	subj := session.Subjects{}
	got := make(chan *nats.Msg, 64)
	frozen := connectNATS(t, f.ns)
	if _, err := frozen.ChanSubscribe(subj.Cmd(f.id), got); err != nil {
		t.Fatal(err)
	}
	if err := frozen.Flush(); err != nil {
		t.Fatal(err)
	}
	f.moveTo("node-a")

	done := make(chan failoverResult, 1)
	start := time.Now()
	go func() {
		done <- failoverDo(f.srv.URL, "GET", "/v1/sessions/"+string(f.id)+"/events?after=0&limit=100", "alice", "")
	}()
	select {
	case <-got:
	case r := <-done:
		t.Fatalf("history ended before node-a received it: %d %s %v", r.code, r.body, r.err)
	case <-f.ctx.Done():
		t.Fatal("node-a never received the history request")
	}
	// node-a's lease ends; its connection (and subscription) stays.
	lease := session.NodeLeaseKey("node-a")
	if _, err := f.owners.Put(f.ctx, lease, []byte(`{"node":"node-a"}`)); err != nil {
		t.Fatal(err)
	}
	if err := f.owners.Delete(f.ctx, lease); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the gateway to send the command again", func() bool {
		return failoverSeries(t, f.reg, "atrium_gateway_node_failovers_total", "result", "retried") == 1
	})
	// The retry reached only the frozen node. Another node takes the
	// session over, as the rescue does.
	select {
	case <-got:
	case <-f.ctx.Done():
		t.Fatal("the retry never reached the frozen node")
	}
	req, _ := json.Marshal(session.PlaceRequest{Op: session.PlaceActivate, Session: f.id})
	if _, err := f.nc.Request(subj.Place(), req, 5*time.Second); err != nil {
		t.Fatalf("activate on the surviving node: %v", err)
	}

	r := f.await(done, "history")
	if r.code != http.StatusOK {
		t.Fatalf("history after node-a froze: %d %s", r.code, r.body)
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("history answered after %v; want a moment after the takeover, far below the request timeout", took.Round(time.Millisecond))
	}
	if _, ops := f.survivorCmds(); len(ops) == 0 || ops[len(ops)-1] != session.OpHistory {
		t.Errorf("the surviving node got %v, want the history command", ops)
	}
}
