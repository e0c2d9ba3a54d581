package modelgw_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	anthropicKey = "sk-ant-REAL"
	openaiKey    = "sk-openai-REAL"
	geminiKey    = "AIza-REAL"
)

// rig is a gateway in front of a scripted model server.
type rig struct {
	gw   *modelgw.Gateway
	url  string // the gateway's base URL
	up   *modeltest.Server
	reg  *prometheus.Registry
	mu   sync.Mutex
	used []session.UsageData // guarded by mu
	who  []string            // guarded by mu: "session/turn/user" of each usage
	over []string            // guarded by mu
	aud  []modelgw.AuditEntry
	now  time.Time // guarded by mu
}

func newRig(t *testing.T, edit func(*modelgw.Config)) *rig {
	t.Helper()
	r := &rig{up: modeltest.New(t), reg: prometheus.NewRegistry(), now: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}
	cfg := modelgw.Config{
		Providers: []modelgw.Provider{
			{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: r.up.URL, APIKey: anthropicKey,
				Prices: map[string]modelgw.Price{"claude-x": {Input: 3, Output: 15, Cached: 0.3}}},
			{Name: "openai", Kind: modelgw.KindOpenAI, BaseURL: r.up.URL + "/v1", APIKey: openaiKey,
				Prices: map[string]modelgw.Price{"*": {Input: 1, Output: 2}}},
			{Name: "gemini", Kind: modelgw.KindGemini, BaseURL: r.up.URL, APIKey: geminiKey},
		},
		Registerer: r.reg,
		OnUsage: func(id session.ID, turn int64, user string, u session.UsageData) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.used = append(r.used, u)
			r.who = append(r.who, fmt.Sprintf("%s/%d/%s", id, turn, user))
		},
		OnOverBudget: func(id session.ID, turn int64, reason string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.over = append(r.over, fmt.Sprintf("%s/%d: %s", id, turn, reason))
		},
		Audit: func(e modelgw.AuditEntry) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.aud = append(r.aud, e)
		},
		Now: func() time.Time {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.now
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	gw, err := modelgw.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	r.gw, r.url = gw, srv.URL
	return r
}

// token issues and activates a token for session id.
func (r *rig) token(t *testing.T, id session.ID, tenant string) string {
	t.Helper()
	tok := r.gw.Issue(id, tenant)
	if err := r.gw.Activate(tok, 1, "ann"); err != nil {
		t.Fatal(err)
	}
	return tok
}

func (r *rig) usage() []session.UsageData {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]session.UsageData(nil), r.used...)
}

func do(t *testing.T, method, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] != "" {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestGateway_HeaderForms(t *testing.T) {
	r := newRig(t, nil)
	tok := r.token(t, "s1", "acme")
	cases := []struct {
		name, path, body, header, value, upHeader, upValue string
	}{
		{"x-api-key", "/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key", tok, "X-Api-Key", anthropicKey},
		{"bearer", "/openai/v1/chat/completions", `{"model":"gpt-x"}`, "Authorization", "Bearer " + tok, "Authorization", "Bearer " + openaiKey},
		{"responses", "/openai/v1/responses", `{"model":"gpt-x"}`, "Authorization", "Bearer " + tok, "Authorization", "Bearer " + openaiKey},
		{"x-goog-api-key", "/gemini/v1beta/models/gemini-x:generateContent", `{}`, "x-goog-api-key", tok, "X-Goog-Api-Key", geminiKey},
		{"query key", "/gemini/v1beta/models/gemini-x:generateContent?key=" + tok, `{}`, "", "", "X-Goog-Api-Key", geminiKey},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.up.Reset()
			resp, body := do(t, "POST", r.url+c.path, c.body, c.header, c.value)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			reqs := r.up.Requests()
			if len(reqs) != 1 {
				t.Fatalf("%d upstream requests", len(reqs))
			}
			up := reqs[0]
			if got := up.Header.Get(c.upHeader); got != c.upValue {
				t.Errorf("upstream %s = %q, want %q", c.upHeader, got, c.upValue)
			}
			for k, vs := range up.Header {
				for _, v := range vs {
					if strings.Contains(v, tok) {
						t.Errorf("the sandbox token reached upstream in %s", k)
					}
				}
			}
			if strings.Contains(up.RawQuery, tok) || strings.Contains(up.RawQuery, "key=") {
				t.Errorf("the token reached upstream in the query %q", up.RawQuery)
			}
		})
	}
}

func TestGateway_Unauthorized(t *testing.T) {
	r := newRig(t, nil)
	inactive := r.gw.Issue("s1", "")
	deactivated := r.token(t, "s2", "")
	r.gw.Deactivate(deactivated)
	revoked := r.token(t, "s3", "")
	r.gw.Revoke(revoked)
	if err := r.gw.Activate(revoked, 2, "ann"); err == nil {
		t.Fatal("a revoked token was activated again")
	}
	for name, tok := range map[string]string{"forged": modelgw.TokenPrefix + "forged", "none": "",
		"issued, not active": inactive, "deactivated": deactivated, "revoked": revoked, "real key": anthropicKey} {
		t.Run(name, func(t *testing.T) {
			resp, body := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key", tok)
			var e struct {
				Type  string
				Error struct{ Type, Message string }
			}
			json.Unmarshal([]byte(body), &e)
			if resp.StatusCode != 401 || e.Type != "error" || e.Error.Type != "authentication_error" {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			resp, body = do(t, "POST", r.url+"/openai/v1/chat/completions", `{"model":"x"}`, "Authorization", "Bearer "+tok)
			if resp.StatusCode != 401 || !strings.Contains(body, `"invalid_api_key"`) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
		})
	}
	if n := len(r.up.Requests()); n != 0 {
		t.Fatalf("%d refused requests reached upstream", n)
	}
	// Reactivated for the next turn, the deactivated token works again.
	if err := r.gw.Activate(deactivated, 2, "bob"); err != nil {
		t.Fatal(err)
	}
	if resp, body := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key", deactivated); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// sseData reads the data lines of an SSE stream.
func sseData(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestGateway_Stream10000Chunks(t *testing.T) {
	r := newRig(t, nil)
	tok := r.token(t, "s1", "")
	chunks := make([]string, 10000)
	for i := range chunks {
		chunks[i] = fmt.Sprintf("<%05d>", i)
	}
	r.up.Push(modeltest.Reply{Chunks: chunks, Usage: &modeltest.Usage{InputTokens: 10, OutputTokens: 10000}})
	req, _ := http.NewRequest("POST", r.url+"/anthropic/v1/messages", strings.NewReader(`{"model":"claude-x","stream":true}`))
	req.Header.Set("x-api-key", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []string
	for _, d := range sseData(t, resp.Body) {
		var ev struct {
			Type  string
			Delta struct{ Type, Text string }
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatalf("event %q: %v", d, err)
		}
		if ev.Delta.Type == "text_delta" {
			got = append(got, ev.Delta.Text)
		}
	}
	if len(got) != len(chunks) {
		t.Fatalf("%d chunks arrived, want %d", len(got), len(chunks))
	}
	for i := range chunks {
		if got[i] != chunks[i] {
			t.Fatalf("chunk %d is %q, want %q", i, got[i], chunks[i])
		}
	}
	waitUsage(t, r, 1)
	if u := r.usage()[0]; u.InputTokens != 10 || u.OutputTokens != 10000 {
		t.Fatalf("usage %+v", u)
	}
}

// waitUsage waits for n usage callbacks (the gateway settles a call just
// after its last byte is written).
func waitUsage(t *testing.T, r *rig, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(r.usage()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d usage callbacks, want %d", len(r.usage()), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestGateway_Unbuffered(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}))
	defer up.Close()
	r := newRig(t, func(c *modelgw.Config) { c.Providers[0].BaseURL = up.URL })
	tok := r.token(t, "s1", "")
	req, _ := http.NewRequest("POST", r.url+"/anthropic/v1/messages", strings.NewReader(`{"model":"claude-x","stream":true}`))
	req.Header.Set("x-api-key", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	// The first event arrives while upstream still holds the rest.
	for _, want := range []string{"event: message_start\n", "data: {\"type\":\"message_start\"}\n"} {
		line, err := br.ReadString('\n')
		if err != nil || line != want {
			t.Fatalf("read %q, %v; want %q", line, err, want)
		}
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "message_stop") {
		t.Fatalf("rest %q", rest)
	}
}

func TestGateway_Usage(t *testing.T) {
	r := newRig(t, nil)
	tok := r.token(t, "s1", "acme")
	u := &modeltest.Usage{InputTokens: 1000, OutputTokens: 200, CachedTokens: 400}
	cases := []struct {
		name, path, body, hdr string
		want                  session.UsageData
	}{
		// Anthropic reports input without cache reads: the gateway counts
		// them in (1000 + 400).
		{"anthropic stream", "/anthropic/v1/messages", `{"model":"claude-x","stream":true}`, "x-api-key",
			session.UsageData{Model: "claude-x", InputTokens: 1400, OutputTokens: 200, CachedTokens: 400,
				CostUSD: (1000*3 + 400*0.3 + 200*15) / 1e6}},
		{"anthropic", "/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key",
			session.UsageData{Model: "claude-x", InputTokens: 1400, OutputTokens: 200, CachedTokens: 400,
				CostUSD: (1000*3 + 400*0.3 + 200*15) / 1e6}},
		{"chat stream", "/openai/v1/chat/completions", `{"model":"gpt-x","stream":true,"stream_options":{"include_usage":true}}`, "Authorization",
			session.UsageData{Model: "gpt-x", InputTokens: 1000, OutputTokens: 200, CachedTokens: 400, CostUSD: (1000*1 + 200*2) / 1e6}},
		{"chat", "/openai/v1/chat/completions", `{"model":"gpt-x"}`, "Authorization",
			session.UsageData{Model: "gpt-x", InputTokens: 1000, OutputTokens: 200, CachedTokens: 400, CostUSD: (1000*1 + 200*2) / 1e6}},
		{"responses stream", "/openai/v1/responses", `{"model":"gpt-x","stream":true}`, "Authorization",
			session.UsageData{Model: "gpt-x", InputTokens: 1000, OutputTokens: 200, CachedTokens: 400, CostUSD: (1000*1 + 200*2) / 1e6}},
		{"gemini sse", "/gemini/v1beta/models/gemini-x:streamGenerateContent?alt=sse", `{}`, "x-goog-api-key",
			session.UsageData{Model: "gemini-x", InputTokens: 1000, OutputTokens: 200, CachedTokens: 400}},
		{"gemini array", "/gemini/v1beta/models/gemini-x:streamGenerateContent", `{}`, "x-goog-api-key",
			session.UsageData{Model: "gemini-x", InputTokens: 1000, OutputTokens: 200, CachedTokens: 400}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.up.Push(modeltest.Reply{Chunks: []string{"a", "b"}, Tools: []modeltest.ToolCall{{Name: "f", Input: json.RawMessage(`{"usage":1}`)}}, Usage: u})
			v := tok
			if c.hdr == "Authorization" {
				v = "Bearer " + tok
			}
			resp, body := do(t, "POST", r.url+c.path, c.body, c.hdr, v)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			waitUsage(t, r, i+1)
			got := r.usage()[i]
			c.want.Turn = 1
			if got.Model != c.want.Model || got.InputTokens != c.want.InputTokens || got.OutputTokens != c.want.OutputTokens ||
				got.CachedTokens != c.want.CachedTokens || fmt.Sprintf("%.9f", got.CostUSD) != fmt.Sprintf("%.9f", c.want.CostUSD) || got.Turn != 1 {
				t.Fatalf("usage %+v, want %+v", got, c.want)
			}
		})
	}
	if v := metric(t, r.reg, "atrium_model_tokens_total", "provider", "anthropic", "model", "claude-x", "type", "input"); v != 2800 {
		t.Errorf("anthropic input tokens metric %v, want 2800", v)
	}
	if v := metric(t, r.reg, "atrium_model_requests_total", "provider", "openai", "model", "gpt-x", "status", "200"); v != 3 {
		t.Errorf("openai requests metric %v, want 3", v)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.aud) != len(cases) {
		t.Fatalf("%d audit entries, want %d", len(r.aud), len(cases))
	}
	if a := r.aud[0]; a.Session != "s1" || a.Tenant != "acme" || a.User != "ann" || a.Provider != "anthropic" ||
		a.Model != "claude-x" || a.Status != 200 || a.Usage.OutputTokens != 200 {
		t.Fatalf("audit %+v", a)
	}
}

// metric is the value of the series of name with labels (name, value
// pairs).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
