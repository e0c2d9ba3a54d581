package gateway

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/http"
	"sync"
	"time"
)

// maxBatchBytes is the most a WebSocket gathers before it writes to the
// network in the middle of a batch.
const maxBatchBytes = 64 << 10

// newBatchPool returns the pool of the buffers of batches being gathered:
// an idle connection holds none.
func newBatchPool() *sync.Pool {
	return &sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}
}

// batchConn is the network connection under a WebSocket. coder/websocket
// writes every message to the network at once; while the connection's
// writer holds a batch (hold … release), batchConn gathers those writes and
// sends them in one, so that a writer that took several frames from its
// queue makes one system call, not one per frame.
//
// The connection's writer sends its data messages itself (writeMessage,
// writeFrame): a server's frames are not masked, so the frame of a live
// event is the same bytes for every watcher and is built once, header
// included (event.wire); the library then writes only control frames (pongs,
// the close handshake). Each of those reaches Write whole (it fits the
// library's 4 KiB buffer, which it flushes after every frame), so frames
// never interleave; once the library has written a close frame, the
// writer's messages fail with net.ErrClosed, as the library's own would.
//
// Every write to the network has a deadline at least 9/10 of timeout after
// its start: a client that stops reading fails the write, and the
// connection is then closed. Writes of the library's own pass through the
// same way, in order with the batch.
type batchConn struct {
	net.Conn
	timeout time.Duration
	pool    *sync.Pool // of *[]byte

	mu        sync.Mutex
	holding   bool      // guarded by mu
	buf       *[]byte   // guarded by mu; from pool, only while holding
	deadline  time.Time // guarded by mu: the write deadline set last
	closeSent bool      // guarded by mu: the library wrote a close frame
}

// opClose is the first byte of a close frame (FIN, opcode 8).
const opClose = 0x88

// appendTextHeader appends the header of an unmasked, final text frame of
// n bytes (RFC 6455 §5.2).
func appendTextHeader(b []byte, n int) []byte {
	switch {
	case n < 126:
		return append(b, 0x81, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0x81, 126), uint16(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 0x81, 127), uint64(n))
}

// maxTextHeader is the longest header appendTextHeader writes.
const maxTextHeader = 10

// appendTextFrame appends a text frame carrying payload, built by
// payload(dst) appending to dst, and returns the frame and its payload,
// which share one allocation: the header is written in front of the
// payload once its length is known.
func appendTextFrame(size int, payload func([]byte) []byte) (frame, body []byte) {
	buf := make([]byte, maxTextHeader, maxTextHeader+size)
	buf = payload(buf)
	body = buf[maxTextHeader:]
	var h [maxTextHeader]byte
	hdr := appendTextHeader(h[:0], len(body))
	start := maxTextHeader - len(hdr)
	copy(buf[start:], hdr)
	return buf[start:], body
}

// writeMessage sends payload as one text message.
func (c *batchConn) writeMessage(payload []byte) error {
	var h [maxTextHeader]byte
	return c.writeParts(appendTextHeader(h[:0], len(payload)), payload)
}

// writeFrame sends frame, a complete text frame.
func (c *batchConn) writeFrame(frame []byte) error {
	return c.writeParts(nil, frame)
}

// writeParts sends hdr and p, which together are one frame, with nothing
// between them.
func (c *batchConn) writeParts(hdr, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closeSent {
		return net.ErrClosed
	}
	n := len(hdr) + len(p)
	if !c.holding || n >= maxBatchBytes {
		if err := c.flushLocked(); err != nil {
			return err
		}
		c.touchDeadlineLocked()
		bufs := net.Buffers{hdr, p}
		_, err := bufs.WriteTo(c.Conn)
		return err
	}
	if c.buf == nil {
		c.buf = c.pool.Get().(*[]byte)
	}
	if len(*c.buf)+n > maxBatchBytes {
		if err := c.flushLocked(); err != nil {
			return err
		}
	}
	*c.buf = append(append(*c.buf, hdr...), p...)
	return nil
}

// Write implements io.Writer for the library.
func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) > 0 && p[0] == opClose {
		c.closeSent = true
	}
	if !c.holding {
		return c.writeLocked(p)
	}
	if c.buf == nil {
		c.buf = c.pool.Get().(*[]byte)
	}
	if len(*c.buf)+len(p) > maxBatchBytes {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) >= maxBatchBytes {
			return c.writeLocked(p)
		}
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

func (c *batchConn) writeLocked(p []byte) (int, error) {
	c.touchDeadlineLocked()
	return c.Conn.Write(p)
}

// touchDeadlineLocked makes sure the write deadline is at least 9/10 of
// the timeout away. Moving the deadline costs about as much as a small
// write, so it is moved only when less than that is left.
func (c *batchConn) touchDeadlineLocked() {
	if now := time.Now(); c.deadline.Sub(now) < c.timeout-c.timeout/10 {
		c.deadline = now.Add(c.timeout)
		_ = c.Conn.SetWriteDeadline(c.deadline)
	}
}

func (c *batchConn) flushLocked() error {
	if c.buf == nil || len(*c.buf) == 0 {
		return nil
	}
	_, err := c.writeLocked(*c.buf)
	*c.buf = (*c.buf)[:0]
	return err
}

// hold starts gathering writes.
func (c *batchConn) hold() {
	c.mu.Lock()
	c.holding = true
	c.mu.Unlock()
}

// release writes what was gathered and stops gathering.
func (c *batchConn) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = false
	err := c.flushLocked()
	if c.buf != nil {
		if cap(*c.buf) <= 2*maxBatchBytes {
			*c.buf = (*c.buf)[:0]
			c.pool.Put(c.buf)
		}
		c.buf = nil
	}
	return err
}

// batchHijacker hands coder/websocket a batchConn when it hijacks the
// HTTP connection (the library looks for an http.Hijacker through Unwrap).
type batchHijacker struct {
	http.ResponseWriter
	timeout time.Duration
	pool    *sync.Pool
	conn    *batchConn // set by a successful Hijack
}

// Hijack implements http.Hijacker.
func (h *batchHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// net/http has flushed the response head, so its writer is empty and
	// can be pointed at the batchConn; its reader may hold buffered bytes
	// and stays as it is.
	h.conn = &batchConn{Conn: conn, timeout: h.timeout, pool: h.pool}
	brw.Writer.Reset(h.conn)
	return h.conn, brw, nil
}
