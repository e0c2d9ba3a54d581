package vmhost

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/atriumhq/atrium/compute/egress"
)

// The VM's network. QEMU's user network runs with restrict=on: the guest
// reaches nothing outside itself, except the address guestProxy, which
// QEMU forwards (guestfwd), one relay process per connection, to the VM
// host's outbound proxy: an egress.Proxy on the VM host's loopback that
// lets through only Config.Allow (the object store's presigned URLs, the
// hosts sandboxes may be allowed to reach). The node reaches the guest as
// before, through the ports forwarded in (hostfwd): the agent (exec,
// files, workspace calls, the model tunnel) and the configuration port.
const (
	guestProxyIP   = "10.0.2.100"
	guestProxyPort = 3128
)

// GuestProxyURL is the address of the VM host's outbound proxy as the
// guest's agent is told it (sandbox-agent --upstream-proxy).
var GuestProxyURL = "http://" + net.JoinHostPort(guestProxyIP, strconv.Itoa(guestProxyPort))

// outbound is the VM host's proxy for its VMs.
type outbound struct {
	proxy *egress.Proxy
	ln    net.Listener
	done  chan struct{}
	once  sync.Once
}

// startOutbound serves an egress proxy allowing allow on a free port of
// the VM host's loopback.
func startOutbound(allow *egress.Allowlist, cfg Config) (*outbound, error) {
	p, err := egress.New(egress.Config{Allow: allow, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("vmhost: the VMs' outbound proxy: %w", err)
	}
	o := &outbound{proxy: p, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		p.Serve(ln)
	}()
	return o, nil
}

// addr is the proxy's loopback host:port, for the relays.
func (o *outbound) addr() string { return o.ln.Addr().String() }

func (o *outbound) close() {
	o.once.Do(func() {
		o.proxy.Close()
		o.ln.Close()
		<-o.done
	})
}

// relayCommand is the subcommand of `atrium vmhost` that runs Relay.
const relayCommand = "relay"

// guestfwd is the netdev option that forwards the guest's connections to
// guestProxy to the outbound proxy, through `ATRIUM vmhost relay ADDR`
// spawned by QEMU for each connection (its standard input and output are
// the connection). QEMU splits the command like a shell, so the paths
// must not hold spaces or commas.
func (s *Server) guestfwd() string {
	return fmt.Sprintf("guestfwd=tcp:%s:%d-cmd:%s vmhost %s %s", guestProxyIP, guestProxyPort, s.atrium, relayCommand, s.out.addr())
}

// IsRelay reports whether a process started with args (os.Args) is the
// relay QEMU spawns: `atrium vmhost relay ADDR`.
func IsRelay(args []string) bool {
	return len(args) == 4 && args[1] == "vmhost" && args[2] == relayCommand
}

// RunRelay runs the relay of args (see IsRelay) and returns the exit
// code. Its standard error is the guest's connection: nothing is written
// there.
func RunRelay(args []string) int {
	if err := Relay(args[3]); err != nil {
		return 1
	}
	return 0
}

// Relay copies between the connection QEMU passes on standard input and
// output and addr (the VM host's outbound proxy) until both directions
// end. Standard error is the same connection: Relay writes nothing there.
func Relay(addr string) error {
	in, err := net.FileConn(os.Stdin)
	if err != nil {
		return fmt.Errorf("relay: standard input is not a socket: %w", err)
	}
	defer in.Close()
	out, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer out.Close()
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if c, ok := dst.(interface{ CloseWrite() error }); ok {
			c.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
	return nil
}

// parseAllow checks Config.Allow.
func parseAllow(entries []string) (*egress.Allowlist, error) {
	a, err := egress.ParseAllowlist(entries)
	if err != nil {
		return nil, fmt.Errorf("vmhost: --allow: %w", err)
	}
	return a, nil
}

// atriumPath is the executable QEMU runs as the relay.
func atriumPath(cfg Config) (string, error) {
	p := cfg.Atrium
	if p == "" {
		var err error
		if p, err = os.Executable(); err != nil {
			return "", fmt.Errorf("vmhost: the atrium executable for the VMs' relays: %w", err)
		}
	}
	for _, c := range p {
		if c == ' ' || c == ',' || c == '\t' || c == '"' || c == '\'' || c == '\\' {
			return "", fmt.Errorf("vmhost: the atrium executable's path %q holds a space, comma, quote or backslash, which QEMU's guestfwd cannot pass: install atrium elsewhere", p)
		}
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("vmhost: the atrium executable for the VMs' relays: %w", err)
	}
	return p, nil
}
