package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of Config.
const (
	// DefaultDialTimeout bounds resolving and connecting to a destination.
	DefaultDialTimeout = 30 * time.Second
	// DefaultMaxConns is how many connections from one sandbox the proxy
	// serves at once; more wait until one closes.
	DefaultMaxConns = 256
)

// headerTimeout bounds how long a client may take to send a request's
// headers.
const headerTimeout = 30 * time.Second

// Config configures a Proxy.
type Config struct {
	// Allow is the sandbox's allowlist; nil allows nothing. SetAllowlist
	// replaces it.
	Allow *Allowlist
	// Dial connects to an allowed destination, given as host:port with the
	// host as the client named it. Default: a net.Dialer with DialTimeout
	// that resolves names with the host's resolver and refuses names that
	// resolve to loopback, link-local (cloud metadata services),
	// unspecified or multicast addresses (an IP address listed in the
	// allowlist is dialled as is). It is the test seam: tests map names
	// such as "allowed.test" to servers on loopback with it, and no
	// address filter applies then.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// DialTimeout bounds each dial; default DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxConns bounds the connections served at once; default
	// DefaultMaxConns.
	MaxConns int
	// Logger receives denials (destination host and port only, never
	// URLs, headers or bodies); default slog.Default().
	Logger *slog.Logger
}

// Proxy is one sandbox's egress proxy: an HTTP proxy that forwards
// absolute-form http:// requests and tunnels CONNECT requests to the
// destinations its allowlist names, and answers everything else with 403
// Forbidden and a body saying what is allowed. Serve it on the listener the
// sandbox reaches (a Unix socket bound into the sandbox). Its methods are
// safe for concurrent use.
type Proxy struct {
	log         *slog.Logger
	dial        func(ctx context.Context, network, address string) (net.Conn, error)
	filter      bool // dial is the default one, which refuses internal addresses
	dialTimeout time.Duration
	maxConns    int
	allow       atomic.Pointer[Allowlist]

	transport *http.Transport
	rp        *httputil.ReverseProxy
	srv       *http.Server
	// ctx is the base of every request's context; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed by Close

	mu       sync.Mutex
	closed   bool                  // guarded by mu
	tunnels  map[net.Conn]struct{} // guarded by mu: both ends of every CONNECT tunnel
	handlers sync.WaitGroup        // running requests; Add under mu while !closed
}

// New returns a proxy for cfg; it serves nothing until Serve.
func New(cfg Config) (*Proxy, error) {
	if cfg.DialTimeout < 0 || cfg.MaxConns < 0 {
		return nil, errors.New("egress proxy: DialTimeout and MaxConns must not be negative")
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		log:         cfg.Logger,
		dial:        cfg.Dial,
		dialTimeout: cfg.DialTimeout,
		maxConns:    cfg.MaxConns,
		ctx:         ctx,
		cancel:      cancel,
		done:        make(chan struct{}),
		tunnels:     make(map[net.Conn]struct{}),
	}
	if p.dial == nil {
		p.dial, p.filter = p.dialDefault, true
	}
	p.allow.Store(cfg.Allow)
	p.transport = &http.Transport{
		Proxy:               nil, // never chain to the node's own proxy settings
		DialContext:         p.dialContext,
		DisableCompression:  true, // pass bodies through as they are
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	errLog := slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)
	p.rp = &httputil.ReverseProxy{
		// The request is absolute-form: the outgoing one keeps its URL
		// and Host; hop-by-hop and X-Forwarded headers are dropped.
		Rewrite:       func(*httputil.ProxyRequest) {},
		Transport:     p.transport,
		FlushInterval: -1, // stream responses (server-sent events, downloads)
		ErrorLog:      errLog,
		ErrorHandler:  p.upstreamError,
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return p.ctx },
		ErrorLog:          errLog,
	}
	return p, nil
}

// SetAllowlist replaces the allowlist for requests that come after; open
// tunnels stay open.
func (p *Proxy) SetAllowlist(a *Allowlist) { p.allow.Store(a) }

// Serve accepts connections on l until Close, serving at most
// Config.MaxConns at once. It closes l and returns nil after Close, or the
// error that stopped it.
func (p *Proxy) Serve(l net.Listener) error {
	err := p.srv.Serve(&limitListener{Listener: l, sem: make(chan struct{}, p.maxConns), done: p.done})
	if errors.Is(err, http.ErrServerClosed) {
		l.Close()
		return nil
	}
	return err
}

// Close stops serving: it closes the listeners, every connection and
// tunnel, and waits for the requests in progress to end. It is safe to call
// more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	tunnels := make([]net.Conn, 0, len(p.tunnels))
	for c := range p.tunnels {
		tunnels = append(tunnels, c)
	}
	p.mu.Unlock()
	p.cancel()
	close(p.done)
	err := p.srv.Close()
	for _, c := range tunnels {
		c.Close()
	}
	p.handlers.Wait()
	p.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("close egress proxy: %w", err)
	}
	return nil
}

// enter counts a request in; it fails once the proxy is closed.
func (p *Proxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.handlers.Add(1)
	return true
}

// ServeHTTP handles one request from the sandbox.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		http.Error(w, "egress proxy: the sandbox is stopping", http.StatusServiceUnavailable)
		return
	}
	defer p.handlers.Done()
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	if !r.URL.IsAbs() || r.URL.Host == "" {
		http.Error(w, "this is the sandbox's egress proxy: send it absolute-form requests "+
			"(GET http://host/path) or CONNECT host:443, e.g. by setting HTTP_PROXY and HTTPS_PROXY", http.StatusBadRequest)
		return
	}
	if r.URL.Scheme != "http" {
		http.Error(w, "egress proxy: only http:// URLs are forwarded; use CONNECT for https://", http.StatusBadRequest)
		return
	}
	host, port, err := splitHostPort(r.URL.Host, portHTTP)
	if err != nil {
		http.Error(w, "egress proxy: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !p.allowed(w, host, port) {
		return
	}
	p.rp.ServeHTTP(w, r)
}

// connect opens a tunnel for a CONNECT request.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	// A refused CONNECT ends the connection: its client expected a tunnel
	// or nothing, not a further request.
	w.Header().Set("Connection", "close")
	host, port, err := splitHostPort(r.Host, 0)
	if err != nil || port == 0 {
		http.Error(w, "egress proxy: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	if !p.allowed(w, host, port) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.dialTimeout)
	up, err := p.dialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	cancel()
	if err != nil {
		p.upstreamError(w, r, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "egress proxy: cannot tunnel over this connection", http.StatusInternalServerError)
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if !p.track(conn, up) {
		conn.Close()
		up.Close()
		return
	}
	defer p.untrack(conn, up)
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent right after its request (a TLS hello) may
	// already sit in the server's buffer.
	var fromClient io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		fromClient = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), conn)
	}
	pipe(conn, fromClient, up)
}

// track registers the two ends of a tunnel so that Close can end it; it
// fails once the proxy is closed.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range conns {
		p.tunnels[c] = struct{}{}
	}
	return true
}

// untrack closes the ends of a tunnel and forgets them.
func (p *Proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	for _, c := range conns {
		delete(p.tunnels, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// allowed checks host:port against the allowlist and answers 403 when it is
// not listed.
func (p *Proxy) allowed(w http.ResponseWriter, host string, port int) bool {
	a := p.allow.Load()
	if a.Allows(host, port) {
		return true
	}
	why := ""
	if _, ok := parseIP(host); ok {
		why = " (IP addresses are allowed only when listed)"
	}
	p.deny(w, host, port, fmt.Sprintf("egress to %s is not allowed for this sandbox%s; allowed: %s",
		destination(host, port), why, a))
	return false
}

// deny logs a refused destination and answers 403 with msg.
func (p *Proxy) deny(w http.ResponseWriter, host string, port int, msg string) {
	p.log.Info("egress denied", "host", host, "port", port)
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, msg, http.StatusForbidden)
}

// upstreamError answers a request whose destination could not be reached.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	dest := r.Host
	if r.URL.Host != "" {
		dest = r.URL.Host
	}
	host, port, _ := splitHostPort(dest, portHTTP)
	var be *blockedError
	if errors.As(err, &be) {
		p.deny(w, host, port, fmt.Sprintf("egress to %s is not allowed for this sandbox: it resolves to %s, %s",
			destination(host, port), be.addr, be.kind))
		return
	}
	if errors.Is(err, context.Canceled) && p.ctx.Err() != nil {
		return // Close: the connection is gone.
	}
	p.log.Debug("egress destination unreachable", "host", host, "port", port, "error", err.Error())
	http.Error(w, fmt.Sprintf("egress proxy: cannot reach %s: %v", destination(host, port), unwrapOp(err)), http.StatusBadGateway)
}

// unwrapOp drops the outer layers of a dial error, which repeat the address.
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// destination renders host:port for messages, leaving out the default
// ports.
func destination(host string, port int) string {
	if port == portHTTP || port == portHTTPS {
		return host
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// splitHostPort splits an authority; a missing port is def.
func splitHostPort(hostport string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		// No port: a bare name, or a bracketed IPv6 address.
		if addr, perr := netip.ParseAddr(trimBrackets(hostport)); perr == nil {
			return addr.String(), def, nil
		}
		if hostport == "" || !validName(normalizeName(hostport)) {
			return "", 0, fmt.Errorf("bad destination %q", hostport)
		}
		return hostport, def, nil
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", hostport)
	}
	return host, port, nil
}

func trimBrackets(s string) string {
	if len(s) >= 2 && s[0] == '[' && s[len(s)-1] == ']' {
		return s[1 : len(s)-1]
	}
	return s
}

// dialContext connects to an allowed destination with the configured dialer.
func (p *Proxy) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return p.dial(ctx, network, address)
}

// dialDefault resolves the destination with the host's resolver and
// connects, refusing internal addresses unless the allowlist named the IP
// address itself.
func (p *Proxy) dialDefault(ctx context.Context, network, address string) (net.Conn, error) {
	d := net.Dialer{Timeout: p.dialTimeout}
	if host, _, err := net.SplitHostPort(address); err == nil {
		if _, literal := parseIP(host); !literal {
			d.ControlContext = refuseInternal
		}
	}
	return d.DialContext(ctx, network, address)
}

// blockedError says that a name resolved to an address sandboxes may not
// reach.
type blockedError struct {
	addr netip.Addr
	kind string
}

func (e *blockedError) Error() string {
	return fmt.Sprintf("%s is %s", e.addr, e.kind)
}

// refuseInternal is a net.Dialer control function refusing addresses that
// reach the node itself or its cloud's metadata service.
func refuseInternal(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, err)
	}
	a := ap.Addr().Unmap()
	var kind string
	switch {
	case a.IsLoopback():
		kind = "a loopback address"
	case a.IsLinkLocalUnicast():
		kind = "a link-local address (such as a cloud metadata service)"
	case a.IsUnspecified():
		kind = "the unspecified address"
	case a.IsMulticast():
		kind = "a multicast address"
	default:
		return nil
	}
	return &blockedError{addr: a, kind: kind}
}

// pipe copies both ways between a client connection (read through
// fromClient) and an upstream one until both directions end, passing a
// half-close on, then closes both.
func pipe(client net.Conn, fromClient io.Reader, up net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := io.Copy(up, fromClient)
		endDirection(up, client, err)
	})
	_, err := io.Copy(client, up)
	endDirection(client, up, err)
	wg.Wait()
	client.Close()
	up.Close()
}

// endDirection ends the direction that writes to dst: with a half-close
// when its source reached EOF, or by closing both connections when copying
// failed.
func endDirection(dst, src net.Conn, err error) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := dst.(closeWriter); ok && err == nil {
		if cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
	src.Close()
}

// limitListener accepts at most cap(sem) connections at once.
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done <-chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.sem }}, nil
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the connection when the underlying one can.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
