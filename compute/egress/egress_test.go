package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseAllowlist(t *testing.T) {
	for _, tc := range []struct {
		entries []string
		want    string // String(); "" when parsing must fail
	}{
		{[]string{"Example.COM."}, "example.com"},
		{[]string{" api.example.com ", "*.Example.org"}, "api.example.com, *.example.org"},
		{[]string{"example.com:8443"}, "example.com:8443"},
		{[]string{"192.0.2.1", "192.0.2.1:22"}, "192.0.2.1, 192.0.2.1:22"},
		{[]string{"2001:DB8::1", "[2001:db8::2]:443", "::ffff:192.0.2.9"}, "2001:db8::1, [2001:db8::2]:443, 192.0.2.9"},
		{[]string{"under_score.example"}, "under_score.example"},
		{nil, "nothing"},
		{[]string{""}, ""},
		{[]string{"*"}, ""},
		{[]string{"*.*.example.com"}, ""},
		{[]string{"foo.*.example.com"}, ""},
		{[]string{"https://example.com"}, ""},
		{[]string{"example.com/path"}, ""},
		{[]string{"user@example.com"}, ""},
		{[]string{"example.com:0"}, ""},
		{[]string{"example.com:65536"}, ""},
		{[]string{"example.com:http"}, ""},
		{[]string{"-bad.example.com"}, ""},
		{[]string{"a..b"}, ""},
		{[]string{"fe80::1%eth0"}, ""},
		{[]string{"[2001:db8::1]"}, ""},
	} {
		a, err := ParseAllowlist(tc.entries)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("ParseAllowlist(%q) = %s, want an error", tc.entries, a)
		case tc.want == "":
			if !strings.Contains(err.Error(), "egress allowlist entry") {
				t.Errorf("ParseAllowlist(%q): error %q does not name the entry", tc.entries, err)
			}
		case err != nil:
			t.Errorf("ParseAllowlist(%q): %v", tc.entries, err)
		case a.String() != tc.want:
			t.Errorf("ParseAllowlist(%q) = %q, want %q", tc.entries, a, tc.want)
		}
	}
	_, err := ParseAllowlist([]string{"https://api.example.com"})
	if err == nil || !strings.Contains(err.Error(), "not a URL") {
		t.Errorf("a URL entry: %v, want advice to give a host name", err)
	}
}

func TestAllowlist_Allows(t *testing.T) {
	a, err := ParseAllowlist([]string{"api.example.com", "*.example.org", "git.example.net:22", "192.0.2.1", "2001:db8::1:8443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		port int
		want bool
	}{
		{"api.example.com", 443, true},
		{"API.Example.Com.", 80, true},
		{"api.example.com", 8080, false},
		{"example.com", 443, false},
		{"evil-api.example.com", 443, false},
		{"api.example.com.evil.com", 443, false},
		{"a.example.org", 443, true},
		{"a.b.example.org", 80, true},
		{"example.org", 443, false},
		{"badexample.org", 443, false},
		{"git.example.net", 22, true},
		{"git.example.net", 443, false},
		{"192.0.2.1", 80, true},
		{"::ffff:192.0.2.1", 443, true},
		{"192.0.2.2", 443, false},
		{"2001:db8::1:8443", 443, true}, // an IPv6 address, not a port
		{"127.0.0.1", 443, false},
	} {
		if got := a.Allows(tc.host, tc.port); got != tc.want {
			t.Errorf("Allows(%q, %d) = %v, want %v", tc.host, tc.port, got, tc.want)
		}
	}
	var none *Allowlist
	if none.Allows("api.example.com", 443) || !none.Empty() || none.String() != "nothing" {
		t.Errorf("a nil allowlist allows something")
	}
}

// upstream is a destination server started by a test; it records the
// requests it gets.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request // guarded by mu
}

func newUpstream(tb testing.TB, tlsServer bool) *upstream {
	tb.Helper()
	u := &upstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.reqs = append(u.reqs, r.Clone(context.Background()))
		u.mu.Unlock()
		io.WriteString(w, "hello from "+r.Host+r.URL.Path)
	})
	if tlsServer {
		u.Server = httptest.NewTLSServer(h)
	} else {
		u.Server = httptest.NewServer(h)
	}
	tb.Cleanup(u.Close)
	return u
}

func (u *upstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.reqs...)
}

// mapDial returns a Config.Dial that connects names (host:port) to the
// addresses of routes and refuses everything else, as a resolver would.
func mapDial(routes map[string]string) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		to, ok := routes[address]
		if !ok {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("no such host in the test's routes")}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, to)
	}
}

// syncBuffer is a log destination shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startProxy serves a proxy for cfg on a Unix socket and returns the
// socket's path; the proxy is closed when the test ends.
func startProxy(tb testing.TB, cfg Config, logs io.Writer) (*Proxy, string) {
	tb.Helper()
	if logs == nil {
		logs = tb.Output()
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	sock := filepath.Join(tb.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("close proxy: %v", err)
		}
		if err := <-done; err != nil {
			tb.Errorf("serve: %v", err)
		}
		if err := p.Close(); err != nil {
			tb.Errorf("second close: %v", err)
		}
	})
	return p, sock
}

// proxyClient returns an HTTP client that uses the proxy at the Unix socket
// sock for every request, as a sandboxed program configured with
// HTTP_PROXY and HTTPS_PROXY does.
func proxyClient(tb testing.TB, sock string, tlsConfig *tls.Config) *http.Client {
	tb.Helper()
	tr := &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "egress-proxy"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		TLSClientConfig: tlsConfig,
	}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// rawRequest sends req as is over a new connection to the proxy and
// returns the response's status line and body.
func rawRequest(tb testing.TB, sock, req string) (int, string) {
	tb.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		tb.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		tb.Fatalf("read response to %q: %v", req, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func get(tb testing.TB, c *http.Client, u string) (int, string) {
	tb.Helper()
	resp, err := c.Get(u)
	if err != nil {
		tb.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: read body: %v", u, err)
	}
	return resp.StatusCode, string(b)
}

func TestProxy(t *testing.T) {
	plain := newUpstream(t, false)
	secure := newUpstream(t, true)
	dead := newUpstream(t, false)
	dead.Close() // Nothing listens at its address any more.
	allow, err := ParseAllowlist([]string{"allowed.test", "*.wild.test", "ports.test:8080", "gone.test"})
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]string{
		"gone.test:80":     dead.Listener.Addr().String(),
		"allowed.test:80":  plain.Listener.Addr().String(),
		"allowed.test:443": secure.Listener.Addr().String(),
		"a.wild.test:80":   plain.Listener.Addr().String(),
		"ports.test:8080":  plain.Listener.Addr().String(),
		"denied.test:80":   plain.Listener.Addr().String(),
		"denied.test:443":  secure.Listener.Addr().String(),
	}
	var logs syncBuffer
	p, sock := startProxy(t, Config{Allow: allow, Dial: mapDial(routes)}, &logs)
	tlsConfig := secure.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConfig.ServerName = "example.com" // a name of httptest's certificate
	c := proxyClient(t, sock, tlsConfig)

	t.Run("http to a listed host", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "http://allowed.test/path", nil)
		req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "hello from allowed.test/path" {
			t.Fatalf("got %d %q", resp.StatusCode, b)
		}
		reqs := plain.requests()
		last := reqs[len(reqs)-1]
		if last.Host != "allowed.test" || last.Header.Get("Proxy-Authorization") != "" {
			t.Errorf("upstream got Host %q and Proxy-Authorization %q", last.Host, last.Header.Get("Proxy-Authorization"))
		}
	})
	t.Run("wildcard and port", func(t *testing.T) {
		if code, body := get(t, c, "http://a.wild.test/x"); code != 200 || body != "hello from a.wild.test/x" {
			t.Errorf("wildcard: %d %q", code, body)
		}
		if code, body := get(t, c, "http://ports.test:8080/y"); code != 200 || body != "hello from ports.test:8080/y" {
			t.Errorf("listed port: %d %q", code, body)
		}
	})
	t.Run("https through CONNECT", func(t *testing.T) {
		code, body := get(t, c, "https://allowed.test/secure")
		if code != 200 || body != "hello from allowed.test/secure" {
			t.Errorf("got %d %q", code, body)
		}
	})

	before := len(plain.requests()) + len(secure.requests())
	for _, tc := range []struct{ name, req, want string }{
		{"http to an unlisted host", "GET http://denied.test/secret?token=s3cr3t HTTP/1.1\r\nHost: denied.test\r\n\r\n",
			"egress to denied.test is not allowed for this sandbox; allowed: allowed.test, *.wild.test, ports.test:8080, gone.test\n"},
		{"CONNECT to an unlisted host", "CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n",
			"egress to denied.test is not allowed for this sandbox; allowed: allowed.test, *.wild.test, ports.test:8080, gone.test\n"},
		{"an unlisted port", "CONNECT allowed.test:22 HTTP/1.1\r\nHost: allowed.test:22\r\n\r\n",
			"egress to allowed.test:22 is not allowed for this sandbox; allowed: allowed.test, *.wild.test, ports.test:8080, gone.test\n"},
		{"the wildcard's own domain", "GET http://wild.test/ HTTP/1.1\r\nHost: wild.test\r\n\r\n",
			"egress to wild.test is not allowed for this sandbox; allowed: allowed.test, *.wild.test, ports.test:8080, gone.test\n"},
		{"an IP address", "GET http://" + plain.Listener.Addr().String() + "/ HTTP/1.1\r\nHost: x\r\n\r\n",
			"egress to " + plain.Listener.Addr().String() + " is not allowed for this sandbox (IP addresses are allowed only when listed); allowed: allowed.test, *.wild.test, ports.test:8080, gone.test\n"},
		{"a Host header does not change the destination", "GET http://denied.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
			"egress to denied.test is not allowed for this sandbox; allowed: allowed.test, *.wild.test, ports.test:8080, gone.test\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := rawRequest(t, sock, tc.req)
			if code != http.StatusForbidden || body != tc.want {
				t.Errorf("got %d %q, want 403 %q", code, body, tc.want)
			}
		})
	}
	t.Run("denied requests never reach a server", func(t *testing.T) {
		if n := len(plain.requests()) + len(secure.requests()); n != before {
			t.Errorf("%d denied requests reached an upstream server", n-before)
		}
	})
	t.Run("denials are logged by host only", func(t *testing.T) {
		l := logs.String()
		if !strings.Contains(l, "egress denied") || !strings.Contains(l, "host=denied.test") {
			t.Errorf("log lacks the denial: %s", l)
		}
		if strings.Contains(l, "secret") || strings.Contains(l, "s3cr3t") {
			t.Errorf("log holds the request's path or query: %s", l)
		}
	})

	for _, tc := range []struct {
		name, req string
		code      int
		want      string
	}{
		{"origin-form", "GET /path HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "this is the sandbox's egress proxy"},
		{"https absolute-form", "GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "use CONNECT for https://"},
		{"CONNECT without a port", "CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "CONNECT needs host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := rawRequest(t, sock, tc.req)
			if code != tc.code || !strings.Contains(body, tc.want) {
				t.Errorf("got %d %q, want %d with %q", code, body, tc.code, tc.want)
			}
		})
	}

	t.Run("unreachable destination", func(t *testing.T) {
		code, body := rawRequest(t, sock, "GET http://gone.test/ HTTP/1.1\r\nHost: gone.test\r\n\r\n")
		if code != http.StatusBadGateway || !strings.HasPrefix(body, "egress proxy: cannot reach gone.test: ") {
			t.Errorf("got %d %q, want 502 saying the destination is unreachable", code, body)
		}
	})

	t.Run("SetAllowlist", func(t *testing.T) {
		next, _ := ParseAllowlist([]string{"denied.test"})
		p.SetAllowlist(next)
		defer p.SetAllowlist(allow)
		if code, _ := get(t, c, "http://denied.test/"); code != 200 {
			t.Errorf("newly listed host: %d", code)
		}
		if code, _ := rawRequest(t, sock, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"); code != 403 {
			t.Errorf("host no longer listed: %d", code)
		}
	})
}

func TestProxy_DefaultDialRefusesInternalAddresses(t *testing.T) {
	up := newUpstream(t, false)
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	allow, err := ParseAllowlist([]string{"localhost:" + port, "127.0.0.1:" + port})
	if err != nil {
		t.Fatal(err)
	}
	_, sock := startProxy(t, Config{Allow: allow}, nil)
	code, body := rawRequest(t, sock, "GET http://localhost:"+port+"/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if code != http.StatusForbidden || !strings.Contains(body, "egress to localhost:"+port+" is not allowed for this sandbox: it resolves to ") ||
		!strings.HasSuffix(body, "a loopback address\n") {
		t.Errorf("a name resolving to loopback: %d %q", code, body)
	}
	code, body = rawRequest(t, sock, "CONNECT localhost:"+port+" HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if code != http.StatusForbidden || !strings.Contains(body, "a loopback address") {
		t.Errorf("CONNECT to a name resolving to loopback: %d %q", code, body)
	}
	// A listed IP address is what the operator asked for.
	code, body = rawRequest(t, sock, "GET http://127.0.0.1:"+port+"/ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if code != 200 || body != "hello from 127.0.0.1:"+port+"/ok" {
		t.Errorf("a listed IP address: %d %q", code, body)
	}
	if n := len(up.requests()); n != 1 {
		t.Errorf("the server got %d requests, want only the listed address's", n)
	}
}

// tunnel opens a CONNECT tunnel to dest through the proxy.
func tunnel(tb testing.TB, sock, dest string) (net.Conn, *bufio.Reader) {
	tb.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "CONNECT "+dest+" HTTP/1.1\r\nHost: "+dest+"\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		tb.Fatalf("CONNECT %s: %v, %v", dest, resp, err)
	}
	return c, br
}

func TestProxy_Tunnel(t *testing.T) {
	// An echo server that also reports the client's half-close.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer l.Close()
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				io.Copy(c, c)
				io.WriteString(c, "bye\n")
			})
		}
	})
	allow, _ := ParseAllowlist([]string{"echo.test:7"})
	p, sock := startProxy(t, Config{Allow: allow, Dial: mapDial(map[string]string{"echo.test:7": l.Addr().String()})}, nil)

	c, br := tunnel(t, sock, "echo.test:7")
	io.WriteString(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
	c.(*net.UnixConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || string(rest) != "bye\n" {
		t.Fatalf("after a half-close: %q, %v", rest, err)
	}

	// Close ends open tunnels.
	c2, br2 := tunnel(t, sock, "echo.test:7")
	io.WriteString(c2, "ping\n")
	br2.ReadString('\n')
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	if _, err := io.ReadAll(br2); err != nil {
		t.Errorf("tunnel after Close: %v", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestProxy_MaxConns(t *testing.T) {
	up := newUpstream(t, false)
	allow, _ := ParseAllowlist([]string{"allowed.test"})
	_, sock := startProxy(t, Config{Allow: allow, MaxConns: 1,
		Dial: mapDial(map[string]string{"allowed.test:80": up.Listener.Addr().String(), "allowed.test:443": up.Listener.Addr().String()})}, nil)
	first, _ := tunnel(t, sock, "allowed.test:443")

	second, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	io.WriteString(second, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	br := bufio.NewReader(second)
	second.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("a connection beyond MaxConns was served while the first one was open")
	}
	first.Close()
	second.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the first connection closed: %v, %v", resp, err)
	}
	resp.Body.Close()
}

func TestServeForward(t *testing.T) {
	up := newUpstream(t, false)
	allow, _ := ParseAllowlist([]string{"allowed.test"})
	_, sock := startProxy(t, Config{Allow: allow, Dial: mapDial(map[string]string{"allowed.test:80": up.Listener.Addr().String()})}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serveForward(ln, sock) }()
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()})}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	if code, body := get(t, c, "http://allowed.test/fwd"); code != 200 || body != "hello from allowed.test/fwd" {
		t.Errorf("through the forwarder: %d %q", code, body)
	}
	if code, _ := get(t, c, "http://denied.test/"); code != 403 {
		t.Errorf("denied through the forwarder: %d", code)
	}
	ln.Close()
	if err := <-done; err != nil {
		t.Errorf("serveForward: %v", err)
	}
	tr.CloseIdleConnections()
}

func TestRunForwarder_Flags(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := RunForwarder([]string{"/x/" + ForwarderName, "-probe"}, &out, &errOut); code != 0 || out.String() != ForwarderProbeOutput {
		t.Errorf("probe: %d %q", code, out.String())
	}
	errOut.Reset()
	if code := RunForwarder([]string{ForwarderName, "-listen", "127.0.0.1:0"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "cannot start the egress proxy forwarder: -socket is required") {
		t.Errorf("missing socket: %d %q", code, errOut.String())
	}
	if !IsForwarder([]string{"/run/atrium/" + ForwarderName, "-listen"}) || IsForwarder([]string{"atrium"}) || IsForwarder(nil) {
		t.Errorf("IsForwarder")
	}
}
