package bench

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// TestListenerPID: the process listening on a peer URL's port is found (this
// one), and a port nobody listens on gives 0.
func TestListenerPID(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if got := listenerPID(base); got != os.Getpid() {
		t.Fatalf("listenerPID(%s) = %d, want this process %d", base, got, os.Getpid())
	}
	ln.Close()
	if got := listenerPID(base); got != 0 {
		t.Fatalf("listenerPID(%s) after close = %d, want 0", base, got)
	}
	if c := syscalls(0); c.reads == 0 || c.writes < 0 {
		t.Fatalf("syscalls of this process: %+v", c)
	}
}
