package gateway

import (
	"bytes"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// recordingConn is a net.Conn that records each write.
type recordingConn struct {
	net.Conn
	mu       sync.Mutex
	writes   [][]byte
	deadline time.Time
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *recordingConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	return nil
}

func TestBatchConn_Gathers(t *testing.T) {
	rec := &recordingConn{}
	c := &batchConn{Conn: rec, timeout: time.Minute, pool: newBatchPool()}

	if _, err := c.Write([]byte("direct")); err != nil {
		t.Fatal(err)
	}
	if len(rec.writes) != 1 || rec.deadline.IsZero() {
		t.Fatalf("a write outside a batch: %d writes, deadline %v", len(rec.writes), rec.deadline)
	}
	c.hold()
	var want []byte
	for _, p := range []string{"one", "two", "three"} {
		if _, err := c.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
		want = append(want, p...)
	}
	if len(rec.writes) != 1 {
		t.Fatalf("wrote %d times while holding", len(rec.writes)-1)
	}
	if err := c.release(); err != nil {
		t.Fatal(err)
	}
	if len(rec.writes) != 2 || !bytes.Equal(rec.writes[1], want) {
		t.Fatalf("writes %q, want one write of %q", rec.writes[1:], want)
	}

	// A batch bigger than maxBatchBytes goes out in pieces, in order.
	c.hold()
	want = want[:0]
	big := bytes.Repeat([]byte("x"), maxBatchBytes/3)
	for i := range 10 {
		big[0] = byte('a' + i)
		if _, err := c.Write(big); err != nil {
			t.Fatal(err)
		}
		want = append(want, big...)
	}
	if err := c.release(); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, w := range rec.writes[2:] {
		if len(w) > maxBatchBytes {
			t.Fatalf("a write of %d bytes", len(w))
		}
		got = append(got, w...)
	}
	if !bytes.Equal(got, want) || len(rec.writes[2:]) >= 10 {
		t.Fatalf("%d writes of %d bytes, want fewer than 10 of %d", len(rec.writes[2:]), len(got), len(want))
	}
	if c.buf != nil {
		t.Fatal("an idle batchConn holds a buffer")
	}
}

// TestBatchConn_Deadline: a peer that stops reading fails the write, and
// the deadline is not moved on every write.
func TestBatchConn_Deadline(t *testing.T) {
	client, server := net.Pipe() // a write waits for the peer to read.
	defer client.Close()
	defer server.Close()
	c := &batchConn{Conn: server, timeout: 50 * time.Millisecond, pool: newBatchPool()}
	done := make(chan error, 1)
	go func() { // owned: its result is received below.
		_, err := c.Write([]byte("nobody reads this"))
		done <- err
	}()
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write to a peer that does not read: %v", err)
	}

	rec := &recordingConn{}
	c = &batchConn{Conn: rec, timeout: time.Minute, pool: newBatchPool()}
	_, _ = c.Write([]byte("a"))
	first := rec.deadline
	_, _ = c.Write([]byte("b"))
	if !rec.deadline.Equal(first) {
		t.Fatal("the deadline moved on the second write")
	}
	if d := time.Until(first); d < 50*time.Second || d > time.Minute {
		t.Fatalf("deadline in %v, want about a minute", d)
	}
}
