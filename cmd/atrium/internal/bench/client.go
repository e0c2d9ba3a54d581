package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/session"
)

// client is a minimal REST client of the wire contract (DESIGN §7) acting as
// one user with the dev identity. It is safe for concurrent use.
type client struct {
	base string // "http://127.0.0.1:port"
	auth string // "Bearer dev:<user>"
	http *http.Client
}

func newClient(base, user string) *client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     30 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	return &client{
		base: strings.TrimSuffix(base, "/"),
		auth: "Bearer dev:" + user,
		http: &http.Client{Transport: tr},
	}
}

// close drops the client's idle keep-alive connections.
func (c *client) close() { c.http.CloseIdleConnections() }

// do sends a request with a JSON body (raw bytes, or a value to encode when
// body is not []byte) and decodes a 2xx JSON response into out (if not nil).
// A non-2xx response becomes an error carrying the contract's error code.
func (c *client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", c.auth)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var eb session.ErrorBody
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if json.Unmarshal(raw, &eb) == nil && eb.Error != nil {
			return fmt.Errorf("%s %s: %s: %w", method, path, resp.Status, eb.Error)
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

// createSession creates a session whose harness runs argv on every turn.
func (c *client) createSession(ctx context.Context, title string, argv []string) (session.Session, error) {
	body := map[string]any{"title": title}
	if argv != nil {
		body["harness"] = map[string]any{"command": argv}
	}
	var s session.Session
	err := c.do(ctx, http.MethodPost, "/v1/sessions", body, &s)
	return s, err
}

func (c *client) getSession(ctx context.Context, id session.ID) (session.Session, error) {
	var s session.Session
	err := c.do(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(string(id)), nil, &s)
	return s, err
}

func (c *client) listSessions(ctx context.Context) ([]session.Session, error) {
	var out struct {
		Sessions []session.Session `json:"sessions"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/sessions", nil, &out)
	return out.Sessions, err
}

// promptBody returns the encoded body of a prompt; callers reuse it.
func promptBody(text string) []byte {
	b, _ := json.Marshal(map[string]string{"text": text})
	return b
}

// prompt posts an encoded prompt body and returns the seq at which it is
// durable.
func (c *client) prompt(ctx context.Context, id session.ID, body []byte) (session.Seq, error) {
	var out struct {
		Seq session.Seq `json:"seq"`
	}
	err := c.do(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(string(id))+"/messages", body, &out)
	return out.Seq, err
}

// wsConn is one cheap WebSocket client of a session: one goroutine reading
// into a reused buffer, frames handed to a callback without a full decode.
type wsConn struct {
	conn  *websocket.Conn
	hello session.HelloFrame
	buf   []byte
}

// dialWS opens the session's WebSocket resuming after seq after (after < 0:
// no after parameter) and reads the hello frame.
func (c *client) dialWS(ctx context.Context, id session.ID, after session.Seq) (*wsConn, error) {
	return c.dialWSWith(ctx, id, after, session.Subprotocol)
}

// dialWSWith is dialWS offering the subprotocols protos.
func (c *client) dialWSWith(ctx context.Context, id session.ID, after session.Seq, protos ...string) (*wsConn, error) {
	u := "ws" + strings.TrimPrefix(c.base, "http") + "/v1/sessions/" + url.PathEscape(string(id)) + "/ws"
	if after >= 0 {
		u += "?after=" + strconv.FormatInt(after, 10)
	}
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPClient:   c.http,
		HTTPHeader:   http.Header{"Authorization": {c.auth}},
		Subprotocols: protos,
	})
	if err != nil {
		return nil, fmt.Errorf("dial websocket: %w", err)
	}
	conn.SetReadLimit(-1) // presence frames of a thousand watchers are large
	w := &wsConn{conn: conn, buf: make([]byte, 1024)}
	frame, err := w.read(ctx)
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if err := json.Unmarshal(frame, &w.hello); err != nil || w.hello.Type != session.FrameHello {
		conn.CloseNow()
		return nil, fmt.Errorf("first frame is not a hello: %.200s", frame)
	}
	return w, nil
}

// read returns the next message; the slice is valid until the next read.
// With a context that has no Done channel the library arms no timer, so the
// hot loop passes context.Background and stops the reader by closing.
func (w *wsConn) read(ctx context.Context) ([]byte, error) {
	_, r, err := w.conn.Reader(ctx)
	if err != nil {
		return nil, err
	}
	n := 0
	for {
		if n == len(w.buf) {
			w.buf = append(w.buf, make([]byte, len(w.buf))...)
		}
		m, err := r.Read(w.buf[n:])
		n += m
		if err == io.EOF {
			return w.buf[:n], nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// readLoop hands every frame to fn until the connection ends; it returns
// nil when the connection was closed by us.
func (w *wsConn) readLoop(fn func(frame []byte)) error {
	for {
		frame, err := w.read(context.Background())
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		fn(frame)
	}
}

func (w *wsConn) write(ctx context.Context, frame []byte) error {
	return w.conn.Write(ctx, websocket.MessageText, frame)
}

func (w *wsConn) close() { w.conn.CloseNow() }

const eventPrefix = `{"type":"event","event":`

// parseEventsFrame returns the seqs of an events frame's events (appended
// to seqs); ok is false for other frames. Like parseEventFrame it does not
// decode the events: it finds each one's end by its braces (outside
// strings) and scans its head for the seq, so both protocols cost the
// reader alike.
func parseEventsFrame(b []byte, seqs []session.Seq) (_ []session.Seq, ok bool) {
	b, ok = bytes.CutPrefix(b, []byte(session.EventsFrameHead))
	if !ok {
		return seqs, false
	}
	for len(b) > 0 && b[0] == '{' {
		end := objectEnd(b)
		if end < 0 {
			return seqs, false
		}
		s, ok := scanInt(b[:end], `"seq":`)
		if !ok {
			return seqs, false
		}
		seqs = append(seqs, s)
		b = b[end:]
		if len(b) > 0 && b[0] == ',' {
			b = b[1:]
		}
	}
	return seqs, string(b) == "]}"
}

// objectEnd returns the length of the JSON object at the start of b, or -1.
func objectEnd(b []byte) int {
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// parseEventFrame extracts an event frame's seq and time. Gateways write
// frames with session.AppendEventFrame around the node's encoding of
// session.Event, so a byte scan finds both; anything unusual falls back to a
// full decode. ok is false for frames that are not events.
func parseEventFrame(b []byte) (seq session.Seq, t time.Time, ok bool) {
	if bytes.HasPrefix(b, []byte(eventPrefix)) {
		ev := b[len(eventPrefix):]
		if s, ok1 := scanInt(ev, `"seq":`); ok1 {
			if ts, ok2 := scanTime(ev); ok2 {
				return s, ts, true
			}
		}
	} else if !bytes.Contains(b, []byte(`"event"`)) {
		return 0, time.Time{}, false
	}
	var f struct {
		Type  string `json:"type"`
		Event struct {
			Seq  session.Seq  `json:"seq"`
			Time session.Time `json:"time"`
		} `json:"event"`
	}
	if json.Unmarshal(b, &f) != nil || f.Type != session.FrameEvent {
		return 0, time.Time{}, false
	}
	return f.Event.Seq, f.Event.Time.Time, true
}

// parseAckFrame extracts an ack frame's client_id and seq; ok is false for
// other frames.
func parseAckFrame(b []byte) (clientID string, seq session.Seq, ok bool) {
	if bytes.HasPrefix(b, []byte(`{"type":"ack"`)) {
		if s, ok := scanInt(b, `"seq":`); ok {
			return scanString(b, `"client_id":"`), s, true
		}
	}
	if !bytes.Contains(b, []byte(`"ack"`)) {
		return "", 0, false
	}
	var f session.AckFrame
	if json.Unmarshal(b, &f) != nil || f.Type != session.FrameAck {
		return "", 0, false
	}
	return f.ClientID, f.Seq, true
}

// scanString returns the JSON string after key (no escapes expected).
func scanString(b []byte, key string) string {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return ""
	}
	b = b[i+len(key):]
	j := bytes.IndexByte(b, '"')
	if j < 0 {
		return ""
	}
	return string(b[:j])
}

// scanInt returns the integer after the first occurrence of key.
func scanInt(b []byte, key string) (int64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	b = b[i+len(key):]
	var v int64
	n := 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		v = v*10 + int64(b[n]-'0')
		n++
	}
	return v, n > 0
}

// scanTime parses the first "time" field, fast for the fixed wire layout
// session.TimeLayout in UTC and with time.Parse otherwise.
func scanTime(b []byte) (time.Time, bool) {
	const key = `"time":"`
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return time.Time{}, false
	}
	b = b[i+len(key):]
	j := bytes.IndexByte(b, '"')
	if j < 0 {
		return time.Time{}, false
	}
	s := b[:j]
	if t, ok := parseWireTime(s); ok {
		return t, true
	}
	t, err := time.Parse(time.RFC3339Nano, string(s))
	return t, err == nil
}

// parseWireTime parses "2006-01-02T15:04:05.000000000Z" without allocating.
func parseWireTime(s []byte) (time.Time, bool) {
	if len(s) != 30 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' || s[29] != 'Z' {
		return time.Time{}, false
	}
	num := func(from, to int) (int, bool) {
		v := 0
		for k := from; k < to; k++ {
			c := s[k]
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	year, ok1 := num(0, 4)
	mon, ok2 := num(5, 7)
	day, ok3 := num(8, 10)
	hh, ok4 := num(11, 13)
	mm, ok5 := num(14, 16)
	ss, ok6 := num(17, 19)
	ns, ok7 := num(20, 29)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) {
		return time.Time{}, false
	}
	return time.Date(year, time.Month(mon), day, hh, mm, ss, ns, time.UTC), true
}
