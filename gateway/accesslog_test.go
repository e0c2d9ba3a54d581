package gateway_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/gateway"
)

// lockedBuffer is a bytes.Buffer safe for the handler's and the test's
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("access log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestAccessLog_OneLinePerRequest checks that every request, served or
// refused, gets one access log line naming its route, status, size and
// caller, and that the query string is never logged.
func TestAccessLog_OneLinePerRequest(t *testing.T) {
	var buf lockedBuffer
	e := newEnv(t, func(c *gateway.Config) {
		c.AccessLog = slog.New(slog.NewJSONHandler(&buf, nil))
	})
	sess := e.create("alice", "logged")
	if code, _ := e.call(http.MethodGet, "/v1/sessions/"+string(sess.ID)+"/events?after=0&secret=hunter2", "alice", nil); code != http.StatusOK {
		t.Fatalf("events: %d", code)
	}
	if code, _ := e.call(http.MethodGet, "/v1/sessions", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("unauthenticated list: %d", code)
	}
	lines := buf.lines(t)
	if len(lines) != 3 {
		t.Fatalf("want 3 access log lines (create, events, refused list), got %d: %v", len(lines), lines)
	}
	ev := lines[1]
	if ev["msg"] != "request" || ev["method"] != "GET" || ev["route"] != "GET /v1/sessions/{id}/events" ||
		ev["status"] != float64(200) || ev["user"] != "alice" || ev["bytes"].(float64) <= 0 {
		t.Errorf("events request logged as %v", ev)
	}
	if _, ok := ev["duration_ms"].(float64); !ok {
		t.Errorf("no duration in %v", ev)
	}
	refused := lines[2]
	if refused["status"] != float64(401) || refused["user"] != nil {
		t.Errorf("refused request logged as %v", refused)
	}
	if lines[0]["method"] != "POST" || lines[0]["status"] != float64(201) {
		t.Errorf("create logged as %v", lines[0])
	}
	buf.mu.Lock()
	raw := buf.b.String()
	buf.mu.Unlock()
	if strings.Contains(raw, "hunter2") || strings.Contains(raw, "after=0") {
		t.Errorf("the query string was logged: %s", raw)
	}
}
