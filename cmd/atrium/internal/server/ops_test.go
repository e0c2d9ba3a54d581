package server_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
)

// Scrape is one /metrics scrape: the value of every sample, keyed by its
// line's name and labels as printed ("atrium_node_turns_total{status=\"ok\"}").
type scrape map[string]float64

// scrapeMetrics reads s's /metrics.
func scrapeMetrics(t testing.TB, base string) scrape {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape /metrics: %s", resp.Status)
	}
	out := scrape{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	return out
}

// sum adds the samples of metric name whose labels contain every one of
// labels (`status="ok"`).
func (s scrape) sum(name string, labels ...string) float64 {
	total := 0.0
	for k, v := range s {
		n, l, _ := strings.Cut(k, "{")
		if n != name {
			continue
		}
		ok := true
		for _, want := range labels {
			ok = ok && strings.Contains(l, want)
		}
		if ok {
			total += v
		}
	}
	return total
}

// names returns the metric families of the scrape (histograms' and
// summaries' suffixes removed).
func (s scrape) names() map[string]bool {
	out := map[string]bool{}
	for k := range s {
		n, _, _ := strings.Cut(k, "{")
		out[n] = true
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suf); ok {
				out[b] = true
			}
		}
	}
	return out
}

func TestMetrics_MoveWhenASessionRunsATurn(t *testing.T) {
	st := startStack(t, nil)
	before := scrapeMetrics(t, st.url)
	for _, name := range []string{"atrium_node_turns_total", "atrium_node_activations_total", "atrium_gateway_nats_request_duration_seconds",
		"atrium_gateway_auth_failures_total", "atrium_node_workspace_save_duration_seconds", "go_goroutines"} {
		if !before.names()[name] {
			t.Errorf("/metrics has no %s before any session", name)
		}
	}

	alice := st.as("alice")
	s := alice.create("metrics", testHarness)
	w := alice.watch(s.ID, 0)
	alice.prompt(s.ID, "hello")
	alice.waitTurn(s.ID, 1)
	for f := w.next("turn_finished"); !strings.Contains(string(f.raw), `"turn_finished"`); f = w.next("turn_finished") {
	}
	// A failed authentication (a bad API token).
	req, _ := http.NewRequest("GET", st.url+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer atr_not_a_token")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	var after scrape
	deadline := time.Now().Add(waitLong)
	for {
		after = scrapeMetrics(t, st.url)
		if after.sum("atrium_node_workspace_save_duration_seconds_count", `result="ok"`) > before.sum("atrium_node_workspace_save_duration_seconds_count", `result="ok"`) &&
			after.sum("atrium_sessions", `state="active"`) >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling a scrape, bounded by deadline
	}
	grew := func(name string, labels ...string) {
		t.Helper()
		if b, a := before.sum(name, labels...), after.sum(name, labels...); a <= b {
			t.Errorf("%s%v did not grow: %v → %v", name, labels, b, a)
		}
	}
	grew("atrium_node_turns_total", `status="ok"`)
	grew("atrium_node_turn_duration_seconds_count")
	grew("atrium_node_activations_total")
	grew("atrium_node_events_appended_total")
	grew("atrium_node_workspace_save_duration_seconds_count", `result="ok"`)
	grew("atrium_node_workspace_restore_duration_seconds_count", `result="ok"`)
	grew("atrium_gateway_nats_request_duration_seconds_count", `kind="place"`)
	grew("atrium_gateway_nats_request_duration_seconds_count", `kind="cmd"`)
	grew("atrium_gateway_events_fanned_out_total")
	grew("atrium_gateway_fanout_lag_seconds_count")
	grew("atrium_gateway_auth_failures_total", `reason="invalid"`)
	if n := after.sum("atrium_node_sessions_active"); n != 1 {
		t.Errorf("atrium_node_sessions_active = %v, want 1", n)
	}
	if n := after.sum("atrium_sessions", `state="active"`); n != 1 {
		t.Errorf(`atrium_sessions{state="active"} = %v, want 1`, n)
	}
	if n := after.sum("atrium_node_sandboxes_awake"); n != 1 {
		t.Errorf("atrium_node_sandboxes_awake = %v, want 1", n)
	}
	if n := after.sum("atrium_gateway_watchers", `transport="ws"`); n != 1 {
		t.Errorf(`atrium_gateway_watchers{transport="ws"} = %v, want 1`, n)
	}
}

// readiness fetches /readyz.
func readiness(t testing.TB, base string) (int, server.Readiness) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	var r server.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("decode /readyz: %v", err)
	}
	return resp.StatusCode, r
}

func checkOf(r server.Readiness, name string) server.Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return server.Check{Name: name, Error: "missing"}
}

// The embedded NATS server is shut down and started again on the same
// store: the server's NATS connection really disconnects and reconnects
// (through the same in-process dialer as at start), which is what an
// outage of an external NATS looks like to the gateway and the node.
func TestReadiness_FlipsWhenNATSGoesAwayAndComesBack(t *testing.T) {
	st := startStack(t, nil)
	code, r := readiness(t, st.url)
	if code != http.StatusOK || !r.Ready {
		t.Fatalf("/readyz = %d %+v, want 200 ready", code, r)
	}
	for _, name := range []string{"nats", "history", "object_store", "leases"} {
		if c := checkOf(r, name); !c.OK {
			t.Errorf("check %s = %+v, want ok", name, c)
		}
	}

	server.StopNATS(st.srv)
	waitReady(t, st.url, false)
	_, r = readiness(t, st.url)
	if c := checkOf(r, "nats"); c.OK || !strings.Contains(c.Error, "not connected to NATS") {
		t.Errorf("nats check while NATS is down = %+v", c)
	}
	if c := checkOf(r, "history"); !c.OK {
		t.Errorf("history check while NATS is down = %+v, want ok", c)
	}

	if err := server.StartNATS(st.srv); err != nil {
		t.Fatalf("restart NATS: %v", err)
	}
	waitReady(t, st.url, true)

	// The stack works again: a session runs a turn.
	alice := st.as("alice")
	s := alice.create("after outage", testHarness)
	alice.prompt(s.ID, "hello")
	alice.waitTurn(s.ID, 1)
}

func waitReady(t testing.TB, base string, want bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		code, r := readiness(t, base)
		if r.Ready == want && (code == http.StatusOK) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz stayed %d %+v, want ready=%v", code, r, want)
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by deadline
	}
}

func TestReadiness_ObjectStoreNotWritable(t *testing.T) {
	st := startStack(t, nil)
	// The object store directory becomes a file: every put fails.
	objects := filepath.Join(st.srv.DataDir(), "objects")
	if err := os.RemoveAll(objects); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(objects, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, r := readiness(t, st.url)
	if code != http.StatusServiceUnavailable || r.Ready {
		t.Fatalf("/readyz = %d %+v, want 503", code, r)
	}
	if c := checkOf(r, "object_store"); c.OK || !strings.Contains(c.Error, "put a probe object") {
		t.Errorf("object_store check = %+v, want a failed put", c)
	}
	if c := checkOf(r, "nats"); !c.OK {
		t.Errorf("nats check = %+v, want ok", c)
	}
	if err := server.ProbeDir(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("ProbeDir of a missing directory succeeded")
	}
}

var hexID = regexp.MustCompile(`^[0-9a-f]{16}$`)

func TestRequestID(t *testing.T) {
	st := startStack(t, nil)
	get := func(id string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", st.url+"/healthz", nil)
		if id != "" {
			req.Header.Set(server.HeaderRequestID, id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get(server.HeaderRequestID)
	}
	if got := get("req-42.a_b"); got != "req-42.a_b" {
		t.Errorf("echoed request id = %q, want the client's", got)
	}
	if got := get(""); !hexID.MatchString(got) {
		t.Errorf("generated request id = %q, want 16 hex digits", got)
	}
	if got := get("evil\"id with spaces"); !hexID.MatchString(got) {
		t.Errorf("request id for an unsafe client id = %q, want a generated one", got)
	}
}
