package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// TestGateway_PlaceLastingRefusal (issue 21): a node that refuses to
// activate a session for a condition it knows lasts (its JetStream store
// is full: the refusal carries retry_after_s) is not asked again for the
// gateway's 10 s of place retries; the client hears the node's reason at
// once, 503 unavailable with Retry-After. A transient refusal (no
// retry_after_s) is still retried: TestGateway_PlaceRetriesWhileLeaseHeld.
func TestGateway_PlaceLastingRefusal(t *testing.T) {
	ns := startNATS(t)
	nc := connectNATS(t, ns)
	subj := session.Subjects{}
	id := catalogHibernated(t, nc, subj)

	const reason = "this node cannot take session now: the JetStream store is out of space; retry"
	var mu sync.Mutex
	asked := 0
	place, err := nc.QueueSubscribe(subj.Place(), subj.PlaceQueue(), func(m *nats.Msg) {
		mu.Lock()
		asked++
		mu.Unlock()
		refusal := session.Errorf(session.CodeUnavailable, "%s", reason)
		refusal.RetryAfterS = 10
		data, _ := json.Marshal(session.Reply{Error: refusal})
		m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { place.Unsubscribe() })
	nc.Flush()

	_, srv, _ := startGateway(t, ns)
	req, err := http.NewRequest("POST", srv.URL+"/v1/sessions/"+string(id)+"/messages", strings.NewReader(`{"text":"hi","client_id":"c1"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer dev:alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e session.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("answer %d %s: not an error body (%v)", resp.StatusCode, body, err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != session.CodeUnavailable || e.Error.Message != reason {
		t.Errorf("answer %d %s; want 503 unavailable with the node's reason %q", resp.StatusCode, body, reason)
	}
	if got := resp.Header.Get("Retry-After"); got != "10" {
		t.Errorf("Retry-After %q, want 10 (the node's retry_after_s)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked != 1 {
		t.Errorf("the node was asked to activate the session %d times, want once: a lasting refusal is not retried", asked)
	}
}
