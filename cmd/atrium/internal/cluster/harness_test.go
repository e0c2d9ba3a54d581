package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// waitBound bounds every wait of these tests for the cluster: polling
// deadlines and hang detectors, never timing assertions.
const waitBound = 60 * time.Second

// pollEvery is the polling interval of waits.
const pollEvery = 20 * time.Millisecond

// testUser is the dev identity of the tests' clients.
const testUser = "alice"

// Defaults of Options.
const (
	DefaultGateways       = 2
	DefaultNodes          = 2
	DefaultLeaseTTL       = 2 * time.Second
	DefaultHibernateAfter = 10 * time.Minute
	DefaultDrainGrace     = 10 * time.Second
	// natsServers is the size of the NATS cluster: three servers, so
	// that replicas: 3 (R3 streams and KV buckets) works.
	natsServers = 3
)

// serveCommand runs an atrium process from a configuration file. The tests
// use the dev identity (Authorization: Bearer dev:<user>), which `atrium
// serve` refuses (auth.mode dev is only for `atrium dev`); `atrium dev
// --config` takes the same file through the same serverConfig and runServer,
// so roles, external NATS, leases and drain are those of serve.
var serveCommand = []string{"dev", "--config"}

// binPath is the atrium binary TestMain built; binErr says why it is
// missing.
var (
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "atrium-cluster-")
	if err != nil {
		binErr = err
	} else {
		binPath = filepath.Join(dir, "atrium")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/atriumhq/atrium/cmd/atrium").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build ./cmd/atrium: %v\n%s", err, out)
		}
	}
	code := m.Run()
	if dir != "" {
		os.RemoveAll(dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Options shapes a cluster. Zero fields take the Default* values.
type Options struct {
	Gateways, Nodes int
	// LeaseTTL is node.lease_ttl; negative leaves it to the server's
	// default (for the benchmarks of default settings).
	LeaseTTL       time.Duration
	HibernateAfter time.Duration
	DrainGrace     time.Duration
	// CheckpointInterval is node.checkpoint_interval; zero leaves the
	// server's default.
	CheckpointInterval time.Duration
	// Direct connects the nodes straight to their NATS servers, without
	// the proxies that can partition them (Proxies stays empty): the
	// benchmarks then measure Atrium and NATS, not the proxies' copying.
	Direct bool
	// Together starts every process at once, as Kubernetes does with
	// podManagementPolicy: Parallel, instead of one at a time.
	Together bool
}

func (o *Options) fill() {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	def(&o.Gateways, DefaultGateways)
	def(&o.Nodes, DefaultNodes)
	defDur(&o.LeaseTTL, DefaultLeaseTTL)
	defDur(&o.HibernateAfter, DefaultHibernateAfter)
	defDur(&o.DrainGrace, DefaultDrainGrace)
}

// Cluster is a running multi-process deployment: NATS servers in this
// process, versitygw, and atrium child processes.
type Cluster struct {
	t    testing.TB
	opts Options
	NATS []*natsserver.Server
	S3   *blobtest.S3Server
	// Gateways and Nodes are the atrium processes; Nodes[i] reaches NATS
	// through Proxies[i].
	Gateways []*Proc
	Nodes    []*Proc
	Proxies  []*Proxy

	nc *nats.Conn // the test's own connection, to servers[0]
	js jetstream.JetStream
}

// StartCluster starts NATS, S3, the nodes and the gateways, and waits until
// every process is ready. Everything is stopped when the test ends.
func StartCluster(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if binErr != nil {
		t.Fatalf("the atrium binary was not built: %v", binErr)
	}
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap (bwrap) is not installed: the nodes' local sandboxes need it (apt-get install bubblewrap, or run .ci/deps)")
	}
	opts.fill()
	c := &Cluster{t: t, opts: opts}
	c.NATS = startNATSCluster(t, natsServers)
	c.S3 = blobtest.StartS3(t)

	var err error
	c.nc, err = nats.Connect(c.NATS[0].ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("connect to nats: %v", err)
	}
	t.Cleanup(c.nc.Close)
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatalf("jetstream: %v", err)
	}

	ports := freePorts(t, opts.Nodes+opts.Gateways)
	root := t.TempDir()
	for i := range opts.Nodes {
		name := "node-" + string(rune('a'+i))
		url := c.NATS[i%natsServers].ClientURL()
		if !opts.Direct {
			px := StartProxy(t, c.NATS[i%natsServers].Addr().String())
			c.Proxies = append(c.Proxies, px)
			url = "nats://" + px.Addr()
		}
		p := newProc(t, name, []string{"node"}, ports[i], filepath.Join(root, name))
		p.writeConfig(c.configYAML(p, url))
		c.Nodes = append(c.Nodes, p)
	}
	for i := range opts.Gateways {
		name := "gateway-" + string(rune('a'+i))
		// Gateways use the servers the nodes do not (when there are
		// three): an event crosses a route before reaching a watcher.
		srv := c.NATS[(opts.Nodes+i)%natsServers]
		p := newProc(t, name, []string{"gateway"}, ports[opts.Nodes+i], filepath.Join(root, name))
		p.writeConfig(c.configYAML(p, srv.ClientURL()))
		c.Gateways = append(c.Gateways, p)
	}
	if opts.Together {
		// Gateways first: the first to make the catalog.
		for _, p := range append(append([]*Proc(nil), c.Gateways...), c.Nodes...) {
			p.Start()
		}
		for _, p := range c.All() {
			p.WaitReady()
		}
		return c
	}
	// One at a time, nodes first, unless Together: the usual start of a
	// deployment, and the quickest (every process finds the buckets made).
	for _, p := range c.All() {
		p.Start()
		p.WaitReady()
	}
	return c
}

// All returns every atrium process, nodes first.
func (c *Cluster) All() []*Proc {
	return append(append([]*Proc(nil), c.Nodes...), c.Gateways...)
}

// configYAML is the configuration file of p, connected to natsURL.
func (c *Cluster) configYAML(p *Proc, natsURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\n", p.addr)
	fmt.Fprintf(&b, "data_dir: %s\n", p.dataDir)
	fmt.Fprintf(&b, "roles: [%s]\n", strings.Join(p.Roles, ", "))
	fmt.Fprintf(&b, "nats:\n  urls: [%s]\n  replicas: 3\n  name: %s\n", natsURL, p.Name)
	// Text logs at info (what `atrium dev` writes whatever the file
	// says): the partition test reads their time= fields.
	b.WriteString("log:\n  format: text\n  level: info\n")
	b.WriteString("auth:\n  mode: dev\n")
	if p.hasRole("node") {
		fmt.Fprintf(&b, "node:\n  id: %s\n  hibernate_after: %s\n  drain_grace: %s\n", p.Name, c.opts.HibernateAfter, c.opts.DrainGrace)
		if c.opts.LeaseTTL > 0 {
			fmt.Fprintf(&b, "  lease_ttl: %s\n", c.opts.LeaseTTL)
		}
		if c.opts.CheckpointInterval > 0 {
			fmt.Fprintf(&b, "  checkpoint_interval: %s\n", c.opts.CheckpointInterval)
		}
		b.WriteString("sandbox:\n  provider: local\n")
		fmt.Fprintf(&b, "storage:\n  type: s3\n  s3:\n    endpoint: %s\n    bucket: %s\n    access_key: %s\n    secret_key: %s\n    insecure: true\n",
			c.S3.Endpoint, c.S3.Bucket, c.S3.AccessKey, c.S3.SecretKey)
	}
	return b.String()
}

// Client returns a client of gateway i as the test user.
func (c *Cluster) Client(i int) *client.Client {
	c.t.Helper()
	cl, err := client.New(c.Gateways[i].URL, "dev:"+testUser)
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// Status is the part of `atrium cluster status --json` the tests read.
type Status struct {
	Nodes []struct {
		ID     string   `json:"id"`
		Roles  []string `json:"roles"`
		Leases []struct {
			Session string `json:"session"`
			Node    string `json:"node"`
		} `json:"leases"`
	} `json:"nodes"`
	Errors []string `json:"errors"`
}

// ClusterStatus runs `atrium cluster status --json --all` against gateway
// gw as the test user.
func (c *Cluster) ClusterStatus(gw int) Status {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "cluster", "status", "--json", "--all",
		"--server", c.Gateways[gw].URL, "--token", "dev:"+testUser)
	cmd.Env = childEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("atrium cluster status: %v\n%s", err, stderr.String())
	}
	var st Status
	if err := json.Unmarshal(out, &st); err != nil {
		c.t.Fatalf("atrium cluster status --json printed something else than JSON (%v): %.500s", err, out)
	}
	if len(st.Errors) > 0 {
		c.t.Errorf("atrium cluster status reports errors: %v", st.Errors)
	}
	return st
}

// Node returns the node process named name.
func (c *Cluster) Node(name string) *Proc {
	c.t.Helper()
	for _, p := range c.Nodes {
		if p.Name == name {
			return p
		}
	}
	c.t.Fatalf("no node %q (the owners KV names a node this cluster did not start)", name)
	return nil
}

// NodeIndex returns the index in Nodes of the node named name, or -1.
func (c *Cluster) NodeIndex(name string) int {
	for i, p := range c.Nodes {
		if p.Name == name {
			return i
		}
	}
	return -1
}

// Lease is an ownership lease as the owners KV holds it.
type Lease struct {
	Node string
	// Acquired is when the node sent the create that took the lease (its
	// clock: this machine's).
	Acquired time.Time
	// Revision is the KV revision of the entry now (the fencing token is
	// the revision of the create; renewals advance this one).
	Revision uint64
	// Raw is the stored value.
	Raw []byte
}

func parseLease(e jetstream.KeyValueEntry) Lease { return parseLeaseValue(e.Revision(), e.Value()) }

// parseLeaseValue decodes the value of a lease at revision rev.
func parseLeaseValue(rev uint64, value []byte) Lease {
	l := Lease{Revision: rev, Raw: value}
	var v session.Lease
	if json.Unmarshal(value, &v) == nil {
		l.Node, l.Acquired = v.Node, v.Acquired.Time
	}
	return l
}

// owners opens the owners KV bucket.
func (c *Cluster) owners(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, session.Subjects{}.OwnersBucket())
	if err != nil {
		return nil, fmt.Errorf("open kv %s: %w", session.Subjects{}.OwnersBucket(), err)
	}
	return kv, nil
}

// LeaseOf returns the current lease of session id; ok is false when no
// node holds one.
func (c *Cluster) LeaseOf(ctx context.Context, id session.ID) (l Lease, ok bool, err error) {
	kv, err := c.owners(ctx)
	if err != nil {
		return l, false, err
	}
	e, err := kv.Get(ctx, "lease."+string(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return l, false, nil
	}
	if err != nil {
		return l, false, fmt.Errorf("get lease of %s: %w", id, err)
	}
	return parseLease(e), true, nil
}

// WaitOwner waits until a node holds session id's lease and returns it.
func (c *Cluster) WaitOwner(id session.ID, not string) Lease {
	c.t.Helper()
	var last error
	deadline := time.Now().Add(waitBound)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, ok, err := c.LeaseOf(ctx, id)
		cancel()
		if err == nil && ok && l.Node != not {
			return l
		}
		last = err
		time.Sleep(pollEvery)
	}
	c.t.Fatalf("no node other than %q holds the lease of %s after %v (last error: %v)", not, id, waitBound, last)
	return Lease{}
}

// Leases returns every lease in the owners KV, by session key. It reads the
// bucket's stream with an ordered consumer (last message per key) rather
// than a KV key lister: a lister's watcher keeps receiving the bucket's
// writes, and its handler blocks forever once nobody reads them. A
// JetStream API that has no responder for a moment (the consumer's
// creation lands on a server whose JetStream is busy electing) is retried.
func (c *Cluster) Leases(ctx context.Context) (map[string]Lease, error) {
	return retryNoResponders(ctx, func() (map[string]Lease, error) { return c.leases(ctx) })
}

// retryNoResponders calls f again, every pollEvery until ctx ends, while it
// fails with nats.ErrNoResponders: a JetStream consumer whose creation has
// yet to reach the server that serves it.
func retryNoResponders[T any](ctx context.Context, f func() (T, error)) (T, error) {
	for {
		out, err := f()
		if !errors.Is(err, nats.ErrNoResponders) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(pollEvery):
		}
	}
}

func (c *Cluster) leases(ctx context.Context) (map[string]Lease, error) {
	bucket := session.Subjects{}.OwnersBucket()
	st, err := c.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$KV." + bucket + ".lease.>"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	out := map[string]Lease{}
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		n, pending := 0, uint64(0)
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("list leases: %w", err)
			}
			pending = md.NumPending
			key := strings.TrimPrefix(msg.Subject(), "$KV."+bucket+".")
			if op := msg.Headers().Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				delete(out, strings.TrimPrefix(key, "lease."))
				continue
			}
			out[strings.TrimPrefix(key, "lease.")] = parseLeaseValue(md.Sequence.Stream, msg.Data())
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		if n == 0 || pending == 0 {
			return out, nil
		}
	}
}

// startNATSCluster starts n nats-servers with JetStream clustered on
// loopback and waits until JetStream has a meta leader. Clients are not told
// about the other servers (NoAdvertise): a node that loses its proxy cannot
// reach NATS around it.
func startNATSCluster(t testing.TB, n int) []*natsserver.Server {
	t.Helper()
	ports := freePorts(t, n)
	var servers []*natsserver.Server
	for i := range n {
		var routes []*url.URL
		for j := range n {
			if j != i {
				routes = append(routes, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[j]))})
			}
		}
		opts := &natsserver.Options{
			ServerName: fmt.Sprintf("nats-%d", i),
			Host:       "127.0.0.1",
			Port:       natsserver.RANDOM_PORT,
			NoLog:      true,
			NoSigs:     true,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			// Bounded so that three servers fit a CI machine.
			JetStreamMaxMemory: 256 << 20,
			JetStreamMaxStore:  2 << 30,
			Cluster: natsserver.ClusterOpts{
				Name:        "atrium-test",
				Host:        "127.0.0.1",
				Port:        ports[i],
				NoAdvertise: true,
			},
			Routes: routes,
		}
		ns, err := natsserver.NewServer(opts)
		if err != nil {
			t.Fatalf("configure nats-server %d: %v", i, err)
		}
		ns.Start()
		t.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
		servers = append(servers, ns)
	}
	for i, ns := range servers {
		if !ns.ReadyForConnections(waitBound) {
			t.Fatalf("nats-server %d not ready within %v", i, waitBound)
		}
	}
	// JetStream answers only once the servers elected a meta leader.
	nc, err := nats.Connect(servers[0].ClientURL())
	if err != nil {
		t.Fatalf("connect to nats: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	var last error
	deadline := time.Now().Add(waitBound)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, last = js.AccountInfo(ctx)
		cancel()
		if last == nil {
			return servers
		}
		time.Sleep(50 * time.Millisecond) // Polling interval.
	}
	t.Fatalf("the NATS cluster has no JetStream leader after %v: %v", waitBound, last)
	return nil
}

// freePorts returns n loopback TCP ports that were free a moment ago. The
// processes given them listen on fixed ports so that a restarted process
// comes back at the same address.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// Proxy forwards TCP connections to a target until it is partitioned:
// then it closes every connection and refuses new ones until Heal.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{} // both sides of every forwarded connection; guarded by mu
	cut   bool                  // guarded by mu

	wg sync.WaitGroup
}

// StartProxy listens on a loopback port and forwards to target. It is closed
// when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Partition closes every forwarded connection and refuses new ones.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Heal forwards new connections again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Partition()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			in.Close()
			out.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(out, in) })
		p.wg.Go(func() { pipe(in, out) })
	}
}

// syncBuffer is a bytes.Buffer safe for a process's writers and a test's
// readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Proc is one atrium child process (serveCommand), started again with the same
// configuration (and so the same address and data) after it stops.
type Proc struct {
	Name  string
	Roles []string
	// URL is the process's HTTP base URL.
	URL string

	t       testing.TB
	addr    string
	dataDir string
	cfgPath string
	out     *syncBuffer // stdout and stderr of every run, in order

	mu      sync.Mutex
	cmd     *exec.Cmd     // the current run; guarded by mu
	exited  chan struct{} // closed when the current run has exited; guarded by mu
	waitErr error         // of the current run, set before exited closes
	runs    int           // guarded by mu
}

func newProc(t testing.TB, name string, roles []string, port int, dataDir string) *Proc {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p := &Proc{
		Name: name, Roles: roles, URL: "http://" + addr,
		t: t, addr: addr, dataDir: dataDir, out: &syncBuffer{},
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	p.cfgPath = filepath.Join(dataDir, "atrium.yaml")
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("=== %s (%s) output:\n%s", p.Name, p.cfgPath, p.Log())
		}
		if dir := os.Getenv("ATRIUM_CLUSTER_LOGS"); dir != "" {
			// Every process's output, kept for reading a run that passed.
			name := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"."+p.Name+".log")
			if err := os.WriteFile(name, []byte(p.Log()), 0o644); err != nil {
				t.Logf("keep the output of %s: %v", p.Name, err)
			}
		}
	})
	return p
}

func (p *Proc) hasRole(r string) bool {
	for _, x := range p.Roles {
		if x == r {
			return true
		}
	}
	return false
}

func (p *Proc) writeConfig(yaml string) {
	if err := os.WriteFile(p.cfgPath, []byte(yaml), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// Log returns everything the process wrote, across its runs.
func (p *Proc) Log() string { return p.out.String() }

// Start runs p (serveCommand with its configuration file). It does not wait for readiness.
func (p *Proc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			p.t.Fatalf("%s: started while still running", p.Name)
		}
	}
	p.runs++
	fmt.Fprintf(p.out, "--- run %d of %s at %s\n", p.runs, p.Name, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(binPath, append(serveCommand, p.cfgPath)...)
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// Its own process group, so that killing it kills its sandboxes too,
	// as a machine's death would.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %s: %v", p.Name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.waitErr = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()
}

// childEnv is this process's environment without ATRIUM_* variables, which
// would override the configuration file.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ATRIUM_") {
			env = append(env, kv)
		}
	}
	return env
}

// Running reports whether the current run has not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Pid returns the process id of the current run.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// WaitReady polls /readyz until it answers 200.
func (p *Proc) WaitReady() {
	p.t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(waitBound)
	var last string
	for time.Now().Before(deadline) {
		if !p.Running() {
			p.t.Fatalf("%s exited before it was ready: %v\n%s", p.Name, p.exitErr(), p.Log())
		}
		resp, err := hc.Get(p.URL + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %s", resp.Status, b)
		} else {
			last = err.Error()
		}
		time.Sleep(pollEvery)
	}
	p.t.Fatalf("%s not ready after %v (last /readyz: %s)\n%s", p.Name, waitBound, last, p.Log())
}

func (p *Proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Kill sends SIGKILL to the process group of the current run (the process
// and its sandboxes) and waits for the process to exit. It does nothing if
// the process is not running.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// Terminate sends SIGTERM and waits for the process to exit; it fails the
// test if the process does not exit cleanly (status 0) within waitBound.
func (p *Proc) Terminate() {
	p.t.Helper()
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		p.t.Fatalf("%s: terminate before start", p.Name)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("signal %s: %v", p.Name, err)
	}
	select {
	case <-exited:
	case <-time.After(waitBound):
		p.t.Fatalf("%s still running %v after SIGTERM", p.Name, waitBound)
	}
	if err := p.exitErr(); err != nil {
		p.t.Fatalf("%s did not stop cleanly after SIGTERM: %v", p.Name, err)
	}
	// Sandbox processes left in the group are the node's to reap; kill
	// any it left so that the next run starts clean.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}

// Restart starts the process again and waits until it is ready.
func (p *Proc) Restart() {
	p.t.Helper()
	p.Start()
	p.WaitReady()
}

// RSS returns the resident set size of the current run in bytes, from
// /proc/<pid>/status.
func (p *Proc) RSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, fmt.Errorf("read status of %s: %w", p.Name, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 && f[1] == "kB" {
				n, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("parse VmRSS of %s: %w", p.Name, err)
				}
				return n << 10, nil
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.Pid())
}
