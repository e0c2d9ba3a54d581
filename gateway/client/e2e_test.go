package client_test

// End-to-end tests of the SDK against the real stack: an embedded
// nats-server, a node (package actor) with SQLite histories and bubblewrap
// sandboxes, and the real gateway behind httptest, all in-process.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// stack is a running gateway + node + NATS.
type stack struct {
	URL string
	nc  *nats.Conn
	gw  atomic.Pointer[gateway.Server] // the gateway serving now
	log *slog.Logger
}

// histories adapts *sqlite.Dir to actor.Histories.

func startStack(tb testing.TB) *stack {
	tb.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		tb.Skip("bubblewrap is not installed (make test installs it)")
	}
	dir := tb.TempDir()
	log := slog.New(slog.DiscardHandler)
	ns, err := natsserver.NewServer(&natsserver.Options{
		DontListen: true, JetStream: true, StoreDir: filepath.Join(dir, "nats"), NoSigs: true, NoLog: true,
	})
	if err != nil {
		tb.Fatalf("nats server: %v", err)
	}
	ns.Start()
	tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		tb.Fatalf("connect nats: %v", err)
	}
	tb.Cleanup(nc.Close)

	prov, err := local.New(local.Config{Dir: filepath.Join(dir, "sandboxes"), Logger: log})
	if err != nil {
		tb.Fatalf("local provider: %v", err)
	}
	tb.Cleanup(func() { _ = prov.Close(context.Background()) })

	host, err := actor.New(actor.Config{
		NATS:      nc,
		Histories: actor.HistoriesOf(&sqlite.Dir{Path: filepath.Join(dir, "history"), Logger: log}),
		Provider:  prov,
		NodeID:    "test",
		Logger:    log,
	})
	if err != nil {
		tb.Fatalf("actor.New: %v", err)
	}
	if err := host.Start(context.Background()); err != nil {
		tb.Fatalf("host.Start: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := host.Close(ctx); err != nil {
			tb.Errorf("host.Close: %v", err)
		}
	})

	st := &stack{nc: nc, log: log}
	st.restartGateway(tb)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.gw.Load().Handler().ServeHTTP(w, r)
	}))
	tb.Cleanup(hs.Close)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.gw.Load().Close(ctx)
	})
	st.URL = hs.URL
	return st
}

// restartGateway replaces the serving gateway with a new one on the same
// NATS, closing the old one as a gateway restart would (its WebSockets get
// 1001 going away).
func (st *stack) restartGateway(tb testing.TB) {
	tb.Helper()
	gw, err := gateway.New(gateway.Config{NATS: st.nc, Auth: &auth.Dev{}, Logger: st.log})
	if err != nil {
		tb.Fatalf("gateway.New: %v", err)
	}
	old := st.gw.Swap(gw)
	if old != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := old.Close(ctx); err != nil {
			tb.Fatalf("close old gateway: %v", err)
		}
	}
}

// cuttable is an SDK client whose TCP connections the test can cut, like a
// network failure.
type cuttable struct {
	*client.Client
	mu    sync.Mutex
	conns []net.Conn // guarded by mu
}

func newCuttable(tb testing.TB, server, user string) *cuttable {
	tb.Helper()
	c := &cuttable{Client: newClient(tb, server, user)}
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err == nil {
			c.mu.Lock()
			c.conns = append(c.conns, conn)
			c.mu.Unlock()
		}
		return conn, err
	}}
	c.HTTP = &http.Client{Transport: tr}
	tb.Cleanup(tr.CloseIdleConnections)
	return c
}

func (c *cuttable) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

func e2eContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestE2E_PromptWatchResume(t *testing.T) {
	stk := startStack(t)
	ctx := e2eContext(t)
	alice := newCuttable(t, stk.URL, "alice")

	s, err := alice.CreateSession(ctx, client.CreateRequest{Title: "e2e"})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	if s.Owner != "alice" || s.Role != session.RoleOwner || s.Epoch == "" {
		t.Fatalf("session = %+v", s)
	}
	st, err := alice.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()

	// Every event the stream delivers, to compare with history at the end.
	var seen []json.RawMessage
	record := func(f client.Frame) {
		if f.Event != nil {
			if n := len(seen); f.Event.Seq != session.Seq(n+1) {
				t.Fatalf("event %d delivered after %d events", f.Event.Seq, n)
			}
			seen = append(seen, append(json.RawMessage(nil), f.Raw...))
		}
	}
	next := func() client.Frame {
		t.Helper()
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		record(f)
		return f
	}
	if f := next(); f.Hello == nil || f.Hello.You.User != "alice" || f.Hello.Session.ID != s.ID {
		t.Fatalf("first frame = %+v, want hello", f)
	}

	seq, err := alice.Send(ctx, s.ID, "echo hello from $ATRIUM_SESSION", "c1")
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	wrapped := &recordingStream{st: st, record: record}
	out, fin := wrapped.turn(t, ctx, seq)
	if out != "hello from "+string(s.ID)+"\n" || fin.Status != session.TurnOK || fin.ExitCode != 0 {
		t.Fatalf("turn 1: output %q, finished %+v", out, fin)
	}

	// Cut the network under a running turn: the stream reconnects and
	// resumes, and the consumer still sees every event exactly once.
	seq, err = alice.Send(ctx, s.ID, "for i in 1 2 3 4 5; do echo line $i; sleep 0.05; done", "c2")
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	cutDone := false
	out, fin = wrapped.turnWith(t, ctx, seq, func(ev session.Event) {
		if !cutDone && ev.Kind == session.KindOutput {
			cutDone = true
			alice.cut()
		}
	})
	if out != "line 1\nline 2\nline 3\nline 4\nline 5\n" || fin.Status != session.TurnOK {
		t.Fatalf("turn 2 across a cut: output %q, finished %+v", out, fin)
	}
	if wrapped.reconnects == 0 {
		t.Fatal("the cut connection was not noticed")
	}

	// Restart the gateway (1001 going away): a new gateway serves the
	// resumed stream; the node and its history are untouched.
	stk.restartGateway(t)
	seq, err = alice.Send(ctx, s.ID, "echo after restart", "c3")
	if err != nil {
		t.Fatalf("Send after gateway restart: %v", err)
	}
	before := wrapped.reconnects
	out, fin = wrapped.turn(t, ctx, seq)
	if out != "after restart\n" || fin.Status != session.TurnOK {
		t.Fatalf("turn 3 after a gateway restart: output %q, finished %+v", out, fin)
	}
	if wrapped.reconnects == before {
		t.Fatal("the gateway restart did not make the stream reconnect")
	}

	// What the stream delivered is byte for byte the history.
	var history []json.RawMessage
	for after := session.Seq(0); ; {
		page, err := alice.Events(ctx, s.ID, after, 0)
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		history = append(history, page.Raw...)
		if len(page.Events) == 0 {
			break
		}
		after = page.Events[len(page.Events)-1].Seq
	}
	if len(history) < len(seen) {
		t.Fatalf("history has %d events, the stream delivered %d", len(history), len(seen))
	}
	for i := range seen {
		if string(seen[i]) != string(history[i]) {
			t.Fatalf("event %d differs:\nstream  %s\nhistory %s", i+1, seen[i], history[i])
		}
	}
}

// recordingStream follows turns on a stream, recording every frame.
type recordingStream struct {
	st         *client.Stream
	record     func(client.Frame)
	reconnects int
}

func (r *recordingStream) turn(tb testing.TB, ctx context.Context, seq session.Seq) (string, session.TurnFinishedData) {
	return r.turnWith(tb, ctx, seq, nil)
}

func (r *recordingStream) turnWith(tb testing.TB, ctx context.Context, seq session.Seq, onEvent func(session.Event)) (string, session.TurnFinishedData) {
	return r.turnOf(tb, ctx, func() session.Seq { return seq }, onEvent)
}

// turnOf follows the stream until the turn of the prompt at seq() finishes
// and returns its stdout and its turn_finished data. seq is asked when a
// turn starts, so it may be learnt from the frames on the way.
func (r *recordingStream) turnOf(tb testing.TB, ctx context.Context, seq func() session.Seq, onEvent func(session.Event)) (string, session.TurnFinishedData) {
	tb.Helper()
	var turn int64
	var out strings.Builder
	for {
		f, err := r.st.Next(ctx)
		if err != nil {
			tb.Fatalf("Next waiting for the turn of seq %d: %v (output so far %q)", seq(), err, out.String())
		}
		r.record(f)
		if f.Type == client.FrameReconnecting {
			r.reconnects++
		}
		if f.Event == nil {
			continue
		}
		ev := *f.Event
		if onEvent != nil {
			onEvent(ev)
		}
		var head struct {
			Turn      int64       `json:"turn"`
			PromptSeq session.Seq `json:"prompt_seq"`
		}
		_ = json.Unmarshal(ev.Data, &head)
		if ev.Kind == session.KindTurnStarted && head.PromptSeq == seq() {
			turn = head.Turn
		}
		if turn == 0 || head.Turn != turn {
			continue
		}
		switch ev.Kind {
		case session.KindOutput:
			var d session.OutputData
			_ = json.Unmarshal(ev.Data, &d)
			if d.Stream == "stdout" {
				out.WriteString(d.Text)
			}
		case session.KindTurnFinished:
			var d session.TurnFinishedData
			_ = json.Unmarshal(ev.Data, &d)
			return out.String(), d
		}
	}
}

// approvalHarness asks for approval "deploy" and exits 0 if allowed, 4 if
// denied.
var approvalHarness = []string{"bash", "-c", `
read -r first
echo '{"type":"approval_request","id":"deploy","summary":"ship it?"}'
read -r answer
case "$answer" in
  *'"allow":true'*) echo shipped; exit 0 ;;
  *) echo held; exit 4 ;;
esac`}

func TestE2E_ApprovalsAndRoles(t *testing.T) {
	stk := startStack(t)
	ctx := e2eContext(t)
	alice := newClient(t, stk.URL, "alice")
	bob := newClient(t, stk.URL, "bob")

	s, err := alice.CreateSession(ctx, client.CreateRequest{Title: "approvals", Harness: session.Harness{Command: approvalHarness}})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	if _, err := bob.GetSession(ctx, s.ID); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("a stranger's GetSession = %v, want not_found", err)
	}
	if _, err := bob.Watch(ctx, s.ID, 0, fastOpts); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("a stranger's Watch = %v, want not_found", err)
	}
	if err := alice.SetMember(ctx, s.ID, "bob", session.RoleViewer); err != nil {
		t.Fatalf("SetMember: %v", err)
	}

	st, err := alice.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	bst, err := bob.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatalf("bob Watch: %v", err)
	}
	defer bst.Close()

	// A viewer's prompt over the WebSocket is refused with its client_id.
	if err := bst.Prompt(ctx, "echo sneaky", "b1"); err != nil {
		t.Fatalf("bob Prompt: %v", err)
	}
	for {
		f, err := bst.Next(ctx)
		if err != nil {
			t.Fatalf("bob Next: %v", err)
		}
		if f.Ack != nil {
			t.Fatalf("a viewer's prompt was acked: %+v", f.Ack)
		}
		if f.Error != nil {
			if f.Error.Code != session.CodeForbidden || f.Error.ClientID != "b1" {
				t.Fatalf("viewer prompt error = %+v", f.Error)
			}
			break
		}
	}

	// Prompt over the WebSocket: ack, then approval over the WebSocket.
	if err := st.Prompt(ctx, "deploy", "a1"); err != nil {
		t.Fatalf("Prompt: %v", err)
	}
	var ackSeq, msgSeq session.Seq
	approvals := 0
	rs := &recordingStream{st: st, record: func(f client.Frame) {
		if f.Ack != nil && f.Ack.ClientID == "a1" {
			ackSeq = f.Ack.Seq
		}
		if f.Event != nil && f.Event.Kind == session.KindMessage {
			var d session.MessageData
			_ = json.Unmarshal(f.Event.Data, &d)
			if d.ClientID == "a1" {
				msgSeq = f.Event.Seq
			}
		}
		if f.Event != nil && f.Event.Kind == session.KindApprovalRequested {
			approvals++
			var d session.ApprovalRequestedData
			_ = json.Unmarshal(f.Event.Data, &d)
			if d.ID != "deploy" || d.Summary != "ship it?" {
				t.Errorf("approval request = %+v", d)
			}
			// First turn: allow over the WebSocket; second: deny over REST.
			var err error
			if approvals == 1 {
				err = st.Approve(ctx, d.ID, true)
			} else {
				err = alice.Approve(ctx, s.ID, d.ID, false)
			}
			if err != nil {
				t.Errorf("approve: %v", err)
			}
		}
	}}
	out, fin := rs.turnOf(t, ctx, func() session.Seq { return msgSeq }, nil)
	if out != "shipped\n" || fin.Status != session.TurnOK {
		t.Fatalf("allowed turn: output %q, finished %+v", out, fin)
	}
	for ackSeq == 0 {
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("Next waiting for the ack: %v", err)
		}
		rs.record(f)
	}
	if ackSeq != msgSeq {
		t.Fatalf("ack names seq %d, the message event is %d", ackSeq, msgSeq)
	}
	seq, err := alice.Send(ctx, s.ID, "deploy again", "")
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	out, fin = rs.turn(t, ctx, seq)
	if out != "held\n" || fin.Status != session.TurnFailed || fin.ExitCode != 4 {
		t.Fatalf("denied turn: output %q, finished %+v", out, fin)
	}
	if approvals != 2 {
		t.Fatalf("saw %d approval requests, want 2", approvals)
	}

	// Deleting the session ends every stream with not_found.
	if err := alice.DeleteSession(ctx, s.ID); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	for range bst.Frames() {
	}
	if !errors.Is(bst.Err(), session.ErrNotFound) {
		t.Fatalf("bob's stream after delete ended with %v, want not_found", bst.Err())
	}
}
