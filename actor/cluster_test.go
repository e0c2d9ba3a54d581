package actor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// natsCluster is three nats-servers clustered on loopback ports, with
// JetStream, as in production.
type natsCluster struct {
	servers []*server.Server
}

// newNATSCluster starts the cluster and waits until it can place R3
// streams; Cleanup shuts it down.
func newNATSCluster(t testing.TB) *natsCluster {
	t.Helper()
	c := &natsCluster{}
	// A route port picked up front can be taken by a parallel test before
	// its server binds it, and that server never becomes ready: start the
	// cluster again on other ports.
	var err error
	for range 3 {
		if c.servers, err = startNATSServers(t); err == nil {
			break
		}
		t.Logf("nats cluster: %v; starting it again on other ports", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	nc := connectURL(t, c.url(0), "probe")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "probe", Replicas: 3})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the NATS cluster cannot place R3 streams: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	js.DeleteKeyValue(context.Background(), "probe")
	nc.Close()
	return c
}

func (c *natsCluster) url(i int) string { return c.servers[i].ClientURL() }

// startNATSServers starts three clustered servers on fresh route ports and
// waits until each is ready; on failure it shuts down what it started.
// Cleanup shuts the servers down.
func startNATSServers(t testing.TB) ([]*server.Server, error) {
	ports := make([]int, 3)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	var servers []*server.Server
	stop := func() {
		for _, ns := range servers {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
	}
	for i := range 3 {
		var routes []string
		for j, p := range ports {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
			}
		}
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("nats-%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "atrium-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		})
		if err != nil {
			stop()
			return nil, fmt.Errorf("nats server %d: %w", i, err)
		}
		ns.Start()
		servers = append(servers, ns)
	}
	// A clustered JetStream server is ready once the cluster has formed; a
	// CI machine compiling every package at once may take a while.
	for i, ns := range servers {
		if !ns.ReadyForConnections(45 * time.Second) {
			stop()
			return nil, fmt.Errorf("nats server %d not ready", i)
		}
	}
	t.Cleanup(stop)
	return servers, nil
}

// connectURL connects to one server only (no discovered servers), and
// reconnects to it forever; Cleanup closes the connection.
func connectURL(t testing.TB, url, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(name), nats.IgnoreDiscoveredServers(), nats.DontRandomize(),
		nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0),
		nats.ReconnectBufSize(-1)) // as a node's (see Config.NATS)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// tcpProxy forwards loopback connections to a target until cut, after which
// it closes every connection and refuses new ones: a node partitioned from
// NATS.
type tcpProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn // guarded by mu
	cut   bool       // guarded by mu
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.partition()
		p.wg.Wait()
	})
	return p
}

func (p *tcpProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(out, in); out.Close() })
		p.wg.Go(func() { io.Copy(in, out); in.Close() })
	}
}

// partition closes every forwarded connection and refuses new ones.
func (p *tcpProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// clusterNode is one Host of a multi-node test, with its own history
// directory and NATS connection.
type clusterNode struct {
	host *Host
	nc   *nats.Conn
	dir  *sqlite.Dir
}

// startNode starts a Host named name on url. The nodes of a test share the
// sandbox provider (as nodes share a sandbox host) and the checkpoint store.
func startNode(t testing.TB, name, url string, prov Provider, store blob.Store, opts ...envOption) *clusterNode {
	t.Helper()
	n := newNode(t, name, url, prov, store, opts...)
	n.start(t)
	return n
}

// newNode is startNode without the start, so a test can set hooks.
func newNode(t testing.TB, name, url string, prov Provider, store blob.Store, opts ...envOption) *clusterNode {
	t.Helper()
	n := &clusterNode{nc: connectURL(t, url, name)}
	n.dir = &sqlite.Dir{Path: filepath.Join(t.TempDir(), "histories-"+name), Logger: testLogger(t)}
	cfg := Config{
		NATS:           n.nc,
		Histories:      HistoriesOf(n.dir),
		SecretKeys:     testSecretKeys,
		Provider:       prov,
		NodeID:         name,
		HibernateAfter: time.Minute,
		CancelGrace:    time.Second,
		DrainGrace:     100 * time.Millisecond,
		LeaseTTL:       2 * time.Second,
		Checkpoints:    store,
		Logger:         testLogger(t).With("node", name),
	}
	for _, o := range opts {
		o(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatalf("new host %s: %v", name, err)
	}
	n.host = h
	return n
}

func (n *clusterNode) start(t testing.TB) {
	t.Helper()
	h := n.host
	if err := h.Start(context.Background()); err != nil {
		t.Fatalf("start host %s: %v", h.cfg.NodeID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		h.Close(ctx) // A crashed node's Close reports its dead connection; nothing to check.
	})
}

func withReplicas(r int) envOption { return func(c *Config) { c.Replicas = r } }

// gatewayEnv is an env whose only live part is the "gateway" connection,
// for its request helpers.
func gatewayEnv(t testing.TB, url string) *env {
	return &env{t: t, gw: connectURL(t, url, "gateway")}
}

// served sends c like a gateway does, retrying while the session is
// unavailable (its lease is held by a node that died or is handing it
// over) or does not answer (a request can reach a dead node's subscription
// before its server has dropped it), and returns the first other reply.
//
// A prompt is sent again after a timeout, which may come after the node
// committed it (a takeover under load takes seconds): give it a client_id
// so that the retry gets the first attempt's seq instead of queueing a
// second prompt (issue 21: TestCluster_Partition saw seq 9 for 8 and a
// turn more than it ran).
func served(t testing.TB, e *env, id session.ID, c session.Command) session.Reply {
	t.Helper()
	if c.Op == session.OpPrompt && c.ClientID == "" {
		c.ClientID = "served-" + session.NewEpoch()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rep, err := e.tryCmdWithin(id, "alice", c, 2*time.Second)
		unavailable := err != nil || (rep.Error != nil && rep.Error.Code == session.CodeUnavailable)
		if !unavailable {
			return rep
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s: still unavailable: %v %v", c.Op, id, err, rep.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// historyOf reads every event through the gateway connection.
func historyOf(t testing.TB, e *env, id session.ID) []json.RawMessage {
	t.Helper()
	var all []json.RawMessage
	var after session.Seq
	for {
		rep := served(t, e, id, session.Command{Op: session.OpHistory, After: after})
		if rep.Error != nil {
			t.Fatalf("history: %v", rep.Error)
		}
		all = append(all, rep.Events...)
		after += session.Seq(len(rep.Events))
		if !rep.More {
			return all
		}
	}
}

// waitTurn polls history until turn n has finished and returns its data.
func waitTurn(t testing.TB, e *env, id session.ID, n int64) (session.TurnFinishedData, []session.Event) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := decode(t, historyOf(t, e, id))
		for _, ev := range evs {
			if finished(n)(ev) {
				return data[session.TurnFinishedData](t, ev), evs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("turn %d did not finish; events:%s", n, summarize(evs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func leaseOf(h *Host, id session.ID) (LeaseInfo, bool) {
	for _, l := range h.Leases() {
		if l.Session == id {
			return l, true
		}
	}
	return LeaseInfo{}, false
}

// TestCluster_TakeoverAfterCrash runs two nodes on different servers of a
// 3-server cluster (R3): the node owning a session dies (its NATS
// connection closes; it never drains or checkpoints), and the other takes
// the session over on the next command once the lease has expired: the
// history is identical, seq continues, and the new lease's fence is newer.
func TestCluster_TakeoverAfterCrash(t *testing.T) {
	c := newNATSCluster(t)
	prov := newProvider(t)
	store := blobtest.StartS3(t).Open(t, "checkpoints/")
	a := startNode(t, "a", c.url(0), prov, store, withReplicas(3))
	e := gatewayEnv(t, c.url(2))
	id := e.create("alice", shell())
	if rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo one"}); rep.Error != nil {
		t.Fatalf("prompt: %v", rep.Error)
	}
	waitTurn(t, e, id, 1)
	// Metadata changed since creation must survive too (no checkpoint has
	// it: the stream does).
	for _, c := range []session.Command{
		{Op: session.OpMember, User: "bob", Role: session.RoleDriver},
		{Op: session.OpSecretSet, Name: "GH_TOKEN", Value: "s3cret"},
	} {
		if rep := served(t, e, id, c); rep.Error != nil {
			t.Fatalf("%s: %v", c.Op, rep.Error)
		}
	}
	b := startNode(t, "b", c.url(1), prov, store, withReplicas(3))
	before := historyOf(t, e, id)
	la, ok := leaseOf(a.host, id)
	if !ok {
		t.Fatalf("node a holds no lease for %s: %+v", id, a.host.Leases())
	}

	crash := time.Now()
	a.nc.Close()
	rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo two"})
	took := time.Since(crash)
	if rep.Error != nil {
		t.Fatalf("prompt after the crash: %v", rep.Error)
	}
	t.Logf("takeover: prompt acknowledged by node b %v after node a died (lease TTL 2s)", took)
	if want := session.Seq(len(before) + 1); rep.Seq != want {
		t.Errorf("prompt after takeover has seq %d, want %d", rep.Seq, want)
	}
	fin, evs := waitTurn(t, e, id, 2)
	if fin.Status != session.TurnOK {
		t.Errorf("turn 2 finished %+v", fin)
	}
	checkContiguous(t, evs)
	after := historyOf(t, e, id)
	for i, raw := range before {
		if !bytes.Equal(raw, after[i]) {
			t.Fatalf("event %d changed in the takeover:\n before %s\n after  %s", i+1, raw, after[i])
		}
	}
	if got := outputText(t, evs, 2, "stdout"); got != "two\n" {
		t.Errorf("turn 2 stdout %q", got)
	}
	if rep, err := e.tryCmd(id, "bob", session.Command{Op: session.OpInfo}); err != nil || rep.Error != nil || rep.Session.Role != session.RoleDriver {
		t.Errorf("bob's info after takeover: %+v %v", rep, err)
	}
	if rep := served(t, e, id, session.Command{Op: session.OpSecrets}); rep.Error != nil || len(rep.Secrets) != 1 || rep.Secrets[0].Name != "GH_TOKEN" {
		t.Errorf("secrets after takeover: %+v", rep)
	}
	lb, ok := leaseOf(b.host, id)
	if !ok || lb.Fence <= la.Fence {
		t.Errorf("node b's lease %+v (held %v), want a fence above node a's %d", lb, ok, la.Fence)
	}
}

// TestCluster_Partition cuts a node off from NATS with a proxy: it stops the
// session before its lease can expire (before the other node acquires it),
// the other node takes over, and the cut-off node's later writes are refused
// by the fence: its sandbox handle and its checkpoint.
func TestCluster_Partition(t *testing.T) {
	c := newNATSCluster(t)
	prov := newProvider(t)
	store := blobtest.StartS3(t).Open(t, "checkpoints/")
	proxy := newTCPProxy(t, c.servers[0].Addr().String())
	var lostMu sync.Mutex
	var lostAt time.Time
	a := newNode(t, "a", proxy.url(), prov, store, withReplicas(3))
	a.host.afterLeaseLost = func(session.ID) {
		lostMu.Lock()
		lostAt = time.Now()
		lostMu.Unlock()
	}
	a.start(t)
	e := gatewayEnv(t, c.url(2))
	id := e.create("alice", shell())
	served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo one"})
	waitTurn(t, e, id, 1)
	b := startNode(t, "b", c.url(1), prov, store, withReplicas(3), withHibernate(500*time.Millisecond))
	la, ok := leaseOf(a.host, id)
	if !ok {
		t.Fatalf("node a holds no lease: %+v", a.host.Leases())
	}
	boxA := a.host.boxes.lookup(id)
	if boxA == nil || boxA.sb == nil {
		t.Fatal("node a has no sandbox for the session")
	}
	before := historyOf(t, e, id)

	proxy.partition()
	rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo two"})
	if rep.Error != nil {
		t.Fatalf("prompt after the partition: %v", rep.Error)
	}
	lb, ok := leaseOf(b.host, id)
	if !ok {
		t.Fatalf("node b holds no lease after serving: %+v", b.host.Leases())
	}
	lostMu.Lock()
	stopped := lostAt
	lostMu.Unlock()
	switch {
	case stopped.IsZero():
		t.Fatal("node a never stopped the session")
	case !stopped.Before(lb.Acquired):
		t.Errorf("node a stopped the session at %v, after node b acquired it at %v: two writers", stopped, lb.Acquired)
	}
	if _, held := leaseOf(a.host, id); held {
		t.Error("node a still lists the lease")
	}
	if lb.Fence <= la.Fence {
		t.Errorf("fences: b %d, a %d", lb.Fence, la.Fence)
	}
	fin, evs := waitTurn(t, e, id, 2)
	if fin.Status != session.TurnOK {
		t.Errorf("turn 2 on node b: %+v", fin)
	}
	checkContiguous(t, evs)
	if rep.Seq != session.Seq(len(before)+1) {
		t.Errorf("seq after the partition %d, want %d", rep.Seq, len(before)+1)
	}

	// Node a's sandbox handle carries the old fence: the sandbox refuses it.
	_, err := boxA.sb.Exec(t.Context(), compute.ExecRequest{Argv: []string{"true"}})
	if !errors.Is(err, session.ErrConflict) {
		t.Errorf("exec with node a's old fence: %v, want a conflict", err)
	}
	// Node b checkpoints when the session hibernates; node a's checkpoint
	// with its old fence is refused.
	eventually(t, "node b checkpointed", func() bool {
		m, _, err := b.host.readCheckpoint(t.Context(), id)
		return err == nil && m != nil && m.Fence == lb.Fence
	})
	hist, err := a.dir.Open(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer hist.Close()
	if _, err := a.host.checkpoint(t.Context(), id, "", hist, la.Fence, 0, nil); !errors.Is(err, errFenced) {
		t.Errorf("checkpoint with node a's old fence: %v, want fenced", err)
	}
}

// TestHost_RestoreCheckpointAndReplay takes a session over when the stream
// no longer holds its early events: the new node restores the checkpoint and
// replays the stream after it.
func TestHost_RestoreCheckpointAndReplay(t *testing.T) {
	ns := startJetStream(t)
	prov := newProvider(t)
	store := &freezableStore{Store: dirStore(t)}
	a := startNode(t, "a", ns.ClientURL(), prov, store, withHibernate(200*time.Millisecond))
	e := gatewayEnv(t, ns.ClientURL())
	id := e.create("alice", shell())
	served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo one"})
	waitTurn(t, e, id, 1)
	var m *checkpointManifest
	eventually(t, "a checkpoint at hibernation", func() bool {
		var err error
		m, _, err = a.host.readCheckpoint(t.Context(), id)
		return err == nil && m != nil && m.LastSeq >= 5
	})
	// The stream forgets everything the checkpoint holds.
	js, _ := jetstream.New(e.gw)
	st, err := js.Stream(t.Context(), session.Subjects{}.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(t.Context(), jetstream.WithPurgeSequence(m.StreamSeq+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetMsg(t.Context(), 1); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the stream still holds its first message: %v", err)
	}
	// More events after the checkpoint, which no checkpoint gets (the
	// store refuses writes), then node a dies.
	store.frozen.Store(true)
	served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo two"})
	waitTurn(t, e, id, 2)
	before := historyOf(t, e, id)
	a.nc.Close()
	if now, _, err := a.host.readCheckpoint(t.Context(), id); err != nil || now.LastSeq != m.LastSeq || int(m.LastSeq) >= len(before) {
		t.Fatalf("checkpoint %+v (%v); want the one at seq %d, before the last of %d events", now, err, m.LastSeq, len(before))
	}

	b := startNode(t, "b", ns.ClientURL(), prov, store)
	rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo three"})
	if rep.Error != nil || rep.Seq != session.Seq(len(before)+1) {
		t.Fatalf("prompt on node b: %+v, want seq %d", rep, len(before)+1)
	}
	_, evs := waitTurn(t, e, id, 3)
	checkContiguous(t, evs)
	after := historyOf(t, e, id)
	for i, raw := range before {
		if !bytes.Equal(raw, after[i]) {
			t.Fatalf("event %d differs after restore:\n before %s\n after  %s", i+1, raw, after[i])
		}
	}
	if _, ok := leaseOf(b.host, id); !ok {
		t.Error("node b holds no lease")
	}
}

// TestHost_DrainHandsOffQueuedPrompts closes a node while a turn runs and a
// prompt waits behind it: the turn finishes within the grace period, and
// the queued prompt runs on the other node. A turn that outlasts the grace
// is cancelled with a reason.
func TestHost_DrainHandsOffQueuedPrompts(t *testing.T) {
	ns := startJetStream(t)
	prov := newProvider(t)
	store := dirStore(t)
	a := startNode(t, "a", ns.ClientURL(), prov, store, func(c *Config) { c.DrainGrace = 20 * time.Second })
	e := gatewayEnv(t, ns.ClientURL())
	id := e.create("alice", shell())
	w := e.watch(id)
	served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo started; sleep 1; echo first"})
	w.until("turn 1 output", isKind(session.KindOutput))
	served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo second"})
	b := startNode(t, "b", ns.ClientURL(), prov, store)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := a.host.Close(ctx); err != nil {
		t.Fatalf("close node a: %v", err)
	}
	fin1, _ := waitTurn(t, e, id, 1)
	if fin1.Status != session.TurnOK {
		t.Errorf("turn 1 during drain: %+v, want ok", fin1)
	}
	fin2, evs := waitTurn(t, e, id, 2)
	if fin2.Status != session.TurnOK || outputText(t, evs, 2, "stdout") != "second\n" {
		t.Errorf("turn 2: %+v, stdout %q", fin2, outputText(t, evs, 2, "stdout"))
	}
	checkContiguous(t, evs)
	if _, ok := leaseOf(b.host, id); !ok {
		t.Errorf("node b does not hold the session: %+v", b.host.Leases())
	}

	t.Run("grace runs out", func(t *testing.T) {
		c := startNode(t, "c", ns.ClientURL(), prov, store, func(c *Config) { c.DrainGrace = 200 * time.Millisecond })
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := b.host.Close(ctx); err != nil { // The session moves to c.
			t.Fatalf("close node b: %v", err)
		}
		served(t, e, id, session.Command{Op: session.OpPrompt, Text: "echo long; sleep 60"})
		w.until("turn 3 output", func(ev session.Event) bool {
			return ev.Kind == session.KindOutput && data[session.OutputData](t, ev).Turn == 3
		})
		if err := c.host.Close(ctx); err != nil {
			t.Fatalf("close node c: %v", err)
		}
		fin := data[session.TurnFinishedData](t, w.until("turn 3 finished", finished(3)))
		if fin.Status != session.TurnCancelled {
			t.Errorf("turn 3: %+v, want cancelled", fin)
		}
		var reason string
		for _, ev := range w.evs {
			if ev.Kind == session.KindError {
				reason = data[session.ErrorData](t, ev).Message
			}
		}
		if !bytes.Contains([]byte(reason), []byte("shutting down")) {
			t.Errorf("last error event %q, want the shutdown reason", reason)
		}
	})
}

// startJetStream starts one embedded nats-server with JetStream listening on
// a loopback port.
func startJetStream(t testing.TB) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	return ns
}

// freezableStore refuses writes while frozen, like a checkpoint store that
// cannot be reached; reads pass.
type freezableStore struct {
	blob.Store
	frozen atomic.Bool
}

func (f *freezableStore) Put(ctx context.Context, key string, r io.Reader, size int64, opts blob.PutOptions) (blob.Info, error) {
	if f.frozen.Load() {
		return blob.Info{}, fmt.Errorf("put %s: %w: frozen by the test", key, blob.ErrUnavailable)
	}
	return f.Store.Put(ctx, key, r, size, opts)
}

// TestHost_UpgradesOwnersBucket starts a node on an owners bucket made by
// an older node, with a bucket TTL (per-session leases): the node drops the
// TTL (records are held by node leases now), enables per-key TTLs, and the
// fences it hands out continue above the old ones.
func TestHost_UpgradesOwnersBucket(t *testing.T) {
	ns := startJetStream(t)
	nc := connectURL(t, ns.ClientURL(), "old-node")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subj := session.Subjects{}
	old, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: subj.OwnersBucket(), TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	oldFence, err := old.Put(t.Context(), "fence.s_old", []byte("old-node"))
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, "a", ns.ClientURL(), newProvider(t), nil, func(c *Config) { c.LeaseTTL = 1500 * time.Millisecond })
	st, err := old.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 0 || st.LimitMarkerTTL() <= 0 {
		t.Errorf("owners bucket TTL %v, marker TTL %v after the upgrade; want no TTL and markers", st.TTL(), st.LimitMarkerTTL())
	}
	e := gatewayEnv(t, ns.ClientURL())
	id := e.create("alice", shell())
	l, ok := leaseOf(n.host, id)
	if !ok || l.Fence <= int64(oldFence) {
		t.Errorf("lease %+v (held %v), want a fence above the old %d", l, ok, oldFence)
	}
}

// hibernatedOnA starts node a, creates a session on it, waits until it has
// hibernated and returns the node, the env, the session and the owners
// bucket.
func hibernatedOnA(t *testing.T) (*clusterNode, *env, session.ID, jetstream.KeyValue) {
	t.Helper()
	ns := startJetStream(t)
	n := startNode(t, "a", ns.ClientURL(), newProvider(t), nil, withHibernate(50*time.Millisecond))
	e := gatewayEnv(t, ns.ClientURL())
	id := e.create("alice", shell())
	eventually(t, "hibernated", func() bool { _, held := leaseOf(n.host, id); return !held })
	js, _ := jetstream.New(e.gw)
	owners, err := js.KeyValue(t.Context(), session.Subjects{}.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	return n, e, id, owners
}

// TestHost_LeaseHeldElsewhere: a place request for a session whose record
// names a live incarnation of another node is answered unavailable, naming
// that node, and nothing is opened; once that node's lease expires the
// session is taken over, its record rewritten with a higher fence.
func TestHost_LeaseHeldElsewhere(t *testing.T) {
	n, e, id, owners := hibernatedOnA(t)
	// Node z: a lease that expires in 2s unless renewed (it is not), and a
	// record of the session under its incarnation.
	now := session.Time{Time: time.Now().UTC()}
	zl, _ := json.Marshal(session.Lease{Node: "z", Inc: "z1", Acquired: now})
	if _, err := owners.Create(t.Context(), session.NodeLeaseKey("z"), zl, jetstream.KeyTTL(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(session.Lease{Node: "z", Inc: "z1", Acquired: now})
	rev, err := owners.Put(t.Context(), session.LeaseKey(id), rec)
	if err != nil {
		t.Fatal(err)
	}
	rep := e.place("alice", session.PlaceRequest{Op: session.PlaceActivate, Session: id})
	if rep.Error == nil || rep.Error.Code != session.CodeUnavailable || !strings.Contains(rep.Error.Message, `node "z"`) {
		t.Fatalf("activate while node z holds the lease: %+v", rep.Error)
	}
	if _, held := leaseOf(n.host, id); held {
		t.Error("node a lists a lease it could not take")
	}
	eventually(t, "taken over once node z's lease expired", func() bool {
		rep := e.place("alice", session.PlaceRequest{Op: session.PlaceActivate, Session: id})
		return rep.Error == nil
	})
	l, held := leaseOf(n.host, id)
	if !held || l.Fence <= int64(rev) {
		t.Fatalf("node a's lease %+v (held %v), want a fence above node z's %d", l, held, rev)
	}
	if rep := served(t, e, id, session.Command{Op: session.OpInfo}); rep.Error != nil {
		t.Fatalf("info once taken over: %v", rep.Error)
	}
}

// TestHost_OneRenewalPerNode: sessions are held by the node's lease, so
// while many are active the owners bucket sees the node lease's renewals
// and nothing per session.
func TestHost_OneRenewalPerNode(t *testing.T) {
	ns := startJetStream(t)
	const ttl = MinLeaseTTL
	n := startNode(t, "a", ns.ClientURL(), newProvider(t), nil, func(c *Config) { c.LeaseTTL = ttl })
	e := gatewayEnv(t, ns.ClientURL())
	const sessions = 20
	for range sessions {
		e.create("alice", shell())
	}
	if got := len(n.host.Leases()); got != sessions {
		t.Fatalf("node holds %d sessions, want %d", got, sessions)
	}
	js, _ := jetstream.New(e.gw)
	st, err := js.Stream(t.Context(), "KV_"+session.Subjects{}.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := func() uint64 {
		info, err := st.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	renewed := func() time.Time { return n.host.Leases()[0].Renewed }
	seq0, r0 := lastSeq(), renewed()
	// Four renewals of the node lease: over a TTL, in which per-session
	// leases would have been renewed three times each.
	renewals := 0
	for last := r0; renewals < 4; {
		eventually(t, "a node lease renewal", func() bool { return renewed().After(last) })
		last = renewed()
		renewals++
	}
	if got := lastSeq() - seq0; got > uint64(renewals)+1 {
		t.Errorf("owners bucket got %d writes over %d node lease renewals with %d active sessions, want about one per renewal", got, renewals, sessions)
	}
	if got := len(n.host.Leases()); got != sessions {
		t.Errorf("node holds %d sessions after the renewals, want %d", got, sessions)
	}
}

// TestCluster_RescueDeadNode: a node dies with a turn running and a prompt
// queued, and nobody is connected. When its lease expires, the other node
// takes the session over on its own, finishes the interrupted turn as
// failed and runs the queued prompt.
func TestCluster_RescueDeadNode(t *testing.T) {
	ns := startJetStream(t)
	prov := newProvider(t)
	a := startNode(t, "a", ns.ClientURL(), prov, nil)
	e := gatewayEnv(t, ns.ClientURL())
	id := e.create("alice", shell())
	for _, text := range []string{"sleep 30", "echo rescued"} {
		if rep := served(t, e, id, session.Command{Op: session.OpPrompt, Text: text}); rep.Error != nil {
			t.Fatalf("prompt %q: %v", text, rep.Error)
		}
	}
	b := startNode(t, "b", ns.ClientURL(), prov, nil)
	if _, ok := leaseOf(a.host, id); !ok {
		t.Fatalf("node a does not hold %s", id)
	}

	a.nc.Close() // Node a dies: no renewal, no release.
	// No command is sent: only the rescue can bring the session to node b.
	eventually(t, "node b to take the session over on its own", func() bool { _, ok := leaseOf(b.host, id); return ok })
	if _, held := a.host.NodeLease(); held {
		t.Error("node a, cut off, still reports its node lease held")
	}
	if _, ok := leaseOf(a.host, id); ok {
		t.Error("node a, cut off, still lists the session")
	}

	fin, evs := waitTurn(t, e, id, 2)
	if fin.Status != session.TurnOK {
		t.Errorf("queued turn 2 finished %+v", fin)
	}
	if got := outputText(t, evs, 2, "stdout"); got != "rescued\n" {
		t.Errorf("turn 2 stdout %q", got)
	}
	var first *session.TurnFinishedData
	for _, ev := range evs {
		var d session.TurnFinishedData
		if ev.Kind == session.KindTurnFinished && json.Unmarshal(ev.Data, &d) == nil && d.Turn == 1 {
			first = &d
		}
	}
	if first == nil || first.Status != session.TurnFailed {
		t.Errorf("interrupted turn 1 finished %+v, want failed", first)
	}
	checkContiguous(t, evs)
}

// TestHost_LeftoverOwnRecord: a record of this node's own live incarnation
// that nothing holds (its release failed) does not lock the session out:
// the next activation on the node takes it back.
func TestHost_LeftoverOwnRecord(t *testing.T) {
	n, e, id, owners := hibernatedOnA(t)
	nl, err := owners.Get(t.Context(), session.NodeLeaseKey("a"))
	if err != nil {
		t.Fatal(err)
	}
	var live session.Lease
	if err := json.Unmarshal(nl.Value(), &live); err != nil || live.Inc == "" {
		t.Fatalf("node a's lease %s: %v", nl.Value(), err)
	}
	rec, _ := json.Marshal(session.Lease{Node: "a", Inc: live.Inc, Acquired: session.Time{Time: time.Now().UTC()}})
	rev, err := owners.Put(t.Context(), session.LeaseKey(id), rec)
	if err != nil {
		t.Fatal(err)
	}
	if rep := e.place("alice", session.PlaceRequest{Op: session.PlaceActivate, Session: id}); rep.Error != nil {
		t.Fatalf("activate with a leftover record of node a's own incarnation: %v", rep.Error)
	}
	if l, ok := leaseOf(n.host, id); !ok || l.Fence <= int64(rev) {
		t.Fatalf("node a's lease %+v (held %v), want a fence above the leftover's %d", l, ok, rev)
	}
}
