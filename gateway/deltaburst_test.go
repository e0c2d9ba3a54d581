package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// TestDelta_BurstKeepsWatcher: an agent answering in 2,000 chunks at once
// (faster than a watcher's 1,024-frame queue drains) keeps a WebSocket
// watcher connected, because the node coalesces consecutive deltas of a
// message; the watcher's deltas, concatenated, are the durable
// agent_message.
func TestDelta_BurstKeepsWatcher(t *testing.T) {
	ns := startNATS(t)
	startAgentNode(t, ns)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)
	code, body := e.call("POST", "/v1/sessions", "alice", map[string]any{"title": "burst", "agent": "fake"})
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var s session.Session
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("decode session: %v", err)
	}
	c := e.dial(s.ID, "alice", 0)
	c.nextOf(session.FrameHello)
	// A first turn starts the agent, so the burst comes from a warm one.
	for _, prompt := range []string{"chunks 1", "chunks 2000"} {
		if code, body := e.call("POST", "/v1/sessions/"+string(s.ID)+"/messages", "alice", map[string]any{"text": prompt}); code != http.StatusAccepted {
			t.Fatalf("prompt: %d %s", code, body)
		}
	}
	var deltas strings.Builder
	var frames int
	var message string
read:
	for {
		m := c.next() // fails the test if the connection ended
		switch m["type"] {
		case session.FrameDelta:
			if m["turn"] == float64(2) {
				frames++
				deltas.WriteString(m["text"].(string))
			}
			continue
		case session.FrameEvent:
		default:
			continue
		}
		ev := m["event"].(map[string]any)
		data := ev["data"].(map[string]any)
		if data["turn"] != float64(2) {
			continue
		}
		if ev["kind"] == string(session.KindAgentMessage) {
			message += data["text"].(string)
		}
		if ev["kind"] == string(session.KindTurnFinished) {
			if data["status"] != string(session.TurnOK) {
				t.Fatalf("turn 2 finished %v", data)
			}
			break read
		}
	}
	var want strings.Builder
	for i := range 2000 {
		want.WriteString("w" + strconv.Itoa(i) + " ")
	}
	if message != want.String() {
		t.Fatalf("agent_message is %d bytes, want the 2,000 chunks (%d bytes)", len(message), want.Len())
	}
	if deltas.String() != message {
		t.Fatalf("the watcher's deltas (%d bytes in %d frames) differ from the agent_message (%d bytes)", deltas.Len(), frames, len(message))
	}
	if frames == 0 || frames > 200 {
		t.Fatalf("%d delta frames for 2,000 chunks: want them coalesced", frames)
	}
	t.Logf("2,000 chunks reached the watcher in %d delta frames", frames)
}
