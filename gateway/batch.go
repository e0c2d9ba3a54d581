package gateway

import (
	"bufio"
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
// Every write to the network has a deadline at least 9/10 of timeout after
// its start: a client that stops reading fails the write, and the
// connection is then closed. Writes of the library's own (pongs, the close
// handshake) pass through the same way, in order with the batch.
type batchConn struct {
	net.Conn
	timeout time.Duration
	pool    *sync.Pool // of *[]byte

	mu       sync.Mutex
	holding  bool      // guarded by mu
	buf      *[]byte   // guarded by mu; from pool, only while holding
	deadline time.Time // guarded by mu: the write deadline set last
}

// Write implements io.Writer for the library.
func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	// Moving the deadline costs about as much as a small write, so it is
	// moved only when less than 9/10 of the timeout is left.
	if now := time.Now(); c.deadline.Sub(now) < c.timeout-c.timeout/10 {
		c.deadline = now.Add(c.timeout)
		_ = c.Conn.SetWriteDeadline(c.deadline)
	}
	return c.Conn.Write(p)
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
