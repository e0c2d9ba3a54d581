package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// TestCatalog_Cache: the gateway keeps the catalog in memory. Once its
// watcher has caught up, requests read no catalog entry from the bucket;
// changes and deletions that other gateways and nodes make reach it.
func TestCatalog_Cache(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "cached")
	path := "/v1/sessions/" + string(s.ID)

	// Count the bucket reads (direct gets and stream message gets) among
	// the JetStream API requests.
	nc := connectNATS(t, e.ns)
	api := make(chan *nats.Msg, 4096)
	if _, err := nc.ChanSubscribe("$JS.API.>", api); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	reads := func() int {
		t.Helper()
		// Requests made before were delivered to this connection before
		// they were answered; a round trip makes sure they are in.
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			select {
			case m := <-api:
				if strings.HasPrefix(m.Subject, "$JS.API.DIRECT.GET.") || strings.HasPrefix(m.Subject, "$JS.API.STREAM.MSG.GET.") {
					n++
				}
			default:
				return n
			}
		}
	}
	readsDuring := func(f func()) int {
		t.Helper()
		reads()
		f()
		return reads()
	}
	prompt := func() {
		if code, body := e.call("POST", path+"/messages", "alice", map[string]string{"text": "hi"}); code != http.StatusAccepted {
			t.Fatalf("message: %d %s", code, body)
		}
	}
	eventually(t, "the catalog cache to serve requests", func() bool { return readsDuring(prompt) == 0 })
	if n := readsDuring(func() {
		for range 20 {
			prompt()
		}
	}); n != 0 {
		t.Fatalf("20 messages read the catalog bucket %d times", n)
	}

	// Another node renames the session; the gateway lists the new title.
	kv := e.node.kv
	entry, err := kv.Get(context.Background(), string(s.ID))
	if err != nil {
		t.Fatal(err)
	}
	var ce session.CatalogEntry
	if err := json.Unmarshal(entry.Value(), &ce); err != nil {
		t.Fatal(err)
	}
	ce.Title = "renamed elsewhere"
	b, _ := json.Marshal(ce)
	if _, err := kv.Put(context.Background(), string(s.ID), b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new title", func() bool {
		var list struct{ Sessions []session.Session }
		code, body := e.call("GET", "/v1/sessions", "alice", nil)
		return code == http.StatusOK && json.Unmarshal(body, &list) == nil &&
			len(list.Sessions) == 1 && list.Sessions[0].Title == "renamed elsewhere"
	})

	// A session the cache does not hold is looked up in the bucket.
	if n := readsDuring(func() {
		if code, body := e.call("GET", "/v1/sessions/s_unknown", "alice", nil); code != http.StatusNotFound {
			t.Fatalf("unknown session: %d %s", code, body)
		}
	}); n != 1 {
		t.Fatalf("an unknown session read the bucket %d times, want once", n)
	}

	// The session is deleted through another gateway: this one's cache
	// learns it from the bucket.
	_, srv2, _ := startGateway(t, e.ns)
	if code, body := callURL(t, srv2.URL, "DELETE", path, "alice", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	eventually(t, "the deletion to reach the first gateway", func() bool {
		code, _ := e.call("GET", path, "alice", nil)
		return code == http.StatusNotFound
	})
	if code, body := e.call("GET", "/v1/sessions", "alice", nil); code != http.StatusOK || string(body) != "{\"sessions\":[]}\n" {
		t.Fatalf("list after delete: %d %s", code, body)
	}
}
