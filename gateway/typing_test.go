package gateway_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
)

// typists returns the users a presence frame marks as typing, sorted, and
// every watcher's user.
func typists(f map[string]any) (typing, all []string) {
	for _, w := range f["watchers"].([]any) {
		m := w.(map[string]any)
		all = append(all, m["user"].(string))
		if v, ok := m["typing"]; ok {
			if v != true {
				panic("typing is not true but present")
			}
			typing = append(typing, m["user"].(string))
		}
	}
	slices.Sort(typing)
	slices.Sort(all)
	return typing, all
}

// nextPresence returns the next presence frame, skipping other frames.
func nextPresence(c *wsClient) map[string]any {
	c.t.Helper()
	for {
		if f := c.next(); f["type"] == session.FramePresence {
			return f
		}
	}
}

// waitTyping reads presence frames until one lists exactly want typing
// among exactly users.
func waitTyping(t *testing.T, c *wsClient, users, want []string) {
	t.Helper()
	for {
		f := nextPresence(c)
		typing, all := typists(f)
		if slices.Equal(all, users) && slices.Equal(typing, want) {
			return
		}
	}
}

// TestWS_Typing: a driver's typing frame shows as "typing":true on its
// watcher in presence, on this gateway and another one; it expires after
// the TTL, a prompt or a {"typing":false} frame ends it at once, repeated
// frames send no more presence, and a viewer's typing frame is refused with
// forbidden.
func TestWS_Typing(t *testing.T) {
	ttl := 1500 * time.Millisecond
	tune := func(c *gateway.Config) {
		c.TypingTTL = ttl
		c.PresenceInterval = 200 * time.Millisecond
	}
	e := newEnv(t, tune)
	s := e.create("alice", "typing")
	e.member(s.ID, "alice", "bob", session.RoleDriver)
	e.member(s.ID, "alice", "carol", session.RoleViewer)
	_, srv2, _ := startGateway(t, e.ns, tune)

	everyone := []string{"alice", "bob", "carol"}
	a := e.dial(s.ID, "alice", 0)
	b := e.dial(s.ID, "bob", 0)
	c := dialURL(t, srv2.URL, s.ID, "carol", 0)
	waitTyping(t, a, everyone, nil)
	waitTyping(t, c, everyone, nil)
	b.nextOf(session.FrameHello)

	t.Run("driver typing reaches both gateways", func(t *testing.T) {
		b.send(map[string]string{"type": "typing"})
		waitTyping(t, a, everyone, []string{"bob"})
		waitTyping(t, c, everyone, []string{"bob"})
	})

	t.Run("it expires after the TTL", func(t *testing.T) {
		start := time.Now()
		waitTyping(t, a, everyone, nil)
		if d := time.Since(start); d > 3*ttl {
			t.Fatalf("typing lasted %v, TTL %v", d, ttl)
		}
		waitTyping(t, c, everyone, nil)
	})

	t.Run("a prompt ends it at once", func(t *testing.T) {
		b.send(map[string]string{"type": "typing"})
		waitTyping(t, a, everyone, []string{"bob"})
		b.send(map[string]string{"type": "prompt", "text": "echo hi", "client_id": "p1"})
		start := time.Now()
		waitTyping(t, a, everyone, nil)
		if d := time.Since(start); d >= ttl {
			t.Fatalf("typing ended %v after the prompt: by expiry (TTL %v), not by the prompt", d, ttl)
		}
		if f := b.find(session.FrameAck); f["client_id"] != "p1" {
			t.Fatalf("ack %v", f)
		}
	})

	t.Run("repeated frames send one presence frame", func(t *testing.T) {
		for range 20 {
			b.send(map[string]string{"type": "typing"})
		}
		waitTyping(t, a, everyone, []string{"bob"})
		// The next presence frame alice gets is the expiry's: the 19
		// repeats changed nothing anyone sees.
		f := nextPresence(a)
		if typing, _ := typists(f); len(typing) != 0 {
			t.Fatalf("a repeat sent presence %v", f)
		}
	})

	t.Run("a stop frame ends it at once", func(t *testing.T) {
		b.send(map[string]string{"type": "typing"})
		waitTyping(t, a, everyone, []string{"bob"})
		b.send(map[string]any{"type": "typing", "typing": false})
		start := time.Now()
		waitTyping(t, a, everyone, nil)
		if d := time.Since(start); d >= ttl {
			t.Fatalf("typing ended %v after the stop: by expiry (TTL %v), not by the stop", d, ttl)
		}
		waitTyping(t, c, everyone, nil)
	})

	t.Run("viewer is refused", func(t *testing.T) {
		c.send(map[string]string{"type": "typing", "client_id": "t1"})
		f := c.find(session.FrameError)
		if f["code"] != string(session.CodeForbidden) || f["client_id"] != "t1" || f["message"] == "" {
			t.Fatalf("error frame %v", f)
		}
	})

	t.Run("unknown frame names typing", func(t *testing.T) {
		b.send(map[string]string{"type": "typo"})
		f := b.find(session.FrameError)
		if f["code"] != string(session.CodeBadRequest) || !strings.Contains(f["message"].(string), "typing") {
			t.Fatalf("error frame %v", f)
		}
	})
}
