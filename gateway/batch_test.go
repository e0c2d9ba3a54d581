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

// readTextFrames decodes b as unmasked final text frames (RFC 6455 §5.2).
func readTextFrames(t *testing.T, b []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(b) > 0 {
		if len(b) < 2 || b[0] != 0x81 || b[1]&0x80 != 0 {
			t.Fatalf("not an unmasked final text frame: % x", b[:min(len(b), 10)])
		}
		n, h := int(b[1]), 2
		switch n {
		case 126:
			n, h = int(b[2])<<8|int(b[3]), 4
			if n < 126 {
				t.Fatalf("length %d in a 2-byte extended length", n)
			}
		case 127:
			n, h = 0, 10
			for _, c := range b[2:10] {
				n = n<<8 | int(c)
			}
			if n <= 0xffff {
				t.Fatalf("length %d in an 8-byte extended length", n)
			}
		}
		if len(b) < h+n {
			t.Fatalf("frame of %d bytes, %d left", n, len(b)-h)
		}
		out = append(out, b[h:h+n])
		b = b[h+n:]
	}
	return out
}

func TestBatchConn_Frames(t *testing.T) {
	rec := &recordingConn{}
	c := &batchConn{Conn: rec, timeout: time.Minute, pool: newBatchPool()}
	var want [][]byte
	c.hold()
	for _, n := range []int{0, 1, 125, 126, 1000, 0xffff, 0x10000, 200_000} {
		p := bytes.Repeat([]byte{byte('a' + n%26)}, n)
		want = append(want, p)
		if n%2 == 0 {
			if err := c.writeMessage(p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		frame, body := appendTextFrame(n, func(b []byte) []byte { return append(b, p...) })
		if !bytes.Equal(body, p) || !bytes.HasSuffix(frame, p) {
			t.Fatalf("appendTextFrame(%d): body %d bytes", n, len(body))
		}
		if err := c.writeFrame(frame); err != nil {
			t.Fatal(err)
		}
	}
	// A pong of the library's between two messages stays between them.
	pong := []byte{0x8a, 0x00}
	if _, err := c.Write(pong); err != nil {
		t.Fatal(err)
	}
	if err := c.writeMessage([]byte("after")); err != nil {
		t.Fatal(err)
	}
	if err := c.release(); err != nil {
		t.Fatal(err)
	}
	all := bytes.Join(rec.writes, nil)
	i := bytes.Index(all, append(pong, 0x81, 5))
	if i < 0 {
		t.Fatal("the pong is not right before the last message")
	}
	got := readTextFrames(t, append(all[:i:i], all[i+len(pong):]...))
	want = append(want, []byte("after"))
	if len(got) != len(want) {
		t.Fatalf("%d frames, want %d", len(got), len(want))
	}
	for k := range want {
		if !bytes.Equal(got[k], want[k]) {
			t.Fatalf("frame %d: %d bytes, want %d", k, len(got[k]), len(want[k]))
		}
	}
	if len(rec.writes) > 8 {
		t.Errorf("%d writes to the network for %d frames", len(rec.writes), len(want)+1)
	}

	// Once the library has sent its close frame, messages fail.
	if _, err := c.Write([]byte{0x88, 0x02, 0x03, 0xe8}); err != nil {
		t.Fatal(err)
	}
	if err := c.writeMessage([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("message after the close frame: %v", err)
	}
}
