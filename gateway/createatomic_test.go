package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// TestCreateSession_RefusedSettingCreatesNothing: a setting the node refuses
// at POST /v1/sessions (beyond its limits, or not for this kind of session)
// is refused before anything of the session exists: the answer names the
// setting, and no subject, event or key of NATS ever names a session other
// than the one created afterwards — no session_created, no lease, no
// catalog entry.
func TestCreateSession_RefusedSettingCreatesNothing(t *testing.T) {
	ns := startNATS(t)
	startAgentNode(t, ns)
	e := &env{t: t, ns: ns}
	e.gw, e.srv, e.reg = startGateway(t, ns)

	// Every message on the server, from before the first create.
	nc := connectNATS(t, ns)
	var mu sync.Mutex
	var seen []*nats.Msg // guarded by mu
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, m)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	for name, c := range map[string]struct {
		body string
		code int
		want string
	}{
		"mcp servers without an agent": {`{"title":"x","settings":{"mcp_servers":[{"name":"files","command":"/bin/mcp"}]}}`, 400,
			"settings: mcp_servers are for agent sessions"},
		"memory beyond the node's": {`{"title":"x","settings":{"memory_bytes":1048576}}`, 403, "settings: memory_bytes"},
		"timeout beyond the node's": {`{"title":"x","agent":"fake","settings":{"turn_timeout":"2h","setup":"true"}}`, 403,
			"settings: turn_timeout 2h0m0s is beyond this server's limit"},
	} {
		code, body := e.call("POST", "/v1/sessions", "alice", c.body)
		var eb session.ErrorBody
		if code != c.code || json.Unmarshal(body, &eb) != nil || eb.Error == nil || !strings.Contains(eb.Error.Message, c.want) {
			t.Errorf("%s: %d %s, want %d containing %q", name, code, body, c.code, c.want)
		}
	}

	// A session created afterwards: once its session_created has come by,
	// so would have anything the refused creates published before it.
	ok := e.create("alice", "after")
	created := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range seen {
			if strings.Contains(m.Subject, string(ok.ID)) && strings.Contains(string(m.Data), `"kind":"session_created"`) {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(waitTimeout); !created(); {
		if time.Now().After(deadline) {
			t.Fatalf("the session_created of %s never came by", ok.ID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}

	idRE := regexp.MustCompile(`\bs_[A-Za-z0-9_-]+`)
	mu.Lock()
	for _, m := range seen {
		for _, id := range idRE.FindAllString(m.Subject, -1) {
			if id != string(ok.ID) {
				t.Errorf("a refused create reached NATS: %s %.200s", m.Subject, m.Data)
			}
		}
		if strings.Contains(string(m.Data), `"kind":"session_created"`) && !strings.Contains(m.Subject, string(ok.ID)) {
			t.Errorf("a session_created of another session: %s %.200s", m.Subject, m.Data)
		}
	}
	mu.Unlock()

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, session.Subjects{}.CatalogBucket())
	if err != nil {
		t.Fatalf("catalog bucket: %v", err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil {
		t.Fatalf("catalog keys: %v", err)
	}
	if !slices.Equal(keys, []string{string(ok.ID)}) {
		t.Errorf("catalog keys = %v, want only %s", keys, ok.ID)
	}
	code, body := e.call("GET", "/v1/sessions", "alice", nil)
	var l struct{ Sessions []session.Session }
	if code != http.StatusOK || json.Unmarshal(body, &l) != nil || len(l.Sessions) != 1 || l.Sessions[0].ID != ok.ID {
		t.Errorf("list = %d %s, want only %s", code, body, ok.ID)
	}
}
