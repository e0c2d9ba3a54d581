package gateway_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
)

// sseClient reads an SSE stream.
type sseClient struct {
	t      testing.TB
	resp   *http.Response
	lines  chan string // lines read; closed at the end of the stream
	cancel context.CancelFunc
}

type sseEvent struct {
	id, kind, data string
}

func (e *env) stream(id session.ID, user string, hdr http.Header, query string) *sseClient {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/sessions/"+string(id)+"/events"+query, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer dev:"+user)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		e.t.Fatalf("stream: %v", err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		e.t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	c := &sseClient{t: e.t, resp: resp, lines: make(chan string, 1024), cancel: cancel}
	done := make(chan struct{})
	go func() { // owned: the cleanup waits for it.
		defer close(done)
		defer close(c.lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		resp.Body.Close()
		<-done
	})
	return c
}

func (c *sseClient) line() (string, bool) {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		return l, ok
	case <-time.After(waitTimeout):
		c.t.Fatal("no SSE line in time")
	}
	return "", false
}

// next returns the next event, skipping comments.
func (c *sseClient) next() sseEvent {
	c.t.Helper()
	var ev sseEvent
	for {
		l, ok := c.line()
		if !ok {
			c.t.Fatal("stream ended")
		}
		switch {
		case l == "":
			if ev.id != "" {
				return ev
			}
		case strings.HasPrefix(l, ":"):
		case strings.HasPrefix(l, "id: "):
			ev.id = l[4:]
		case strings.HasPrefix(l, "event: "):
			ev.kind = l[7:]
		case strings.HasPrefix(l, "data: "):
			ev.data += l[6:]
		default:
			c.t.Fatalf("unexpected SSE line %q", l)
		}
	}
}

// ended waits for the server to end the stream.
func (c *sseClient) ended() {
	c.t.Helper()
	for {
		if _, ok := c.line(); !ok {
			return
		}
	}
}

func TestSSE_Stream(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "sse")
	e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "<hi>"})
	c := e.stream(s.ID, "alice", nil, "")
	committed := e.node.Events(s.ID)
	for i := range 2 {
		ev := c.next()
		if ev.id != strconv.Itoa(i+1) || ev.data != string(committed[i]) {
			t.Fatalf("event %d: %+v\nwant %s", i, ev, committed[i])
		}
	}
	e.node.Append(s.ID, session.KindTurnFinished, session.TurnFinishedData{Turn: 1, Status: session.TurnOK})
	ev := c.next()
	committed = e.node.Events(s.ID)
	if ev.id != "3" || ev.kind != "turn_finished" || ev.data != string(committed[2]) {
		t.Fatalf("live event %+v", ev)
	}
}

func TestSSE_Errors(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "sse errors")
	hdr := http.Header{"Accept": {"text/event-stream"}}
	for name, c := range map[string]struct {
		path, lastID string
		code         int
	}{
		"after beyond":       {"/v1/sessions/" + string(s.ID) + "/events?after=5", "", 400},
		"last-id beyond":     {"/v1/sessions/" + string(s.ID) + "/events", "7", 400},
		"bad last-id":        {"/v1/sessions/" + string(s.ID) + "/events", "x", 400},
		"unknown session":    {"/v1/sessions/s_missing/events", "", 404},
		"malformed session":  {"/v1/sessions/no.pe/events", "", 404},
		"last-id wins (ok)!": {"/v1/sessions/" + string(s.ID) + "/events?after=99", "1", 200},
	} {
		t.Run(name, func(t *testing.T) {
			h := hdr.Clone()
			if c.lastID != "" {
				h.Set("Last-Event-ID", c.lastID)
			}
			if c.code == 200 {
				e.stream(s.ID, "alice", h, "?after=99")
				return
			}
			code, body := callURL(t, e.srv.URL, "GET", c.path, "alice", nil, h)
			if code != c.code {
				t.Fatalf("got %d %s", code, body)
			}
			errCode(t, body)
		})
	}
}

func TestSSE_ResumeWhileProducing(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "sse resume")
	tokens := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for range tokens {
			for range 30 {
				e.node.Append(s.ID, session.KindOutput, session.OutputData{Turn: 1, Stream: "stdout", Text: "tick"})
			}
		}
	})
	last := 0
	for range 8 {
		tokens <- struct{}{}
		c := e.stream(s.ID, "alice", http.Header{"Last-Event-ID": {strconv.Itoa(last)}}, "")
		for range 25 {
			ev := c.next()
			if ev.id != strconv.Itoa(last+1) {
				t.Fatalf("got id %s after %d", ev.id, last)
			}
			last++
		}
		c.cancel()
	}
	close(tokens)
	wg.Wait()
	total := len(e.node.Events(s.ID))
	c := e.stream(s.ID, "alice", http.Header{"Last-Event-ID": {strconv.Itoa(last)}}, "")
	for last < total {
		if ev := c.next(); ev.id != strconv.Itoa(last+1) {
			t.Fatalf("got id %s after %d", ev.id, last)
		}
		last++
	}
}

func TestSSE_Heartbeat(t *testing.T) {
	e := newEnv(t, func(c *gateway.Config) { c.Heartbeat = 10 * time.Millisecond })
	s := e.create("alice", "beat")
	c := e.stream(s.ID, "alice", nil, "")
	c.next()
	for {
		l, ok := c.line()
		if !ok {
			t.Fatal("stream ended")
		}
		if l == ": heartbeat" {
			return
		}
	}
}

func TestSSE_Ends(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "sse end")
	e.member(s.ID, "alice", "bob", session.RoleViewer)

	t.Run("member removed", func(t *testing.T) {
		c := e.stream(s.ID, "bob", nil, "?after=2")
		e.member(s.ID, "alice", "bob", session.RoleNone)
		if ev := c.next(); ev.kind != "member_changed" {
			t.Fatalf("event %+v", ev)
		}
		c.ended()
	})
	t.Run("session deleted", func(t *testing.T) {
		c := e.stream(s.ID, "alice", nil, "")
		c.next()
		if code, body := e.call("DELETE", "/v1/sessions/"+string(s.ID), "alice", nil); code != 204 {
			t.Fatalf("delete: %d %s", code, body)
		}
		c.ended()
	})
}
