package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

// TestClusterStatus runs `atrium cluster status` against a gateway and a
// node in separate servers on one NATS server, as two processes would be.
func TestClusterStatus(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{ServerName: "nats-status", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	start := func(id string, roles ...string) *server.Server {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv, err := server.Start(ctx, server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), NodeID: id, Version: "v9.9.9",
			Roles: roles, NATS: server.NATS{URLs: []string{ns.ClientURL()}}, UnsafeNoSandbox: true, DrainGrace: time.Second})
		if err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		t.Cleanup(func() { srv.Close(context.Background()) })
		return srv
	}
	start("node-a", server.RoleNode)
	gw := start("gw-1", server.RoleGateway)
	c := newCLI(t, gw.URL())
	id := strings.TrimSpace(c.ok("new", "--title", "status"))
	c.ok("send", id, "echo hi", "--wait")

	out := c.ok("cluster", "status")
	for _, want := range []string{
		"NODES (2 processes, 1 sessions owned)", "gw-1", "gateway ", "node-a", "node ", "running", "v9.9.9", "nats-status",
		"SESSION", id + "  node-a", "NATS: connected to nats-status", "JetStream: storage",
		"KV_atrium_nodes", "KV_atrium_owners", "STREAM", " ok",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("cluster status lacks %q:\n%s", want, out)
		}
	}

	var st server.ClusterStatus
	if err := json.Unmarshal([]byte(c.ok("cluster", "status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 2 || st.Nodes[0].ID != "gw-1" || st.Nodes[1].ID != "node-a" || len(st.Nodes[1].Leases) != 1 ||
		st.Nodes[1].Leases[0].Session != id || st.NATS.Server != "nats-status" || len(st.NATS.Streams) == 0 {
		t.Fatalf("cluster status --json: %+v", st)
	}

	if _, errs, err := c.run(cliContext(t), nil, "cluster", "status", "extra"); err == nil || !strings.Contains(err.Error()+errs, "no arguments") {
		t.Fatalf("an argument was accepted: %v %s", err, errs)
	}
}

func TestStreamHealth(t *testing.T) {
	for want, s := range map[string]server.StreamStatus{
		"ok":                  {Name: "a", Replicas: 3, Leader: "n1", Healthy: true},
		"DEGRADED: no leader": {Name: "b", Replicas: 3},
		"DEGRADED: n2 offline, n3 behind by 7": {Name: "c", Replicas: 3, Leader: "n1",
			Peers: []server.PeerStatus{{Name: "n2", Offline: true}, {Name: "n3", Lag: 7}}},
		"DEGRADED: 1 replicas missing": {Name: "d", Replicas: 3, Leader: "n1", Peers: []server.PeerStatus{{Name: "n2", Current: true}}},
	} {
		if got := streamHealth(s); got != want {
			t.Errorf("streamHealth(%+v) = %q, want %q", s, got, want)
		}
	}
}

// TestConfigCheck_Roles: config check says what the process runs, and
// refuses a node alone without a NATS cluster.
func TestConfigCheck_Roles(t *testing.T) {
	c := newCLI(t, "http://127.0.0.1:1")
	out := c.ok("config", "check", "../../deploy/cluster/node-a.yaml")
	if !strings.Contains(out, "# This process runs: node (sessions, sandboxes) as node id node-a; NATS at nats://127.0.0.1:4222") ||
		!strings.Contains(out, "roles:\n    - node") {
		t.Errorf("config check of a node:\n%s", out)
	}
	p := writeConfig(t, "roles: [node]\n")
	_, _, err := c.run(cliContext(t), nil, "config", "check", p)
	if err == nil || !strings.Contains(err.Error(), "nats.urls: required with roles [node]") {
		t.Errorf("config check of a node without NATS: %v", err)
	}
}
