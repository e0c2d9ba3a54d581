package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
	"github.com/coder/websocket"
)

func TestWS_HelloHistoryLive(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "ws")
	e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "one"})
	e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "two"})

	c := e.dial(s.ID, "alice", 1)
	hello := c.next()
	if hello["type"] != session.FrameHello || hello["last_seq"] != 3.0 {
		t.Fatalf("first frame %v", hello)
	}
	var h session.HelloFrame
	b, _ := json.Marshal(hello)
	if err := json.Unmarshal(b, &h); err != nil || h.Session.ID != s.ID || h.You.User != "alice" || h.You.Role != session.RoleOwner {
		t.Fatalf("hello %+v", h)
	}
	checkSeqs(t, c.events(2), 2, 3)
	e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "three"})
	checkSeqs(t, c.events(1), 4, 4)

	c.send(map[string]string{"type": "prompt", "text": "hi", "client_id": "k1"})
	ack, ev := c.ackAndEvent()
	if ack["client_id"] != "k1" || ack["seq"] != 5.0 {
		t.Fatalf("ack %v", ack)
	}
	if seqOf(t, ev) != 5 || !strings.Contains(string(ev), `"client_id":"k1"`) {
		t.Fatalf("message event %s", ev)
	}
}

func TestWS_BadFrames(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "frames")
	e.member(s.ID, "alice", "bob", session.RoleViewer)
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	c.events(2)

	check := func(t *testing.T, frame any, code session.Code, clientID string) {
		t.Helper()
		c.send(frame)
		f := c.nextOf(session.FrameError)
		if f["code"] != string(code) || f["message"] == "" {
			t.Fatalf("error frame %v, want %s", f, code)
		}
		if got, _ := f["client_id"].(string); got != clientID {
			t.Fatalf("client_id %q, want %q", got, clientID)
		}
	}
	stillWorks := func(t *testing.T, c *wsClient, id string) {
		t.Helper()
		c.send(map[string]string{"type": "prompt", "text": "ok", "client_id": id})
		if ack, _ := c.ackAndEvent(); ack["client_id"] != id {
			t.Fatalf("ack %v", ack)
		}
	}

	t.Run("malformed JSON", func(t *testing.T) {
		check(t, `{"type":"prompt",`, session.CodeBadRequest, "")
		stillWorks(t, c, "after-malformed")
	})
	t.Run("wrong field type keeps client_id", func(t *testing.T) {
		check(t, `{"type":"prompt","text":5,"client_id":"w1"}`, session.CodeBadRequest, "w1")
	})
	t.Run("unknown type", func(t *testing.T) {
		check(t, map[string]string{"type": "dance", "client_id": "u1"}, session.CodeBadRequest, "u1")
		stillWorks(t, c, "after-unknown")
	})
	t.Run("empty prompt", func(t *testing.T) {
		check(t, map[string]string{"type": "prompt", "client_id": "e1"}, session.CodeBadRequest, "e1")
	})
	t.Run("approve without allow", func(t *testing.T) {
		check(t, map[string]string{"type": "approve", "id": "a1"}, session.CodeBadRequest, "")
	})
	t.Run("binary frame", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := c.c.Write(ctx, websocket.MessageBinary, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		if f := c.nextOf(session.FrameError); f["code"] != string(session.CodeBadRequest) {
			t.Fatalf("error frame %v", f)
		}
	})
	t.Run("viewer prompt", func(t *testing.T) {
		v := e.dial(s.ID, "bob", 0)
		if h := v.nextOf(session.FrameHello); h["you"].(map[string]any)["role"] != "viewer" {
			t.Fatalf("hello %v", h)
		}
		v.send(map[string]string{"type": "prompt", "text": "let me", "client_id": "v1"})
		f := v.find(session.FrameError)
		if f["code"] != string(session.CodeForbidden) || f["client_id"] != "v1" {
			t.Fatalf("error frame %v", f)
		}
		v.send(map[string]string{"type": "cancel"})
		if f := v.find(session.FrameError); f["code"] != string(session.CodeForbidden) {
			t.Fatalf("error frame %v", f)
		}
	})
	t.Run("frame over 1 MiB", func(t *testing.T) {
		big := e.dial(s.ID, "alice", 0)
		big.nextOf(session.FrameHello)
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = big.c.Write(ctx, websocket.MessageText, []byte(`{"type":"prompt","text":"`+strings.Repeat("x", session.MaxFrameBytes)+`"}`))
		if ce := big.closed(); ce.Code != websocket.StatusMessageTooBig {
			t.Fatalf("close %v, want 1009", ce)
		}
	})
}

func TestWS_Handshake(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.OriginPatterns = []string{"trusted.example"} })
	s := e.create("alice", "handshake")

	for name, c := range map[string]struct {
		id   session.ID
		user string
		path string
		hdr  http.Header
		code int
	}{
		"unknown session": {id: "s_unknown", user: "alice", code: 404},
		"no role":         {id: s.ID, user: "mallory", code: 404},
		"no credentials":  {id: s.ID, code: 401},
		"cross origin":    {id: s.ID, user: "alice", hdr: http.Header{"Origin": {"http://evil.example"}}, code: 403},
		"bad after":       {id: s.ID, user: "alice", path: "?after=x", code: 400},
		"wrong protocol":  {id: s.ID, user: "alice", hdr: http.Header{"Sec-Websocket-Protocol": {"other.v9"}}, code: 400},
	} {
		t.Run(name, func(t *testing.T) {
			h := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
				"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
			for k, v := range c.hdr {
				h[k] = v
			}
			path := "/v1/sessions/" + string(c.id) + "/ws" + c.path
			code, body := callURL(t, e.srv.URL, "GET", path, c.user, nil, h)
			if code != c.code {
				t.Fatalf("got %d %s, want %d", code, body, c.code)
			}
			errCode(t, body)
		})
	}
	t.Run("trusted origin", func(t *testing.T) {
		c, _, err := dialRaw(t, e.srv.URL, s.ID, "alice", 0, http.Header{"Origin": {"https://trusted.example"}})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		w := readWS(t, c)
		w.nextOf(session.FrameHello)
	})
	t.Run("after beyond last_seq", func(t *testing.T) {
		c := e.dial(s.ID, "alice", 99)
		f := c.next()
		if f["type"] != session.FrameError || f["code"] != string(session.CodeBadRequest) {
			t.Fatalf("first frame %v", f)
		}
		if ce := c.closed(); ce.Code != websocket.StatusPolicyViolation {
			t.Fatalf("close %v", ce)
		}
	})
}

func TestWS_RoleFollowsMemberChanges(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "roles")
	e.member(s.ID, "alice", "bob", session.RoleDriver)
	c := e.dial(s.ID, "bob", 2)
	if h := c.nextOf(session.FrameHello); h["you"].(map[string]any)["role"] != "driver" {
		t.Fatalf("hello %v", h)
	}
	c.send(map[string]string{"type": "prompt", "text": "as driver", "client_id": "d1"})
	c.ackAndEvent()

	e.member(s.ID, "alice", "bob", session.RoleViewer)
	if ev := c.events(1); !strings.Contains(string(ev[0]), `"kind":"member_changed"`) {
		t.Fatalf("event %s", ev[0])
	}
	c.send(map[string]string{"type": "prompt", "text": "as viewer", "client_id": "d2"})
	if f := c.nextOf(session.FrameError); f["code"] != string(session.CodeForbidden) || f["client_id"] != "d2" {
		t.Fatalf("error frame %v", f)
	}

	e.member(s.ID, "alice", "bob", session.RoleNone)
	if ev := c.events(1); !strings.Contains(string(ev[0]), `"role":""`) {
		t.Fatalf("event %s", ev[0])
	}
	if ce := c.closed(); ce.Code != websocket.StatusPolicyViolation || ce.Reason != "access revoked" {
		t.Fatalf("close %v", ce)
	}
}

func TestWS_SlowConsumer(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.SendQueue = 8 })
	s := e.create("alice", "slow")
	// Small socket buffers on both ends, so a client that does not read
	// backs the gateway up after a few events.
	srv := httptest.NewUnstartedServer(e.gw.Handler())
	srv.Listener = smallBuffers{srv.Listener}
	srv.Start()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10) })
	}}
	conn, _, err := websocket.Dial(ctx, wsURL(srv.URL, s.ID, 0), &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}},
		HTTPHeader:   http.Header{"Authorization": {"Bearer dev:alice"}},
		Subprotocols: []string{session.Subprotocol},
	})
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(-1)
	// Produce big events while the client reads nothing, until the gateway
	// gives up on it.
	text := strings.Repeat("x", 32<<10)
	i := 0
	for ; metric(t, e.reg, "atrium_gateway_slow_consumer_disconnects_total") == 0; i++ {
		if i > 5000 {
			t.Fatal("never closed as a slow consumer")
		}
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: text})
	}
	// Read what was sent before the close; it is a gap-free prefix.
	c := readWS(t, conn)
	c.nextOf(session.FrameHello)
	var got []session.Seq
	for {
		f := <-c.ch
		if f.err != nil {
			var ce websocket.CloseError
			if !errors.As(f.err, &ce) || ce.Code != session.CloseSlowConsumer || ce.Reason != "slow consumer" {
				t.Fatalf("ended with %v, want 1008 slow consumer", f.err)
			}
			break
		}
		var fr struct {
			Type  string
			Event json.RawMessage
		}
		_ = json.Unmarshal(f.raw, &fr)
		if fr.Type == session.FrameEvent {
			got = append(got, seqOf(t, fr.Event))
		}
	}
	for i, seq := range got {
		if seq != session.Seq(i+1) {
			t.Fatalf("events before the close: %v", got)
		}
	}
	// Resume by cursor: the rest arrives, nothing twice.
	last := session.Seq(len(got))
	total := session.Seq(len(e.node.Events(s.ID)))
	r := e.dial(s.ID, "alice", last)
	r.nextOf(session.FrameHello)
	checkSeqs(t, r.events(int(total-last)), last+1, total)
}

// smallBuffers gives accepted connections a small send buffer.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// TestWS_ResumeWhileProducing reconnects repeatedly while events are being
// produced; every connection must see a gap-free, duplicate-free sequence
// from its resume point.
func TestWS_ResumeWhileProducing(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "resume")
	// Each token makes the producer append a burst of events while the
	// client reconnects and reads.
	tokens := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for range tokens {
			for range 30 {
				e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "tick"})
			}
		}
	})
	last := session.Seq(0)
	for range 10 {
		tokens <- struct{}{}
		c := e.dial(s.ID, "alice", last)
		c.nextOf(session.FrameHello)
		checkSeqs(t, c.events(25), last+1, last+25)
		last += 25
		_ = c.c.Close(websocket.StatusNormalClosure, "")
	}
	close(tokens)
	wg.Wait()
	total := session.Seq(len(e.node.Events(s.ID)))
	c := e.dial(s.ID, "alice", last)
	c.nextOf(session.FrameHello)
	checkSeqs(t, c.events(int(total-last)), last+1, total)
}

func TestWS_GapRefetch(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "gap")
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	c.events(1)
	e.node.DropNext(2) // committed, never published
	for i := 0; i < 3; i++ {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "x"})
	}
	checkSeqs(t, c.events(3), 2, 4)
	if metric(t, e.reg, "atrium_gateway_gap_refetches_total") < 1 {
		t.Fatal("gap refetch not counted")
	}
}

func TestWS_ByteIdenticalStreams(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", `<title> & "quotes" ü`)
	a := e.dial(s.ID, "alice", 0)
	b := e.dial(s.ID, "alice", 0)
	a.nextOf(session.FrameHello)
	b.nextOf(session.FrameHello)
	for _, text := range []string{"<script>", "a & b", "ünïcødé \u2028", `"quoted"`, "\x01"} {
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: text})
	}
	wa, wb := a.events(6), b.events(6)
	code, body := e.call("GET", "/v1/sessions/"+string(s.ID)+"/events", "alice", nil)
	var page struct{ Events []json.RawMessage }
	if code != 200 || json.Unmarshal(body, &page) != nil {
		t.Fatalf("events: %d %s", code, body)
	}
	committed := e.node.Events(s.ID)
	for i := range committed {
		if string(wa[i]) != string(committed[i]) || string(wb[i]) != string(committed[i]) || string(page.Events[i]) != string(committed[i]) {
			t.Fatalf("event %d differs:\nnode %s\nws1  %s\nws2  %s\nrest %s", i, committed[i], wa[i], wb[i], page.Events[i])
		}
	}
}

func TestWS_Presence(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "presence")
	e.member(s.ID, "alice", "bob", session.RoleViewer)
	e.member(s.ID, "alice", "carol", session.RoleViewer)
	// A second gateway on the same NATS system.
	_, srv2, _ := startGateway(t, e.ns)

	users := func(f map[string]any) []string {
		var us []string
		for _, w := range f["watchers"].([]any) {
			us = append(us, w.(map[string]any)["user"].(string))
		}
		slices.Sort(us)
		return us
	}
	waitFor := func(c *wsClient, want ...string) {
		t.Helper()
		for {
			f := c.next()
			if f["type"] == session.FramePresence && slices.Equal(users(f), want) {
				return
			}
		}
	}
	a := e.dial(s.ID, "alice", 0)
	waitFor(a, "alice")
	b := e.dial(s.ID, "bob", 0)
	waitFor(a, "alice", "bob")
	waitFor(b, "alice", "bob")
	c := dialURL(t, srv2.URL, s.ID, "carol", 0)
	waitFor(c, "alice", "bob", "carol")
	waitFor(a, "alice", "bob", "carol")
	_ = b.c.Close(websocket.StatusNormalClosure, "")
	waitFor(a, "alice", "carol")
	waitFor(c, "alice", "carol")
}

// TestWS_PresenceExpires: another gateway's list counts until it is not
// refreshed within the TTL.
func TestWS_PresenceExpires(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.PresenceInterval = 20 * time.Millisecond
		// Long enough that a loaded machine sends the frame with the
		// ghost before the ghost expires (it is published only once).
		c.PresenceTTL = time.Second
	})
	s := e.create("alice", "ghosts")
	a := e.dial(s.ID, "alice", 0)
	waitUsers := func(want ...string) {
		t.Helper()
		for {
			f := a.next()
			if f["type"] != session.FramePresence {
				continue
			}
			var got []string
			for _, w := range f["watchers"].([]any) {
				got = append(got, w.(map[string]any)["user"].(string))
			}
			slices.Sort(got)
			if slices.Equal(got, want) {
				return
			}
		}
	}
	waitUsers("alice")
	ghost, _ := json.Marshal(session.PresenceMessage{Gateway: "gw_ghost", Watchers: []session.Watcher{
		{User: "ghost", Conn: "c_ghost", Since: session.Time{Time: time.Now()}},
	}})
	nc := connectNATS(t, e.ns)
	if err := nc.Publish(session.Subjects{}.Presence(s.ID), ghost); err != nil {
		t.Fatal(err)
	}
	waitUsers("alice", "ghost")
	waitUsers("alice") // the ghost gateway never refreshes its list.
}

func TestWS_SessionDeleted(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "doomed")
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	if code, body := e.call("DELETE", "/v1/sessions/"+string(s.ID), "alice", nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if ce := c.closed(); ce.Code != websocket.StatusNormalClosure || ce.Reason != "session deleted" {
		t.Fatalf("close %v", ce)
	}
}

func TestWS_ServerClose(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "shutdown")
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	done := make(chan error, 1)
	go func() { // owned: the result is received below.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		done <- e.gw.Close(ctx)
	}()
	if ce := c.closed(); ce.Code != websocket.StatusGoingAway || ce.Reason != "server shutting down: reconnect" {
		t.Fatalf("close %v", ce)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code, body := e.call("GET", "/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz after close: %d %s", code, body)
	}
}

// TestWS_PipelinedPrompts: prompts sent without waiting for their acks are
// all acknowledged once, and appended in the order their frames arrived,
// whether the session is active or has to be woken by the first of them.
func TestWS_PipelinedPrompts(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "pipeline")
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	c.events(1)

	round := func(t *testing.T, name string, n int) {
		t.Helper()
		first := session.Seq(len(e.node.Events(s.ID)) + 1)
		for i := range n {
			c.send(map[string]string{"type": "prompt", "text": "pipelined", "client_id": name + strconv.Itoa(i)})
		}
		acks := map[string]session.Seq{}
		for len(acks) < n {
			f := c.next()
			if f["type"] != session.FrameAck {
				if f["type"] == session.FrameError {
					t.Fatalf("error frame %v", f)
				}
				continue
			}
			id := f["client_id"].(string)
			if _, dup := acks[id]; dup {
				t.Fatalf("two acks for %s", id)
			}
			acks[id] = session.Seq(f["seq"].(float64))
		}
		for i := range n {
			if got, want := acks[name+strconv.Itoa(i)], first+session.Seq(i); got != want {
				t.Fatalf("prompt %d appended at %d, want %d: frames were reordered", i, got, want)
			}
		}
		evs := e.node.Events(s.ID)
		for i := range n {
			if ev := evs[int(first)-1+i]; !strings.Contains(string(ev), `"client_id":"`+name+strconv.Itoa(i)+`"`) {
				t.Fatalf("event %d is %s", int(first)+i, ev)
			}
		}
	}
	t.Run("active", func(t *testing.T) { round(t, "a", 100) })
	t.Run("hibernated", func(t *testing.T) {
		e.node.Hibernate(s.ID)
		before := e.node.Activations()
		round(t, "h", 40)
		if e.node.Activations() == before || !e.node.Active(s.ID) {
			t.Fatal("the session was not woken")
		}
	})
	t.Run("active again", func(t *testing.T) { round(t, "b", 50) })
}

// TestWS_WriteTimeout: a client that stops reading is disconnected when a
// write to it stalls for the write timeout, however long its queue.
func TestWS_WriteTimeout(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) {
		c.WriteTimeout = 200 * time.Millisecond
		c.SendQueue = 1 << 20
	})
	s := e.create("alice", "stalled")
	srv := httptest.NewUnstartedServer(e.gw.Handler())
	srv.Listener = smallBuffers{srv.Listener}
	srv.Start()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10) })
	}}
	conn, _, err := websocket.Dial(ctx, wsURL(srv.URL, s.ID, 0), &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}},
		HTTPHeader:   http.Header{"Authorization": {"Bearer dev:alice"}},
		Subprotocols: []string{session.Subprotocol},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	eventually(t, "the watcher to join", func() bool { return metric(t, e.reg, "atrium_gateway_watchers") == 1 })
	text := strings.Repeat("x", 32<<10)
	for range 40 { // far more than the socket buffers hold
		e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: text})
	}
	eventually(t, "the stalled watcher to be closed", func() bool { return metric(t, e.reg, "atrium_gateway_watchers") == 0 })
	if n := metric(t, e.reg, "atrium_gateway_slow_consumer_disconnects_total"); n != 0 {
		t.Fatalf("closed as a slow consumer (%v), not by the write timeout", n)
	}
}
