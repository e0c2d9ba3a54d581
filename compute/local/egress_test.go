package local

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/session"
)

// destination is a server on the host's loopback standing for a host on
// the internet; it records the requests it gets.
type destination struct {
	*httptest.Server
	mu   sync.Mutex
	hits []string // guarded by mu: Host and path of each request
}

func newDestination(tb testing.TB) *destination {
	tb.Helper()
	d := &destination{}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.hits = append(d.hits, r.Host+r.URL.Path)
		d.mu.Unlock()
		io.WriteString(w, "hello from "+r.Host+r.URL.Path)
	}))
	tb.Cleanup(d.Close)
	return d
}

func (d *destination) requests() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.hits)
}

func (d *destination) port() string {
	_, port, _ := net.SplitHostPort(d.Listener.Addr().String())
	return port
}

// routeTo returns a Config.EgressDial that resolves every test name, on any
// port, to d: the proxy's test seam, so that nothing leaves the machine.
func routeTo(d *destination) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(address)
		if err != nil || !strings.HasSuffix(host, ".test") {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("not a test host")}
		}
		var dl net.Dialer
		return dl.DialContext(ctx, network, d.Listener.Addr().String())
	}
}

// httpGet is a bash script that fetches the http:// URL $1 through the
// proxy that HTTP_PROXY names, as curl and friends do, and prints the
// status code and the body. (Only bash is sure to be in a sandbox.)
const httpGet = `u=${1#http://}; h=${u%%/*}; p=${HTTP_PROXY#http://}
exec 3<>/dev/tcp/${p%:*}/${p##*:} || exit 9
printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$1" "$h" >&3
IFS=' ' read -r _ code _ <&3
while IFS= read -r line <&3 && [ "$line" != $'\r' ]; do :; done
echo "$code"; cat <&3`

// getReq returns the request that runs httpGet on url.
func getReq(url string) compute.ExecRequest {
	return compute.ExecRequest{Argv: []string{"bash", "-c", httpGet, "bash", url}}
}

// viaProxy sends a raw request to the proxy named by HTTP_PROXY with bash's
// /dev/tcp and prints the answer.
func viaProxy(request string) string {
	return `p=${HTTP_PROXY#http://}; exec 3<>/dev/tcp/${p%:*}/${p##*:} || exit 9; printf '` + request + `' >&3; cat <&3`
}

func TestEgress_Allowlist(t *testing.T) {
	dest := newDestination(t)
	p := newTestProvider(t, Config{EgressDial: routeTo(dest)})
	sb := computetest.Open(t, p, compute.Spec{Egress: []string{"allowed.test", "*.wild.test"}})
	bash := func(t *testing.T, script string) string {
		t.Helper()
		return computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"bash", "-c", script}}), "").Stdout
	}
	const denial = "egress to denied.test is not allowed for this sandbox; allowed: allowed.test, *.wild.test\n"

	t.Run("environment", func(t *testing.T) {
		got := strings.Fields(computetest.ShOK(t, sb, "env | grep -i proxy | sort"))
		want := []string{"HTTPS_PROXY=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128",
			"NO_PROXY=localhost,127.0.0.1,::1", "http_proxy=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
			"no_proxy=localhost,127.0.0.1,::1"}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("proxy environment %q, want %q", got, want)
		}
	})
	t.Run("a listed host", func(t *testing.T) {
		r := computetest.Finish(t, computetest.Start(t, sb, getReq("http://allowed.test/hello")), "")
		if r.Stdout != "200\nhello from allowed.test/hello" {
			t.Errorf("GET http://allowed.test/hello: %q (stderr %q)", r.Stdout, r.Stderr)
		}
		r = computetest.Finish(t, computetest.Start(t, sb, getReq("http://a.b.wild.test/w")), "")
		if r.Stdout != "200\nhello from a.b.wild.test/w" {
			t.Errorf("GET http://a.b.wild.test/w: %q (stderr %q)", r.Stdout, r.Stderr)
		}
	})
	t.Run("an unlisted host", func(t *testing.T) {
		r := computetest.Finish(t, computetest.Start(t, sb, getReq("http://denied.test/secret")), "")
		if r.Stdout != "403\n"+denial {
			t.Errorf("GET http://denied.test/: %q, want 403 %q", r.Stdout, denial)
		}
	})
	t.Run("CONNECT to a listed host", func(t *testing.T) {
		// The destination speaks plain HTTP: a tunnel carries any TCP.
		out := bash(t, viaProxy(`CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\nGET /tunnel HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n`))
		if !strings.HasPrefix(out, "HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK\r\n") ||
			!strings.HasSuffix(out, "hello from allowed.test/tunnel") {
			t.Errorf("CONNECT allowed.test:443 answered %q", out)
		}
	})
	t.Run("CONNECT to an unlisted host", func(t *testing.T) {
		out := bash(t, viaProxy(`CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n`))
		if !strings.HasPrefix(out, "HTTP/1.1 403 Forbidden\r\n") || !strings.HasSuffix(out, denial) {
			t.Errorf("CONNECT denied.test:443 answered %q", out)
		}
	})
	t.Run("an IP address", func(t *testing.T) {
		out := bash(t, viaProxy(`GET http://127.0.0.1:`+dest.port()+`/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`))
		if !strings.HasPrefix(out, "HTTP/1.1 403 Forbidden\r\n") || !strings.Contains(out, "IP addresses are allowed only when listed") {
			t.Errorf("GET of the host's loopback address answered %q", out)
		}
	})
	t.Run("no direct connection", func(t *testing.T) {
		got := bash(t, "exec 3<>/dev/tcp/127.0.0.1/"+dest.port()+" 2>/dev/null && echo connected || echo refused")
		if got != "refused\n" {
			t.Errorf("connecting straight to the host's loopback server: %q", got)
		}
		if got := computetest.ShOK(t, sb, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"); got != "lo\n" {
			t.Errorf("network interfaces %q, want only lo", got)
		}
	})
	t.Run("only listed hosts were reached", func(t *testing.T) {
		for _, h := range dest.requests() {
			if !strings.HasPrefix(h, "allowed.test") && !strings.HasPrefix(h, "a.b.wild.test") {
				t.Errorf("the destination got a request for %s", h)
			}
		}
		if n := len(dest.requests()); n != 3 {
			t.Errorf("the destination got %d requests, want 3: %q", n, dest.requests())
		}
	})
}

func TestEgress_Off(t *testing.T) {
	dest := newDestination(t)
	p := newTestProvider(t, Config{EgressDial: routeTo(dest)})
	sb := computetest.Open(t, p, compute.Spec{})
	if got := computetest.Sh(t, sb, "env | grep -ic proxy; [ -e /run ] && echo run"); got.Stdout != "0\n" {
		t.Errorf("without an allowlist the sandbox has %q", got.Stdout)
	}
	got := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"bash", "-c",
		"exec 3<>/dev/tcp/127.0.0.1/" + dest.port() + " 2>/dev/null && echo connected || echo refused"}}), "").Stdout
	if got != "refused\n" {
		t.Errorf("connecting to the host's loopback server: %q", got)
	}
	if n := len(dest.requests()); n != 0 {
		t.Errorf("the destination got %d requests", n)
	}
}

// withEgress opens every sandbox of a provider with an allowlist.
type withEgress struct{ p compute.Provider }

func (w withEgress) Open(ctx context.Context, spec compute.Spec) (compute.Sandbox, error) {
	spec.Egress = []string{"allowed.test"}
	return w.p.Open(ctx, spec)
}

// TestEgress_Contract checks that the forwarder running beside every
// command changes nothing a harness sees: signals, exit statuses, streams,
// kills.
func TestEgress_Contract(t *testing.T) {
	dest := newDestination(t)
	computetest.TestProvider(t, func(t *testing.T) compute.Provider {
		return withEgress{newTestProvider(t, Config{EgressDial: routeTo(dest)})}
	})
}

func TestEgress_Lifecycle(t *testing.T) {
	dest := newDestination(t)
	// A directory whose socket path is too long for a socket address.
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	p := newTestProvider(t, Config{Dir: dir, EgressDial: routeTo(dest)})
	id := session.NewID()
	get := func(sb compute.Sandbox, url string) string {
		t.Helper()
		r := computetest.Finish(t, computetest.Start(t, sb, getReq(url)), "")
		return strings.SplitN(r.Stdout, "\n", 2)[0]
	}
	sb := computetest.Open(t, p, compute.Spec{Session: id, Egress: []string{"allowed.test"}})
	if got := get(sb, "http://allowed.test/"); got != "200" {
		t.Fatalf("through a socket with a long path: %q", got)
	}
	socket := filepath.Join(dir, string(id), egressSocketName)

	// Sleep stops the proxy; waking starts it again.
	if err := sb.Sleep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the proxy's socket outlives Sleep: %v", err)
	}
	if got := get(sb, "http://allowed.test/"); got != "200" {
		t.Errorf("after waking: %q", got)
	}

	// A newer Open replaces the allowlist, also for commands running
	// meanwhile.
	sb2, err := p.Open(context.Background(), compute.Spec{Session: id, Fence: 2, Egress: []string{"denied.test"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := get(sb2, "http://denied.test/"); got != "200" {
		t.Errorf("newly listed host: %q", got)
	}
	if got := get(sb2, "http://allowed.test/"); got != "403" {
		t.Errorf("host no longer listed: %q", got)
	}

	// Without an allowlist, commands get no proxy.
	sb3, err := p.Open(context.Background(), compute.Spec{Session: id, Fence: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := computetest.Sh(t, sb3, "env | grep -ic proxy"); got.Stdout != "0\n" {
		t.Errorf("reopened without an allowlist, commands see %q", got.Stdout)
	}
	if err := sb3.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the proxy's socket outlives Destroy: %v", err)
	}
}

func TestEgress_Unsafe(t *testing.T) {
	dest := newDestination(t)
	p := newTestProvider(t, Config{Unsafe: true, EgressDial: routeTo(dest)})
	sb := computetest.Open(t, p, compute.Spec{Egress: []string{"allowed.test"}})
	// Not enforced, but programs that honour the proxy variables get the
	// same answers as in a sandbox.
	for url, want := range map[string]string{
		"http://allowed.test/u": "200\nhello from allowed.test/u",
		"http://denied.test/u":  "403\negress to denied.test is not allowed for this sandbox; allowed: allowed.test\n",
	} {
		r := computetest.Finish(t, computetest.Start(t, sb, getReq(url)), "")
		if r.Stdout != want {
			t.Errorf("GET %s: %q, want %q (stderr %q)", url, r.Stdout, want, r.Stderr)
		}
	}
}

func TestEgress_ForwarderMissing(t *testing.T) {
	p := newTestProvider(t, Config{Forwarder: "/bin/true"})
	_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID(), Fence: 1, Egress: []string{"allowed.test"}})
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "/bin/true does not act as the egress forwarder") {
		t.Errorf("open with a forwarder that is not one: %v", err)
	}
	// Sandboxes without an allowlist do not need it.
	computetest.ShOK(t, computetest.Open(t, p, compute.Spec{}), "true")
}

func TestProvider_BadSpecs(t *testing.T) {
	p := newTestProvider(t, Config{})
	for _, tc := range []struct {
		name string
		spec compute.Spec
		want string
	}{
		{"network and egress", compute.Spec{Network: true, Egress: []string{"a.test"}}, "either the network or an egress allowlist"},
		{"egress URL", compute.Spec{Egress: []string{"https://a.test/"}}, `egress allowlist entry "https://a.test/": give a host name`},
		{"egress everything", compute.Spec{Egress: []string{"*"}}, `egress allowlist entry "*"`},
		{"negative CPUs", compute.Spec{CPUs: -1}, "CPU limit must not be negative"},
		{"NaN CPUs", compute.Spec{CPUs: math.NaN()}, "CPU limit must not be negative"},
		{"tiny CPUs", compute.Spec{CPUs: 0.001}, "CPU limit must be at least 0.01 CPUs"},
		{"huge CPUs", compute.Spec{CPUs: 1e9}, "CPU limit must be at most 4096 CPUs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Session, tc.spec.Fence = session.NewID(), 1
			_, err := p.Open(context.Background(), tc.spec)
			if !errors.Is(err, session.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("open: %v, want a bad request saying %q", err, tc.want)
			}
		})
	}
	if _, err := New(Config{Dir: t.TempDir(), CPUs: -2}); err == nil {
		t.Errorf("New with negative CPUs succeeded")
	}
}

// readCgroupFile returns the trimmed content of a cgroup file.
func readCgroupFile(tb testing.TB, dir, name string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestSandbox_CPULimit(t *testing.T) {
	p := newTestProvider(t, Config{CPUs: 1.5})
	if p.cg == nil || p.cg.parent.cpu == "" {
		t.Skip("this host has no usable cpu cgroup")
	}
	id := session.NewID()
	sb := computetest.Open(t, p, compute.Spec{Session: id, CPUs: 0.5})
	quota := func() string {
		t.Helper()
		cg := sb.(*Sandbox).m.cg
		if cg.v2 {
			return readCgroupFile(t, cg.cpu, "cpu.max")
		}
		return readCgroupFile(t, cg.cpu, "cpu.cfs_quota_us") + " " + readCgroupFile(t, cg.cpu, "cpu.cfs_period_us")
	}
	if got := quota(); got != "50000 100000" {
		t.Errorf("0.5 CPUs: quota and period %q", got)
	}
	open := func(fence int64, cpus float64) {
		t.Helper()
		var err error
		if sb, err = p.Open(context.Background(), compute.Spec{Session: id, Fence: fence, CPUs: cpus}); err != nil {
			t.Fatal(err)
		}
	}
	open(2, 0) // the provider's default
	if got := quota(); got != "150000 100000" {
		t.Errorf("the default 1.5 CPUs: quota and period %q", got)
	}

	// A busy loop of 60 to 80 ms of CPU time (here) under a limit of 10 ms
	// per 100 ms period is throttled: a command can use at most twice the
	// quota without being throttled, the rest of one period and the quota
	// of the next.
	open(3, 0.1)
	cg := *sb.(*Sandbox).m.cg
	before, ok := cg.cpuThrottled()
	if !ok {
		t.Fatal("cpu.stat has no nr_throttled")
	}
	computetest.ShOK(t, sb, "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done")
	if after, _ := cg.cpuThrottled(); after <= before {
		t.Errorf("a busy loop under 0.1 CPUs was not throttled (nr_throttled %d, then %d)", before, after)
	}

	// Without any limit the quota is lifted.
	p2 := newTestProvider(t, Config{})
	sb = computetest.Open(t, p2, compute.Spec{})
	if got, want := quota(), map[bool]string{true: "max 100000", false: "-1 100000"}[sb.(*Sandbox).m.cg.v2]; got != want {
		t.Errorf("no limit: %q, want %q", got, want)
	}
}

func TestCgroup_CPUFilesV1(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.stat"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cg := cgroup{cpu: dir}
	for _, tc := range []struct {
		cpus  float64
		quota string
	}{{2, "200000"}, {0.01, "1000"}, {0.333, "33300"}, {0, "-1"}} {
		if err := cg.setCPU(tc.cpus); err != nil {
			t.Fatal(err)
		}
		if q, per := readCgroupFile(t, dir, "cpu.cfs_quota_us"), readCgroupFile(t, dir, "cpu.cfs_period_us"); q != tc.quota || per != "100000" {
			t.Errorf("%g CPUs: quota %q period %q", tc.cpus, q, per)
		}
	}
	os.WriteFile(filepath.Join(dir, "cpu.stat"), []byte("nr_periods 10\nnr_throttled 4\nthrottled_time 123\n"), 0o644)
	if n, ok := cg.cpuThrottled(); !ok || n != 4 {
		t.Errorf("cpuThrottled = %d, %v", n, ok)
	}
	if got := strconv.FormatInt(cpuQuota(0.004), 10); got != "1000" {
		t.Errorf("cpuQuota(0.004) = %s, want the kernel's minimum", got)
	}
}
