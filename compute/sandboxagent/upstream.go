package sandboxagent

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// UpstreamDial returns a dial function (compute/local's
// Config.EgressDial) that reaches host:port through the HTTP proxy at
// proxy with CONNECT: the way out of a VM whose network reaches only its
// VM host's outbound proxy. The proxy's refusal (403 and its reason) comes
// back as the error.
func UpstreamDial(proxy *url.URL) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", proxy.Host)
		if err != nil {
			return nil, fmt.Errorf("upstream proxy: %w", err)
		}
		if dl, ok := ctx.Deadline(); ok {
			conn.SetDeadline(dl)
		} else {
			conn.SetDeadline(time.Now().Add(30 * time.Second))
		}
		req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: address}, Host: address, Header: http.Header{}}
		if err := req.Write(conn); err != nil {
			conn.Close()
			return nil, fmt.Errorf("upstream proxy: %w", err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("upstream proxy: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			conn.Close()
			return nil, fmt.Errorf("upstream proxy refused %s: %s: %s", address, resp.Status, b[:n])
		}
		conn.SetDeadline(time.Time{})
		if br.Buffered() > 0 {
			// Bytes the destination sent right after the tunnel opened.
			return &bufferedConn{Conn: conn, r: br}, nil
		}
		return conn, nil
	}
}

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection, as a *net.TCPConn does.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
