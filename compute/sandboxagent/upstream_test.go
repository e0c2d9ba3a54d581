package sandboxagent_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/egress"
	"github.com/atriumhq/atrium/compute/sandboxagent"
)

// TestUpstreamDial: the dial function tunnels through a real egress proxy
// with CONNECT to what it allows, bytes both ways and half-close intact,
// and returns the proxy's refusal, reason included, for the rest.
func TestUpstreamDial(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hello "))
				io.Copy(c, c)
			}()
		}
	}()
	allow, err := egress.ParseAllowlist([]string{echo.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	px, err := egress.New(egress.Config{Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); px.Serve(pl) }()
	defer func() { px.Close(); pl.Close(); <-served }()

	dial := sandboxagent.UpstreamDial(&url.URL{Scheme: "http", Host: pl.Addr().String()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dial(ctx, "tcp", echo.Addr().String())
	if err != nil {
		t.Fatalf("dial an allowed destination: %v", err)
	}
	c.Write([]byte("world"))
	c.(interface{ CloseWrite() error }).CloseWrite()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(got) != "hello world" {
		t.Fatalf("through the tunnel: %q, %v; want \"hello world\"", got, err)
	}

	_, err = dial(ctx, "tcp", "127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "not allowed") {
		t.Fatalf("dial a destination the proxy refuses: %v, want its 403 and reason", err)
	}
	if _, err := sandboxagent.UpstreamDial(&url.URL{Scheme: "http", Host: "127.0.0.1:1"})(ctx, "tcp", echo.Addr().String()); err == nil || !strings.Contains(err.Error(), "upstream proxy") {
		t.Fatalf("dial through a proxy that is down: %v", err)
	}
}
