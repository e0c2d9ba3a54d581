package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// startNATSServer starts a nats-server with JetStream listening on a random
// loopback port, as an external NATS cluster of one, and returns its URL.
func startNATSServer(t testing.TB) (*natsserver.Server, string) {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{
		ServerName: "nats-test",
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns, ns.ClientURL()
}

// startRoles starts a gateway-only and a node-only server sharing the NATS
// server at url.
func startRoles(t testing.TB, url string) (gw, node *stack) {
	t.Helper()
	node = startStack(t, func(c *server.Config) {
		c.Roles = []string{server.RoleNode}
		c.NATS.URLs = []string{url}
		c.NodeID = "node-a"
	})
	gw = startStack(t, func(c *server.Config) {
		c.Roles = []string{server.RoleGateway}
		c.NATS.URLs = []string{url}
		c.NodeID = "gw-1"
	})
	return gw, node
}

// TestRoles_GatewayAndNodeProcesses runs the gateway and the node as two
// servers (as two processes would) on one external NATS server: a prompt
// sent to the gateway runs on the node, and each process serves only what
// its role owns.
func TestRoles_GatewayAndNodeProcesses(t *testing.T) {
	_, url := startNATSServer(t)
	gw, node := startRoles(t, url)
	if gw.srv.IsNode() || !gw.srv.IsGateway() || node.srv.IsGateway() || !node.srv.IsNode() {
		t.Fatalf("roles: gateway %v, node %v", gw.srv.Roles(), node.srv.Roles())
	}

	alice := gw.as("alice")
	s := alice.create("two processes", testHarness)
	n := alice.prompt(s.ID, "hello")
	w := alice.watch(s.ID, 0)
	if fin := alice.waitTurn(s.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn finished %+v", fin)
	}
	evs := alice.events(s.ID, 0)
	if out := outputOf(evs, 1, "stdout"); !strings.Contains(out, "ran: ") || !strings.Contains(out, "session="+string(s.ID)) {
		t.Fatalf("turn output %q", out)
	}
	checkContiguous(t, "history", evs, 1, evs[len(evs)-1].Seq)
	sameBytes(t, "websocket vs history", w.eventsUntil(evs[len(evs)-1].Seq), evs)
	if n < 1 {
		t.Fatalf("prompt seq %d", n)
	}

	t.Run("node serves health only", func(t *testing.T) {
		c := node.as("alice")
		if code, body := c.request("GET", "/healthz", nil); code != http.StatusOK {
			t.Fatalf("node /healthz: %d %s", code, body)
		}
		code, rd := readiness(t, node.url)
		if code != http.StatusOK || !rd.Ready || !checkOf(rd, "history").OK || !checkOf(rd, "object_store").OK || !checkOf(rd, "leases").OK ||
			checkOf(rd, "nats").Server != "nats-test" {
			t.Fatalf("node /readyz: %d %+v", code, rd)
		}
		if m := scrapeMetrics(t, node.url); m.sum("atrium_node_sessions_active") < 1 {
			t.Fatalf("node /metrics: atrium_node_sessions_active %v, want the active session", m.sum("atrium_node_sessions_active"))
		}
		code, body := c.request("GET", "/v1/sessions", nil)
		var eb session.ErrorBody
		if code != http.StatusNotFound || json.Unmarshal(body, &eb) != nil || eb.Error.Code != session.CodeNotFound ||
			!strings.Contains(eb.Error.Message, "gateway") {
			t.Fatalf("node GET /v1/sessions: %d %s, want 404 saying to use a gateway", code, body)
		}
	})
	t.Run("gateway checks nats only", func(t *testing.T) {
		code, rd := readiness(t, gw.url)
		if code != http.StatusOK || len(rd.Checks) != 1 || rd.Checks[0].Name != "nats" || strings.Join(rd.Roles, ",") != "gateway" {
			t.Fatalf("gateway /readyz: %d %+v", code, rd)
		}
	})

	// SIGTERM on the gateway: its WebSockets close with 1012 "reconnect".
	ctx, cancel := contextWithTimeout()
	defer cancel()
	if err := gw.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var ce websocket.CloseError
	if err := w.closed(); !errors.As(err, &ce) || ce.Code != websocket.StatusServiceRestart || ce.Reason != "reconnect" {
		t.Fatalf("websocket ended with %v, want 1012 reconnect", err)
	}
}

// TestRoles_ClusterStatus reads the cluster status through the gateway:
// both processes heartbeat, the node's active session count reaches its
// heartbeat, leases are grouped by node (those of a node without a
// heartbeat are orphaned), NATS's streams are healthy, and a stopped process
// disappears.
func TestRoles_ClusterStatus(t *testing.T) {
	_, url := startNATSServer(t)
	gw, node := startRoles(t, url)
	alice := gw.as("alice")
	s := alice.create("status", testHarness)
	alice.prompt(s.ID, "hello")
	alice.waitTurn(s.ID, 1)

	// GET /v1/cluster: the dev identity may read it.
	status := func() server.ClusterStatus {
		t.Helper()
		code, body := alice.request("GET", "/v1/cluster", nil)
		if code != http.StatusOK {
			t.Fatalf("GET /v1/cluster: %d %s", code, body)
		}
		var st server.ClusterStatus
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatalf("decode %s: %v", body, err)
		}
		return st
	}
	// The node's session count arrives with its next heartbeat.
	deadline := time.Now().Add(waitLong)
	for st := status(); !(len(st.Nodes) == 2 && st.Nodes[1].Sessions >= 1); st = status() {
		if time.Now().After(deadline) {
			t.Fatalf("nodes %+v, want node-a with an active session", st.Nodes)
		}
		time.Sleep(100 * time.Millisecond) // polling, bounded by deadline
	}

	// Leases as a node writes them (key lease.<id>, value {"node","acquired"}),
	// one of node-a and one of a node that has no heartbeat. They live for
	// the bucket's TTL (the lease TTL): read the status at once.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := contextWithTimeout()
	defer cancel()
	owners, err := js.KeyValue(ctx, session.Subjects{}.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	// Records as a node writes them (key lease.<id>, value {"node", "inc",
	// "acquired"}): one under node-a's live incarnation, one of a node
	// that has no heartbeat, one under an incarnation of node-a's that is
	// gone (a previous process).
	nl, err := owners.Get(ctx, session.NodeLeaseKey("node-a"))
	if err != nil {
		t.Fatalf("node-a's lease: %v", err)
	}
	var live session.Lease
	if err := json.Unmarshal(nl.Value(), &live); err != nil || live.Inc == "" {
		t.Fatalf("node-a's lease %s: %v", nl.Value(), err)
	}
	acquired := time.Now().UTC().Add(-time.Minute)
	for key, holder := range map[string][2]string{
		"lease.s_fake1": {"node-a", live.Inc}, "lease.s_fake2": {"node-gone", "x"}, "lease.s_fake3": {"node-a", "gone"},
	} {
		b, _ := json.Marshal(map[string]any{"node": holder[0], "inc": holder[1], "acquired": acquired})
		if _, err := owners.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}
	st := status()
	if len(st.Errors) > 0 {
		t.Errorf("status errors: %v", st.Errors)
	}
	if len(st.Nodes) != 2 {
		t.Fatalf("nodes %+v, want gw-1 and node-a", st.Nodes)
	}
	g, n := st.Nodes[0], st.Nodes[1]
	if g.ID != "gw-1" || strings.Join(g.Roles, ",") != "gateway" || g.State != server.NodeRunning || g.NATSServer != "nats-test" ||
		n.ID != "node-a" || strings.Join(n.Roles, ",") != "node" || n.Sessions < 1 || n.HeartbeatAge > (server.NodeTTL).Seconds() {
		t.Fatalf("nodes %+v", st.Nodes)
	}
	leases := map[string]server.LeaseStatus{}
	for _, l := range n.Leases {
		leases[l.Session] = l
	}
	if l, ok := leases["s_fake1"]; !ok || l.Node != "node-a" || l.Age < 59 || l.Fence == 0 {
		t.Fatalf("node-a's leases %+v, want s_fake1 held for a minute", n.Leases)
	}
	if l, ok := leases[string(s.ID)]; !ok || l.Node != "node-a" || l.Fence == 0 || l.Renewed > 3 {
		t.Fatalf("node-a's leases %+v, want the active session %s's, renewed within the lease TTL", n.Leases, s.ID)
	}
	if len(st.Orphaned) != 2 || st.Orphaned[0].Session != "s_fake2" || st.Orphaned[0].Node != "node-gone" ||
		st.Orphaned[1].Session != "s_fake3" || st.Orphaned[1].Renewed != -1 {
		t.Fatalf("orphaned leases %+v, want s_fake2 of node-gone and s_fake3 of a gone incarnation of node-a", st.Orphaned)
	}
	if st.NATS.Server != "nats-test" || !st.NATS.Connected || st.NATS.JetStream == nil || st.NATS.JetStream.Streams < 3 {
		t.Fatalf("nats %+v", st.NATS)
	}
	streams := map[string]server.StreamStatus{}
	for _, s := range st.NATS.Streams {
		streams[s.Name] = s
	}
	for _, name := range []string{"KV_atrium_nodes", "KV_atrium_owners", "KV_atrium_sessions"} {
		if s, ok := streams[name]; !ok || !s.Healthy || s.Replicas != 1 {
			t.Errorf("stream %s: %+v (present %v)", name, s, ok)
		}
	}

	// A stopped process withdraws its heartbeat at once.
	ctx, cancel = contextWithTimeout()
	defer cancel()
	if err := node.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err = gw.srv.ClusterStatus(ctx); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 1 || st.Nodes[0].ID != "gw-1" {
		t.Fatalf("after the node stopped: nodes %+v", st.Nodes)
	}
}

func TestRoles_StartRefusals(t *testing.T) {
	for name, c := range map[string]struct {
		cfg  server.Config
		want string
	}{
		"gateway alone without NATS": {server.Config{Roles: []string{server.RoleGateway}}, "need an external NATS cluster"},
		"node alone without NATS":    {server.Config{Roles: []string{server.RoleNode}}, "need an external NATS cluster"},
		"unknown role":               {server.Config{Roles: []string{"router"}}, `unknown role "router"`},
		"NATS down":                  {server.Config{NATS: server.NATS{URLs: []string{"nats://127.0.0.1:1"}}}, "connect to NATS at nats://127.0.0.1:1"},
	} {
		t.Run(name, func(t *testing.T) {
			c.cfg.Listen, c.cfg.DataDir = "127.0.0.1:0", t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			srv, err := server.Start(ctx, c.cfg)
			if err == nil {
				srv.Close(ctx)
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q lacks %q", err, c.want)
			}
		})
	}
}
