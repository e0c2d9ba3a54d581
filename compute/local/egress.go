package local

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/atriumhq/atrium/compute/egress"
)

// egressSocketName is the file in a sandbox's directory where its egress
// proxy listens.
const egressSocketName = "egress.sock"

// egressGate is a sandbox's egress proxy and where it listens.
type egressGate struct {
	proxy  *egress.Proxy
	socket string        // host path of the Unix socket bound into the sandbox; "" in unsafe mode
	addr   string        // in unsafe mode, the proxy's host:port on the host's loopback
	served chan struct{} // closed when the proxy stops serving
}

// egressLocked starts the sandbox's egress proxy the first time its limits
// carry an allowlist, and gives a running proxy the current allowlist (nil,
// allowing nothing, once the sandbox was reopened without one). The proxy
// lives until the sandbox sleeps or is destroyed, so commands that keep
// running across an Open keep their socket.
func (m *machine) egressLocked() error {
	if m.gate != nil {
		m.gate.proxy.SetAllowlist(m.limits.egress)
		return nil
	}
	if m.limits.egress == nil {
		return nil
	}
	p := m.p
	px, err := egress.New(egress.Config{
		Allow:  m.limits.egress,
		Dial:   p.cfg.EgressDial,
		Logger: p.log.With("session", string(m.id)),
	})
	if err != nil {
		return fmt.Errorf("start egress proxy: %w", err)
	}
	g := &egressGate{proxy: px, served: make(chan struct{})}
	var ln net.Listener
	if p.layout != nil {
		g.socket = filepath.Join(m.dir, egressSocketName)
		ln, err = listenUnix(g.socket)
		if err == nil {
			err = p.hostID.ownFile(g.socket)
		}
	} else {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			g.addr = ln.Addr().String()
		}
	}
	if err != nil {
		return fmt.Errorf("start egress proxy: %w", err)
	}
	go func() {
		defer close(g.served)
		if err := px.Serve(ln); err != nil {
			p.log.Error("egress proxy stopped", "session", string(m.id), "error", err.Error())
		}
	}()
	m.gate = g
	return nil
}

// closeEgressLocked stops the sandbox's egress proxy, ending its
// connections, and removes its socket.
func (m *machine) closeEgressLocked() error {
	g := m.gate
	if g == nil {
		return nil
	}
	m.gate = nil
	err := g.proxy.Close()
	<-g.served
	if g.socket != "" {
		if rerr := os.Remove(g.socket); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("remove egress socket: %w", rerr))
		}
	}
	return err
}

// maxUnixPath is the longest path a Unix socket address holds.
const maxUnixPath = 107

// listenUnix listens on a Unix socket at path, replacing a stale socket
// file. Paths too long for a socket address are bound through the
// directory's file descriptor.
func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	if len(path) <= maxUnixPath {
		return net.Listen("unix", path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	short := "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/" + filepath.Base(path)
	ln, err := net.Listen("unix", short)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// That name means nothing once dir is closed; the caller removes the
	// socket by its real path.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}
