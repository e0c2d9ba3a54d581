package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/gateway/client/clienttest"
	"github.com/atriumhq/atrium/session"
)

// fastOpts reconnects quickly so tests do not wait for real backoff.
var fastOpts = client.WatchOptions{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}

// watched is what a test consumer saw of a stream.
type watched struct {
	seqs       []session.Seq
	hellos     []client.Frame
	reconnects []client.Frame
	others     []client.Frame
}

// readUntil consumes st until it has delivered the event with seq until,
// checking that events arrive exactly once in order.
func readUntil(tb testing.TB, st *client.Stream, w *watched, until session.Seq) {
	tb.Helper()
	readFor(tb, st, w, func() bool { return len(w.seqs) > 0 && w.seqs[len(w.seqs)-1] >= until })
}

// readFor consumes st until cond holds, checking that events arrive exactly
// once in order.
func readFor(tb testing.TB, st *client.Stream, w *watched, cond func() bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !cond() {
		f, err := st.Next(ctx)
		if err != nil {
			tb.Fatalf("Next after seqs %v: %v", w.seqs, err)
		}
		switch f.Type {
		case session.FrameEvent:
			if f.Event == nil || len(f.Raw) == 0 {
				tb.Fatalf("event frame without event: %+v", f)
			}
			if n := len(w.seqs); n > 0 && f.Event.Seq != w.seqs[n-1]+1 {
				tb.Fatalf("event %d after %d: not exactly once in order", f.Event.Seq, w.seqs[n-1])
			}
			w.seqs = append(w.seqs, f.Event.Seq)
		case session.FrameHello:
			w.hellos = append(w.hellos, f)
		case client.FrameReconnecting:
			w.reconnects = append(w.reconnects, f)
		default:
			w.others = append(w.others, f)
		}
	}
}

func newSession(tb testing.TB, c *client.Client) session.Session {
	tb.Helper()
	s, err := c.CreateSession(testContext(tb), client.CreateRequest{Title: "t"})
	if err != nil {
		tb.Fatalf("CreateSession: %v", err)
	}
	return s
}

func appendN(srv *clienttest.Server, id session.ID, n int) {
	for i := range n {
		srv.Append(id, session.KindOutput, session.BySystem, session.OutputData{Turn: 1, Stream: "stdout", Text: fmt.Sprintf("line %d\n", i)})
	}
}

func TestWatch_HistoryThenLive(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL, "alice")
	s := newSession(t, c)
	appendN(srv, s.ID, 4) // seqs 2..5

	st, err := c.Watch(testContext(t), s.ID, 2, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	var w watched
	readUntil(t, st, &w, 5)
	if w.seqs[0] != 3 {
		t.Fatalf("first event %d, want 3 (after=2)", w.seqs[0])
	}
	if len(w.hellos) != 1 || w.hellos[0].After != 2 || w.hellos[0].Hello.LastSeq != 5 ||
		w.hellos[0].Hello.You.User != "alice" || w.hellos[0].Hello.You.Role != session.RoleOwner || w.hellos[0].Hello.Session.ID != s.ID {
		t.Fatalf("hello = %+v", w.hellos)
	}
	appendN(srv, s.ID, 3) // live: 6..8
	readUntil(t, st, &w, 8)
	if st.LastSeq() != 8 {
		t.Errorf("LastSeq = %d, want 8", st.LastSeq())
	}
	if st.Err() != nil {
		t.Errorf("Err of a running stream = %v", st.Err())
	}
}

func TestWatch_ReconnectResumes(t *testing.T) {
	for name, brk := range map[string]func(*clienttest.Server){
		"network drop":  func(s *clienttest.Server) { s.DropConnections() },
		"going away":    func(s *clienttest.Server) { s.CloseConnections(websocket.StatusGoingAway, "restarting") },
		"slow consumer": func(s *clienttest.Server) { s.CloseConnections(session.CloseSlowConsumer, "slow consumer") },
		"normal close":  func(s *clienttest.Server) { s.CloseConnections(websocket.StatusNormalClosure, "") },
	} {
		t.Run(name, func(t *testing.T) {
			srv := clienttest.New(t, clienttest.Options{})
			c := newClient(t, srv.URL, "alice")
			s := newSession(t, c)
			st, err := c.Watch(testContext(t), s.ID, 0, fastOpts)
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			defer st.Close()
			var w watched
			readUntil(t, st, &w, 1)
			for round := range 3 {
				appendN(srv, s.ID, 5)
				readUntil(t, st, &w, srv.LastSeq(s.ID))
				brk(srv)
				appendN(srv, s.ID, 2) // while the client is (being) disconnected
				readFor(t, st, &w, func() bool {
					return len(w.hellos) == round+2 && w.seqs[len(w.seqs)-1] == srv.LastSeq(s.ID)
				})
			}
			if len(w.reconnects) < 3 || len(w.hellos) < 4 {
				t.Fatalf("saw %d reconnects and %d hellos, want at least 3 and 4", len(w.reconnects), len(w.hellos))
			}
			for _, h := range w.hellos[1:] {
				if h.After < 1 {
					t.Errorf("a resumed hello has After %d, want the last seq seen", h.After)
				}
			}
			for _, r := range w.reconnects {
				if r.Reconnect == nil || r.Reconnect.Err == nil || r.Reconnect.Attempt < 1 {
					t.Errorf("reconnecting frame = %+v", r.Reconnect)
				}
			}
		})
	}
}

func TestWatch_DedupesReplayedEvents(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	srv.SetFaults(clienttest.Faults{DuplicateOnResume: 4})
	c := newClient(t, srv.URL, "alice")
	s := newSession(t, c)
	appendN(srv, s.ID, 9)
	st, err := c.Watch(testContext(t), s.ID, 3, fastOpts) // the first connection replays 4 old events too
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	var w watched
	readUntil(t, st, &w, 10)
	srv.DropConnections()
	appendN(srv, s.ID, 5)
	readUntil(t, st, &w, 15) // readUntil fails on any duplicate
	if w.seqs[0] != 4 || len(w.seqs) != 12 {
		t.Fatalf("seqs = %v, want 4..15 once each", w.seqs)
	}
}

func TestWatch_GapTriggersResume(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL, "alice")
	s := newSession(t, c)
	st, err := c.Watch(testContext(t), s.ID, 0, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	var w watched
	readUntil(t, st, &w, 1)
	srv.SetFaults(clienttest.Faults{SkipLive: 1})
	appendN(srv, s.ID, 3) // seq 2 never reaches the socket; 3 is a gap
	readUntil(t, st, &w, 4)
	if len(w.reconnects) != 1 {
		t.Fatalf("reconnects = %d, want 1 (for the gap)", len(w.reconnects))
	}
	if err := w.reconnects[0].Reconnect.Err; err == nil || w.reconnects[0].After != 1 {
		t.Fatalf("gap reconnect = %+v, want an error and After 1", w.reconnects[0])
	}
}

func TestWatch_RetriesUnavailable(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL, "alice")
	s := newSession(t, c)
	st, err := c.Watch(testContext(t), s.ID, 0, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	var w watched
	readUntil(t, st, &w, 1)
	srv.SetFaults(clienttest.Faults{RejectWS: 3})
	srv.DropConnections()
	appendN(srv, s.ID, 1)
	readUntil(t, st, &w, 2)
	if len(w.reconnects) != 4 {
		t.Fatalf("reconnects = %d, want 4 (the drop and 3 rejected attempts)", len(w.reconnects))
	}
	last := w.reconnects[3].Reconnect
	if last.Attempt != 4 || !errors.Is(last.Err, session.ErrUnavailable) {
		t.Fatalf("4th reconnect = %+v, want attempt 4 after unavailable", last)
	}
}

func TestWatch_Terminal(t *testing.T) {
	t.Run("not found on first connect", func(t *testing.T) {
		srv := clienttest.New(t, clienttest.Options{})
		c := newClient(t, srv.URL, "alice")
		_, err := c.Watch(testContext(t), "s_nope", 0, fastOpts)
		if !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("Watch(unknown) = %v, want not_found", err)
		}
	})
	t.Run("bad token", func(t *testing.T) {
		srv := clienttest.New(t, clienttest.Options{})
		s := newSession(t, newClient(t, srv.URL, "alice"))
		c := newClient(t, srv.URL, "alice")
		c.Token = "nonsense"
		_, err := c.Watch(testContext(t), s.ID, 0, fastOpts)
		if !errors.Is(err, session.ErrUnauthenticated) {
			t.Fatalf("Watch with a bad token = %v, want unauthenticated", err)
		}
	})
	t.Run("deleted while watching", func(t *testing.T) {
		srv := clienttest.New(t, clienttest.Options{})
		c := newClient(t, srv.URL, "alice")
		s := newSession(t, c)
		st, err := c.Watch(testContext(t), s.ID, 0, fastOpts)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		defer st.Close()
		if err := c.DeleteSession(testContext(t), s.ID); err != nil {
			t.Fatalf("DeleteSession: %v", err)
		}
		var last error
		for f := range st.Frames() {
			if f.Type == session.FrameError {
				last = &session.Error{Code: f.Error.Code, Message: f.Error.Message}
			}
		}
		if !errors.Is(st.Err(), session.ErrNotFound) {
			t.Fatalf("stream ended with %v, want not_found", st.Err())
		}
		if !errors.Is(last, session.ErrNotFound) {
			t.Errorf("last error frame = %v, want not_found", last)
		}
	})
	t.Run("epoch changed", func(t *testing.T) {
		srv := clienttest.New(t, clienttest.Options{})
		c := newClient(t, srv.URL, "alice")
		s := newSession(t, c)
		opts := fastOpts
		opts.Epoch = "another-epoch"
		_, err := c.Watch(testContext(t), s.ID, 1, opts)
		if !errors.Is(err, client.ErrEpochChanged) {
			t.Fatalf("Watch with a stale epoch = %v, want ErrEpochChanged", err)
		}
		opts.Epoch = s.Epoch
		st, err := c.Watch(testContext(t), s.ID, 1, opts)
		if err != nil {
			t.Fatalf("Watch with the right epoch: %v", err)
		}
		st.Close()
	})
	t.Run("gives up after MaxAttempts", func(t *testing.T) {
		srv := clienttest.New(t, clienttest.Options{})
		c := newClient(t, srv.URL, "alice")
		s := newSession(t, c)
		opts := fastOpts
		opts.MaxAttempts = 2
		st, err := c.Watch(testContext(t), s.ID, 0, opts)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		defer st.Close()
		srv.Close()
		n := 0
		for f := range st.Frames() {
			if f.Type == client.FrameReconnecting {
				n++
			}
		}
		if n != 2 || st.Err() == nil || client.Terminal(st.Err()) {
			t.Fatalf("after the server went away: %d reconnecting frames, Err %v; want 2 and a network error", n, st.Err())
		}
	})
}

// wsServer serves handler for the WebSocket path of session s_1 only.
func wsServer(t *testing.T, handler func(w http.ResponseWriter, r *http.Request)) *client.Client {
	hs := httptest.NewServer(http.HandlerFunc(handler))
	t.Cleanup(hs.Close)
	return newClient(t, hs.URL, "alice")
}

func TestWatch_ProtocolViolations(t *testing.T) {
	for name, tc := range map[string]struct {
		handler func(w http.ResponseWriter, r *http.Request)
		check   func(error) bool
	}{
		"error frame before hello": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{session.Subprotocol}})
				if err != nil {
					return
				}
				defer c.CloseNow()
				b, _ := json.Marshal(session.ErrorFrame{Type: session.FrameError, Code: session.CodeForbidden, Message: "no"})
				_ = c.Write(r.Context(), websocket.MessageText, b)
				c.Close(websocket.StatusNormalClosure, "")
			},
			check: func(err error) bool { return errors.Is(err, session.ErrForbidden) },
		},
		"no subprotocol": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				c, err := websocket.Accept(w, r, nil)
				if err != nil {
					return
				}
				c.CloseNow()
			},
			check: client.Terminal,
		},
		"not a websocket": {
			handler: func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<html>hi</html>")) },
			check:   client.Terminal,
		},
		"first frame is an event": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{session.Subprotocol}})
				if err != nil {
					return
				}
				defer c.CloseNow()
				_ = c.Write(r.Context(), websocket.MessageText, []byte(`{"type":"event","event":{"seq":1}}`))
				c.Close(websocket.StatusNormalClosure, "")
			},
			check: client.Terminal,
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := wsServer(t, tc.handler)
			st, err := c.Watch(testContext(t), "s_1", 0, fastOpts)
			if err == nil {
				st.Close()
				t.Fatal("Watch succeeded")
			}
			if !tc.check(err) {
				t.Fatalf("Watch error = %v", err)
			}
		})
	}
}

func TestWatch_SendsAuthAndResumePoint(t *testing.T) {
	type seen struct{ auth, after, proto string }
	got := make(chan seen, 1)
	c := wsServer(t, func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Get("Authorization"), r.URL.Query().Get("after"), r.Header.Get("Sec-WebSocket-Protocol")}
		http.Error(w, `{"error":{"code":"not_found","message":"gone"}}`, http.StatusNotFound)
	})
	_, err := c.Watch(testContext(t), "s_1", 42, fastOpts)
	if !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("Watch = %v, want not_found", err)
	}
	s := <-got
	if s.auth != "Bearer dev:alice" || s.after != "42" || s.proto != session.SubprotocolBatch+","+session.Subprotocol {
		t.Fatalf("handshake = %+v", s)
	}
}

func TestStream_PromptAckAndErrors(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	alice := newClient(t, srv.URL, "alice")
	bob := newClient(t, srv.URL, "bob")
	s := newSession(t, alice)
	if err := alice.SetMember(testContext(t), s.ID, "bob", session.RoleViewer); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	st, err := alice.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	if err := st.Prompt(ctx, "hello", "c-1"); err != nil {
		t.Fatalf("Prompt: %v", err)
	}
	var ack *session.AckFrame
	var msg *session.Event
	var outputs []string
	var finished *session.TurnFinishedData
	for finished == nil {
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		switch {
		case f.Ack != nil:
			ack = f.Ack
		case f.Event != nil && f.Event.Kind == session.KindMessage:
			msg = f.Event
		case f.Event != nil && f.Event.Kind == session.KindOutput:
			var od session.OutputData
			_ = json.Unmarshal(f.Event.Data, &od)
			outputs = append(outputs, od.Text)
		case f.Event != nil && f.Event.Kind == session.KindTurnFinished:
			finished = new(session.TurnFinishedData)
			_ = json.Unmarshal(f.Event.Data, finished)
		}
	}
	if ack == nil || ack.ClientID != "c-1" || msg == nil || ack.Seq != msg.Seq {
		t.Fatalf("ack %+v, message %+v: want an ack for c-1 at the message's seq", ack, msg)
	}
	if len(outputs) != 1 || outputs[0] != "hello\n" || finished.Status != session.TurnOK {
		t.Fatalf("outputs %q, finished %+v", outputs, finished)
	}

	// A viewer's prompt gets error forbidden with its client_id.
	bst, err := bob.Watch(ctx, s.ID, st.LastSeq(), fastOpts)
	if err != nil {
		t.Fatalf("bob Watch: %v", err)
	}
	defer bst.Close()
	if err := bst.Prompt(ctx, "let me", "b-1"); err != nil {
		t.Fatalf("bob Prompt: %v", err)
	}
	for {
		f, err := bst.Next(ctx)
		if err != nil {
			t.Fatalf("bob Next: %v", err)
		}
		if f.Error != nil {
			if f.Error.Code != session.CodeForbidden || f.Error.ClientID != "b-1" {
				t.Fatalf("viewer prompt error = %+v", f.Error)
			}
			break
		}
		if f.Ack != nil {
			t.Fatalf("a viewer's prompt was acked: %+v", f.Ack)
		}
	}
	if err := bst.Prompt(ctx, string(make([]byte, session.MaxTextBytes+1)), "b-2"); !errors.Is(err, session.ErrPayloadTooLarge) {
		t.Fatalf("huge Prompt = %v, want payload_too_large before sending", err)
	}
}

func TestStream_ApproveAndCancel(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{Harness: func(ctx context.Context, turn *clienttest.Turn) int {
		if turn.Prompt == "block" {
			<-ctx.Done()
			return -1
		}
		return clienttest.EchoHarness(ctx, turn)
	}})
	c := newClient(t, srv.URL, "alice")
	s := newSession(t, c)
	ctx := testContext(t)
	st, err := c.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()

	next := func(kind session.Kind) session.Event {
		t.Helper()
		for {
			f, err := st.Next(ctx)
			if err != nil {
				t.Fatalf("Next waiting for %s: %v", kind, err)
			}
			if f.Error != nil {
				t.Fatalf("error frame waiting for %s: %+v", kind, f.Error)
			}
			if f.Event != nil && f.Event.Kind == kind {
				return *f.Event
			}
		}
	}
	if err := st.Prompt(ctx, "ask", "p1"); err != nil {
		t.Fatal(err)
	}
	var ar session.ApprovalRequestedData
	_ = json.Unmarshal(next(session.KindApprovalRequested).Data, &ar)
	if ar.ID != "a1" {
		t.Fatalf("approval requested = %+v", ar)
	}
	if err := st.Approve(ctx, ar.ID, false); err != nil {
		t.Fatalf("Approve: %v", err)
	}
	var res session.ApprovalResolvedData
	_ = json.Unmarshal(next(session.KindApprovalResolved).Data, &res)
	var fin session.TurnFinishedData
	_ = json.Unmarshal(next(session.KindTurnFinished).Data, &fin)
	if res.Allow || res.ID != "a1" || fin.Status != session.TurnFailed || fin.ExitCode != 1 {
		t.Fatalf("deny: resolved %+v, finished %+v", res, fin)
	}

	if err := st.Prompt(ctx, "block", "p2"); err != nil {
		t.Fatal(err)
	}
	next(session.KindTurnStarted)
	if err := st.Cancel(ctx); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	_ = json.Unmarshal(next(session.KindTurnFinished).Data, &fin)
	if fin.Status != session.TurnCancelled {
		t.Fatalf("cancelled turn finished %+v", fin)
	}
}

func TestStream_PromptWaitsForReconnect(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL, "alice")
	s := newSession(t, c)
	ctx := testContext(t)
	// A one-frame buffer: after the reconnect, the stream is blocked on
	// this consumer, which prompts instead of reading.
	opts := client.WatchOptions{MinBackoff: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Buffer: 1}
	st, err := c.Watch(ctx, s.ID, 0, opts)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	srv.DropConnections()
	// Wait until the stream knows it is disconnected (the reconnecting
	// frame is dropped when the one-frame buffer is full; the next hello
	// is not).
	for hellos := 0; hellos < 2; {
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f.Type == session.FrameHello {
			hellos++
		}
		if f.Type == client.FrameReconnecting {
			break
		}
	}
	appendN(srv, s.ID, 5)
	if err := st.Prompt(ctx, "after the drop", "late"); err != nil {
		t.Fatalf("Prompt while reconnecting: %v", err)
	}
	for {
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f.Ack != nil {
			if f.Ack.ClientID != "late" {
				t.Fatalf("ack = %+v", f.Ack)
			}
			break
		}
	}
}

func TestStream_Presence(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	alice := newClient(t, srv.URL, "alice")
	bob := newClient(t, srv.URL, "bob")
	s := newSession(t, alice)
	if err := alice.SetMember(testContext(t), s.ID, "bob", session.RoleDriver); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	st, err := alice.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	bst, err := bob.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatal(err)
	}
	for {
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f.Presence != nil && len(f.Presence.Watchers) == 2 {
			users := map[string]bool{}
			for _, w := range f.Presence.Watchers {
				users[w.User] = w.Conn != "" && !w.Since.IsZero()
			}
			if !users["alice"] || !users["bob"] {
				t.Fatalf("watchers = %+v", f.Presence.Watchers)
			}
			break
		}
	}
	bst.Close()
	for {
		f, err := st.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f.Presence != nil && len(f.Presence.Watchers) == 1 && f.Presence.Watchers[0].User == "alice" {
			break
		}
	}
}

func TestStream_CloseAndContext(t *testing.T) {
	srv := clienttest.New(t, clienttest.Options{})
	c := newClient(t, srv.URL, "alice")
	s := newSession(t, c)

	st, err := c.Watch(testContext(t), s.ID, 0, fastOpts)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return srv.Watchers(s.ID) == 1 })
	st.Close()
	st.Close()
	if !errors.Is(st.Err(), client.ErrClosed) {
		t.Fatalf("Err after Close = %v, want ErrClosed", st.Err())
	}
	if err := st.Prompt(testContext(t), "x", "y"); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Prompt after Close = %v, want ErrClosed", err)
	}
	waitFor(t, func() bool { return srv.Watchers(s.ID) == 0 })

	ctx, cancel := context.WithCancel(context.Background())
	st, err = c.Watch(ctx, s.ID, 0, fastOpts)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-st.Done()
	if !errors.Is(st.Err(), context.Canceled) {
		t.Fatalf("Err after cancel = %v, want context.Canceled", st.Err())
	}
	st.Close()
}
