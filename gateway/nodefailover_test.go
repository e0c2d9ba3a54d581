package gateway_test

// A command in flight to a node that dies: the node received it and will
// never answer. When the node's lease ends (deleted, or expired after its
// TTL) the gateway stops waiting: a command that is safe to repeat is sent
// again and answered by the node that takes the session over; any other is
// answered unavailable at once, saying it may or may not have been applied.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
)

// failoverRequestTimeout is the gateway's request timeout in these tests,
// and failoverClientTimeout the client's, far below it: a request that
// ends at all ended because the gateway failed it over.
const (
	failoverRequestTimeout = time.Minute
	failoverClientTimeout  = 30 * time.Second
)

// failoverSeries returns the value of name{label=value}, or -1 if there is
// no such series.
func failoverSeries(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// failoverResult is the outcome of failoverDo.
type failoverResult struct {
	code int
	body []byte
	err  error
}

// failoverDo makes a REST request as user with failoverClientTimeout; it
// may run off the test's goroutine.
func failoverDo(base, method, path, user, body string) failoverResult {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return failoverResult{err: err}
	}
	req.Header.Set("Authorization", "Bearer dev:"+user)
	resp, err := (&http.Client{Timeout: failoverClientTimeout}).Do(req)
	if err != nil {
		return failoverResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return failoverResult{code: resp.StatusCode, body: b, err: err}
}

// failoverEnv is a gateway with a long request timeout, a fake node that
// survives (it takes sessions over through the place queue group) and a
// session the survivor created and hibernated.
type failoverEnv struct {
	*env
	ctx     context.Context
	nc      *nats.Conn
	owners  jetstream.KeyValue
	catalog jetstream.KeyValue
	id      session.ID
}

func newFailoverEnv(t *testing.T) *failoverEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	subj := session.Subjects{}
	ns := startNATS(t)
	f := &failoverEnv{ctx: ctx, nc: connectNATS(t, ns)}
	f.env = &env{t: t, ns: ns, node: startFakeNode(t, connectNATS(t, ns), subj)}
	// The gateway starts before any node has created the owners bucket:
	// it creates it as a node would.
	f.gw, f.srv, f.reg = startGateway(t, ns, func(c *gateway.Config) { c.RequestTimeout = failoverRequestTimeout })
	eventually(t, "the gateway to watch the node leases", func() bool {
		return metric(t, f.reg, "atrium_gateway_node_lease_watch_up") == 1
	})
	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	// Opened as the nodes do (package actor, openOwners): their
	// configuration matches the bucket the gateway created.
	f.owners, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         subj.OwnersBucket(),
		Description:    "Atrium node leases, session ownership records and fencing tokens",
		Storage:        jetstream.FileStorage,
		LimitMarkerTTL: time.Minute,
	})
	if err != nil {
		t.Fatalf("open owners bucket as a node: %v", err)
	}
	if f.catalog, err = js.KeyValue(ctx, subj.CatalogBucket()); err != nil {
		t.Fatal(err)
	}
	f.id = f.create("alice", "doomed").ID
	f.node.Hibernate(f.id)
	eventually(t, "the gateway to see the session hibernated", func() bool {
		return failoverSeries(t, f.reg, "atrium_sessions", "state", string(session.StateHibernated)) == 1
	})
	return f
}

// moveTo writes the session's catalog entry as node would on activating it,
// and waits until the gateway has it.
func (f *failoverEnv) moveTo(node string) {
	f.t.Helper()
	ent, err := f.catalog.Get(f.ctx, string(f.id))
	if err != nil {
		f.t.Fatal(err)
	}
	var ce session.CatalogEntry
	if err := json.Unmarshal(ent.Value(), &ce); err != nil {
		f.t.Fatal(err)
	}
	ce.Node, ce.State = node, session.StateActive
	b, _ := json.Marshal(ce)
	if _, err := f.catalog.Put(f.ctx, string(f.id), b); err != nil {
		f.t.Fatal(err)
	}
	eventually(f.t, "the gateway to see the session active on "+node, func() bool {
		return failoverSeries(f.t, f.reg, "atrium_sessions", "state", string(session.StateActive)) == 1
	})
}

// deadNode subscribes to subj on its own connection as node and sends what
// it receives to the returned channel, never answering: the node dies
// handling it. kill closes the connection and ends the node's lease, by
// deleting it or, if expire, by a last renewal whose 1 s TTL runs out.
func (f *failoverEnv) deadNode(node, subj string) (got <-chan *nats.Msg, kill func(expire bool)) {
	f.t.Helper()
	ch := make(chan *nats.Msg, 4)
	nc := connectNATS(f.t, f.ns)
	if _, err := nc.Subscribe(subj, func(m *nats.Msg) { ch <- m }); err != nil {
		f.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		f.t.Fatal(err)
	}
	lease := session.NodeLeaseKey(node)
	return ch, func(expire bool) {
		f.t.Helper()
		nc.Close()
		eventually(f.t, node+"'s subscription to be gone", func() bool {
			_, err := f.nc.Request(subj, []byte(`{}`), 200*time.Millisecond)
			return errors.Is(err, nats.ErrNoResponders)
		})
		var err error
		if expire {
			_, err = f.owners.Create(f.ctx, lease, []byte(`{"node":"`+node+`"}`), jetstream.KeyTTL(time.Second))
		} else if _, err = f.owners.Put(f.ctx, lease, []byte(`{"node":"`+node+`"}`)); err == nil {
			err = f.owners.Delete(f.ctx, lease)
		}
		if err != nil {
			f.t.Fatalf("end the lease of %s: %v", node, err)
		}
	}
}

// survivorCmds returns the commands the surviving node received.
func (f *failoverEnv) survivorCmds() ([]session.Command, []session.Op) {
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	cmds := append([]session.Command(nil), f.node.cmds...)
	var ops []session.Op
	for _, c := range cmds {
		ops = append(ops, c.Op)
	}
	return cmds, ops
}

// await waits for a request started with failoverDo.
func (f *failoverEnv) await(done <-chan failoverResult, what string) failoverResult {
	f.t.Helper()
	r := <-done
	if r.err != nil {
		f.t.Fatalf("%s did not end within %v (the gateway waits %v for an answer): %v",
			what, failoverClientTimeout, failoverRequestTimeout, r.err)
	}
	return r
}

// TestGateway_NodeFailover: node-a serves a session and receives a command,
// then dies without answering. As soon as its lease ends, a command that is
// safe to repeat is sent again and answered by the node that takes the
// session over; any other is answered unavailable, saying it may or may not
// have been applied. Without the failover each would wait the gateway's
// request timeout (a minute here), longer than the client's.
func TestGateway_NodeFailover(t *testing.T) {
	for _, tc := range []struct {
		name         string
		method, path string // path after /v1/sessions/{id}
		body         string
		expire       bool // the lease expires (per-key TTL) instead of being deleted
		wantCode     int
		wantSurvivor session.Op // the op the node that took over must have received; "": none
	}{
		{name: "history is retried", method: "GET", path: "/events?after=0&limit=100",
			wantCode: http.StatusOK, wantSurvivor: session.OpHistory},
		{name: "history is retried when the lease expires", method: "GET", path: "/events?after=0&limit=100", expire: true,
			wantCode: http.StatusOK, wantSurvivor: session.OpHistory},
		{name: "prompt with client_id is retried", method: "POST", path: "/messages", body: `{"text":"hi","client_id":"c-1"}`, expire: true,
			wantCode: http.StatusAccepted, wantSurvivor: session.OpPrompt},
		{name: "prompt without client_id is unavailable", method: "POST", path: "/messages", body: `{"text":"hi"}`,
			wantCode: http.StatusServiceUnavailable},
		{name: "delete is unavailable", method: "DELETE", wantCode: http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFailoverEnv(t)
			got, kill := f.deadNode("node-a", session.Subjects{}.Cmd(f.id))
			f.moveTo("node-a")

			what := tc.method + " " + tc.path
			done := make(chan failoverResult, 1)
			go func() {
				done <- failoverDo(f.srv.URL, tc.method, "/v1/sessions/"+string(f.id)+tc.path, "alice", tc.body)
			}()
			var sent session.Command
			select {
			case m := <-got:
				if err := json.Unmarshal(m.Data, &sent); err != nil {
					t.Fatalf("node-a got %q: %v", m.Data, err)
				}
			case r := <-done:
				t.Fatalf("%s ended before node-a received it: %d %s %v", what, r.code, r.body, r.err)
			case <-f.ctx.Done():
				t.Fatalf("node-a never received %s", what)
			}
			kill(tc.expire)

			r := f.await(done, what)
			if r.code != tc.wantCode {
				t.Fatalf("%s after node-a died: %d %s, want %d", what, r.code, r.body, tc.wantCode)
			}
			retried := failoverSeries(t, f.reg, "atrium_gateway_node_failovers_total", "result", "retried")
			unavailable := failoverSeries(t, f.reg, "atrium_gateway_node_failovers_total", "result", "unavailable")
			if want := tc.wantSurvivor != ""; want && (retried != 1 || unavailable != 0) || !want && (retried != 0 || unavailable != 1) {
				t.Errorf("failovers: retried %v, unavailable %v; want the command retried: %v", retried, unavailable, want)
			}
			cmds, ops := f.survivorCmds()
			if tc.wantSurvivor == "" {
				if len(cmds) != 0 || f.node.Activations() != 0 {
					t.Errorf("the surviving node got commands %v and %d activations, want none: the command must not be repeated",
						ops, f.node.Activations())
				}
				if code := errCode(t, r.body); code != session.CodeUnavailable {
					t.Errorf("error code %q, want unavailable", code)
				}
				var eb session.ErrorBody
				_ = json.Unmarshal(r.body, &eb)
				for _, want := range []string{"stopped while handling the " + string(sent.Op), "may or may not have been applied", "check the session's history"} {
					if !strings.Contains(eb.Error.Message, want) {
						t.Errorf("message %q does not say %q", eb.Error.Message, want)
					}
				}
				return
			}
			if len(cmds) != 1 || cmds[0].Op != tc.wantSurvivor || f.node.Activations() != 1 {
				t.Fatalf("the surviving node got commands %v and %d activations, want one %s after activating the session",
					ops, f.node.Activations(), tc.wantSurvivor)
			}
			switch tc.wantSurvivor {
			case session.OpPrompt:
				if cmds[0].ClientID != sent.ClientID || cmds[0].Text != sent.Text {
					t.Errorf("the retried prompt is %+v, want the one node-a got: %+v", cmds[0], sent)
				}
				var ack struct{ Seq session.Seq }
				if err := json.Unmarshal(r.body, &ack); err != nil || ack.Seq != 2 {
					t.Errorf("prompt answer %s, want seq 2 (after session_created)", r.body)
				}
			case session.OpHistory:
				var page struct{ Events []json.RawMessage }
				if err := json.Unmarshal(r.body, &page); err != nil {
					t.Fatalf("decode history: %v: %s", err, r.body)
				}
				evs := make([][]byte, len(page.Events))
				for i, ev := range page.Events {
					evs[i] = ev
				}
				if len(evs) != 1 {
					t.Fatalf("%d events, want the surviving node's one: %s", len(evs), r.body)
				}
				checkSeqs(t, evs, 1, 1)
			}
		})
	}
}

// TestGateway_NodeFailoverWhileActivating: the session's catalog entry names
// node-a, which receives the activation on its own place subject and dies
// without answering. When its lease ends the gateway asks the queue group,
// and the surviving node activates the session and answers the command.
func TestGateway_NodeFailoverWhileActivating(t *testing.T) {
	f := newFailoverEnv(t)
	got, kill := f.deadNode("node-a", session.Subjects{}.PlaceOn("node-a"))
	f.moveTo("node-a") // as if node-a had woken the session and let it hibernate

	what := "POST /messages"
	done := make(chan failoverResult, 1)
	go func() {
		done <- failoverDo(f.srv.URL, "POST", "/v1/sessions/"+string(f.id)+"/messages", "alice", `{"text":"hi"}`)
	}()
	select {
	case m := <-got:
		var req session.PlaceRequest
		if err := json.Unmarshal(m.Data, &req); err != nil || req.Op != session.PlaceActivate || req.Session != f.id {
			t.Fatalf("node-a got %s, want the activation of %s", m.Data, f.id)
		}
	case r := <-done:
		t.Fatalf("%s ended before node-a received the activation: %d %s %v", what, r.code, r.body, r.err)
	case <-f.ctx.Done():
		t.Fatal("node-a never received the activation")
	}
	kill(false)

	r := f.await(done, what)
	if r.code != http.StatusAccepted {
		t.Fatalf("%s after node-a died activating the session: %d %s, want 202", what, r.code, r.body)
	}
	if cmds, ops := f.survivorCmds(); len(cmds) != 1 || cmds[0].Op != session.OpPrompt || f.node.Activations() != 1 {
		t.Fatalf("the surviving node got commands %v and %d activations, want the prompt once after activating the session",
			ops, f.node.Activations())
	}
	if miss := affinityCount(t, f.reg, "miss"); miss != 1 {
		t.Errorf("%v affinity misses, want 1: node-a was asked and died", miss)
	}
}

// TestGateway_NodeFailoverWebSocket: a prompt frame published straight to
// the session's actor (the connection's fast path) whose node dies before
// answering: with a client_id it is sent again and acknowledged by the node
// that takes the session over; without one the frame gets an unavailable
// error saying it may or may not have been applied.
func TestGateway_NodeFailoverWebSocket(t *testing.T) {
	for _, tc := range []struct {
		name     string
		clientID string
	}{
		{name: "prompt with client_id is retried", clientID: "w-1"},
		{name: "prompt without client_id is unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFailoverEnv(t)
			ws := f.dial(f.id, "alice", 0)
			ws.nextOf(session.FrameHello)
			f.node.Hibernate(f.id)
			// moveTo waits for the session to look active again: first see
			// it hibernated, or the wait would pass on the stale entry.
			eventually(t, "the gateway to see the session hibernated", func() bool {
				return failoverSeries(t, f.reg, "atrium_sessions", "state", string(session.StateHibernated)) == 1
			})
			got, kill := f.deadNode("node-a", session.Subjects{}.Cmd(f.id))
			f.moveTo("node-a")

			ws.send(map[string]any{"type": "prompt", "text": "hi", "client_id": tc.clientID})
			// The connection's own catch-up reads may reach node-a too:
			// wait for the prompt.
			for prompt := false; !prompt; {
				select {
				case m := <-got:
					var c session.Command
					prompt = json.Unmarshal(m.Data, &c) == nil && c.Op == session.OpPrompt
				case <-f.ctx.Done():
					t.Fatal("node-a never received the prompt frame's command")
				}
			}
			kill(false)
			if tc.clientID != "" {
				ack := ws.find(session.FrameAck)
				if ack["client_id"] != tc.clientID || ack["seq"] == nil {
					t.Fatalf("ack %v, want one for %s", ack, tc.clientID)
				}
				var prompts []session.Command
				cmds, ops := f.survivorCmds()
				for _, c := range cmds {
					if c.Op == session.OpPrompt {
						prompts = append(prompts, c)
					}
				}
				if len(prompts) != 1 || prompts[0].ClientID != tc.clientID {
					t.Fatalf("the surviving node got %v, want the prompt once", ops)
				}
				return
			}
			e := ws.find(session.FrameError)
			if e["code"] != string(session.CodeUnavailable) || !strings.Contains(e["message"].(string), "may or may not have been applied") {
				t.Fatalf("error frame %v, want unavailable saying the prompt may or may not have been applied", e)
			}
			for _, c := range func() []session.Command { c, _ := f.survivorCmds(); return c }() {
				if c.Op == session.OpPrompt {
					t.Fatal("the prompt without client_id was sent again")
				}
			}
		})
	}
}
