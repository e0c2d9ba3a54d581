package gateway_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/session"
)

// TestQuota_WebSocketPrompts checks that the tenant's turns-per-hour quota
// also holds for prompts sent as WebSocket frames: over it, the frame gets
// an error frame (the connection stays), and the REST prompt that used the
// quota up counted.
func TestQuota_WebSocketPrompts(t *testing.T) {
	c := &clock{t: time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)}
	e := newEnv(t, func(cfg *gateway.Config) { cfg.Quotas = gateway.Quotas{TurnsPerHour: 1, Now: c.now} })
	s := e.create("alice", "ws quota")
	w := e.dial(s.ID, "alice", 0)
	w.nextOf(session.FrameHello)
	if code, body := e.call(http.MethodPost, "/v1/sessions/"+string(s.ID)+"/messages", "alice", map[string]string{"text": "one"}); code != http.StatusAccepted {
		t.Fatalf("message: %d %s", code, body)
	}
	w.send(map[string]string{"type": "prompt", "text": "two", "client_id": "c2"})
	f := w.find(session.FrameError)
	if f["code"] != string(session.CodeTooManyRequests) || f["client_id"] != "c2" {
		t.Fatalf("a prompt frame over the quota got %v", f)
	}
	// The window frees an hour after the first turn; the same connection
	// prompts again.
	c.add(time.Hour)
	w.send(map[string]string{"type": "prompt", "text": "three", "client_id": "c3"})
	if ack := w.find(session.FrameAck); ack["client_id"] != "c3" {
		t.Fatalf("after the window: %v", ack)
	}
}
