package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/session"
)

// centrifugo is a peer Centrifugo server (v6, memory engine) that the resume
// scenario replays the same history from, through the same WebSocket
// library, for a ratio measured in the same run. Its channel needs history
// of at least ResumeEvents and a recovery limit as large (see
// docs/benchmarks.md for the configuration).
type centrifugo struct {
	base   string // http://host:port
	apiKey string
	http   *http.Client
}

// newCentrifugo parses a peer URL, http://APIKEY@host:port.
func newCentrifugo(raw string) (*centrifugo, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User == nil {
		return nil, fmt.Errorf("centrifugo peer %q: want http://APIKEY@host:port", raw)
	}
	key := u.User.Username()
	u.User = nil
	return &centrifugo{base: strings.TrimSuffix(u.String(), "/"), apiKey: key, http: &http.Client{Timeout: 30 * time.Second}}, nil
}

// api calls the server API method with body and decodes its result.
func (c *centrifugo) api(ctx context.Context, method string, body, result any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", c.base+"/api/"+method, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("centrifugo %s: %w", method, err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	var out struct {
		Error *struct {
			Code    int
			Message string
		} `json:"error"`
		Result json.RawMessage `json:"result"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(rb, &out) != nil {
		return fmt.Errorf("centrifugo %s: %s %.200s", method, resp.Status, rb)
	}
	if out.Error != nil {
		return fmt.Errorf("centrifugo %s: %d %s", method, out.Error.Code, out.Error.Message)
	}
	if result != nil {
		return json.Unmarshal(out.Result, result)
	}
	return nil
}

// fill publishes evs, in order, into a fresh channel and returns its name
// and history epoch.
func (c *centrifugo) fill(ctx context.Context, evs []json.RawMessage) (channel, epoch string, err error) {
	channel = "atrium_bench_" + fmt.Sprint(time.Now().UnixNano())
	type publish struct {
		Channel string          `json:"channel"`
		Data    json.RawMessage `json:"data"`
	}
	for len(evs) > 0 {
		n := min(len(evs), 500)
		var cmds []map[string]publish
		for _, ev := range evs[:n] {
			cmds = append(cmds, map[string]publish{"publish": {Channel: channel, Data: ev}})
		}
		if err := c.api(ctx, "batch", map[string]any{"commands": cmds}, nil); err != nil {
			return "", "", err
		}
		evs = evs[n:]
	}
	var h struct {
		Epoch  string `json:"epoch"`
		Offset uint64 `json:"offset"`
	}
	if err := c.api(ctx, "history", map[string]any{"channel": channel, "limit": 0}, &h); err != nil {
		return "", "", err
	}
	return channel, h.Epoch, nil
}

// replay connects, subscribes to channel recovering from offset 0 of epoch,
// and reads until it has publication n, checking that offsets arrive 1, 2,
// 3 … (scanned like Atrium's seqs, without decoding the data).
func (c *centrifugo) replay(ctx context.Context, channel, epoch string, n int64) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.Now()
	conn, _, err := websocket.Dial(rctx, "ws"+strings.TrimPrefix(c.base, "http")+"/connection/websocket", nil)
	if err != nil {
		return 0, fmt.Errorf("dial centrifugo: %w", err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(-1)
	cmd := fmt.Sprintf(`{"id":1,"connect":{}}`+"\n"+`{"id":2,"subscribe":{"channel":%q,"recover":true,"epoch":%q,"offset":0}}`, channel, epoch)
	if err := conn.Write(rctx, websocket.MessageText, []byte(cmd)); err != nil {
		return 0, fmt.Errorf("write to centrifugo: %w", err)
	}
	w := &wsConn{conn: conn, buf: make([]byte, 1024)}
	var last int64
	for last < n {
		frame, err := w.read(rctx)
		if err != nil {
			return 0, fmt.Errorf("after offset %d: %w", last, err)
		}
		// Replies are newline-separated; the subscribe reply holds the
		// recovered publications, later pushes one each.
		for _, line := range bytes.Split(frame, []byte("\n")) {
			if bytes.Contains(line, []byte(`"error"`)) && !bytes.Contains(line, []byte(`"publications"`)) {
				return 0, fmt.Errorf("centrifugo: %.300s", line)
			}
			i := bytes.Index(line, []byte(`"publications":[`))
			if i < 0 {
				continue
			}
			b := line[i+len(`"publications":[`):]
			for len(b) > 0 && b[0] == '{' {
				end := objectEnd(b)
				if end < 0 {
					return 0, fmt.Errorf("centrifugo: publication cut short after offset %d", last)
				}
				off, ok := scanInt(b[:end], `},"offset":`)
				if !ok {
					return 0, fmt.Errorf("centrifugo: publication without offset: %.200s", b[:end])
				}
				if off != last+1 {
					return 0, fmt.Errorf("centrifugo: offset %d after %d", off, last)
				}
				last = off
				b = b[end:]
				if len(b) > 0 && b[0] == ',' {
					b = b[1:]
				}
			}
		}
	}
	return time.Since(t), nil
}

// firstEvents reads the first n events of session id over REST, as the
// peer's publications.
func (c *client) firstEvents(ctx context.Context, id session.ID, n int64) ([]json.RawMessage, error) {
	var evs []json.RawMessage
	for int64(len(evs)) < n {
		page, err := c.history(ctx, id, session.Seq(len(evs)), 1000)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		evs = append(evs, page...)
	}
	return evs[:min(int64(len(evs)), n)], nil
}
