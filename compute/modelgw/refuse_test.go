package modelgw_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

func TestGateway_TooLarge(t *testing.T) {
	r := newRig(t, nil)
	tok := r.token(t, "s1", "")
	t.Run("100 MB with a length", func(t *testing.T) {
		body := bytes.Repeat([]byte("x"), 100<<20)
		req, _ := http.NewRequest("POST", r.url+"/anthropic/v1/messages", bytes.NewReader(body))
		req.Header.Set("x-api-key", tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			// The gateway may answer and close before the client has
			// sent it all; the answer is what counts.
			t.Logf("client: %v", err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 413 || !strings.Contains(string(b), "request_too_large") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})
	t.Run("chunked over the limit", func(t *testing.T) {
		r := newRig(t, func(c *modelgw.Config) { c.MaxBody = 1 << 20 })
		tok := r.token(t, "s1", "")
		// A reader without a known length is sent chunked.
		body := io.MultiReader(strings.NewReader(`{"model":"gpt-x","x":"`), bytes.NewReader(bytes.Repeat([]byte("x"), 2<<20)))
		req, _ := http.NewRequest("POST", r.url+"/openai/v1/chat/completions", body)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 413 || !strings.Contains(string(b), "invalid_request_error") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})
	if n := len(r.up.Requests()); n != 0 {
		t.Fatalf("%d requests reached upstream", n)
	}
}

func TestGateway_UpstreamErrors(t *testing.T) {
	t.Run("5xx passed through, not retried", func(t *testing.T) {
		r := newRig(t, nil)
		tok := r.token(t, "s1", "")
		r.up.Push(modeltest.Reply{Status: 529, ErrorMessage: "Overloaded"})
		resp, body := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x","stream":true}`, "x-api-key", tok)
		if resp.StatusCode != 529 || !strings.Contains(body, `"overloaded_error"`) || !strings.Contains(body, "Overloaded") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if n := len(r.up.Requests()); n != 1 {
			t.Fatalf("%d upstream requests, want 1", n)
		}
		r.up.Push(modeltest.Reply{Status: 500, ErrorMessage: "boom"})
		resp, body = do(t, "POST", r.url+"/gemini/v1beta/models/g:generateContent", `{}`, "x-goog-api-key", tok)
		if resp.StatusCode != 500 || !strings.Contains(body, `"INTERNAL"`) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	})
	t.Run("down", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		down := "http://" + ln.Addr().String()
		ln.Close()
		r := newRig(t, func(c *modelgw.Config) { c.Providers[1].BaseURL = down + "/v1" })
		tok := r.token(t, "s1", "")
		resp, body := do(t, "POST", r.url+"/openai/v1/responses", `{"model":"gpt-x"}`, "Authorization", "Bearer "+tok)
		if resp.StatusCode != 502 || !strings.Contains(body, `"server_error"`) || !strings.Contains(body, "openai unreachable") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if strings.Contains(body, openaiKey) {
			t.Fatal("the error shows the real key")
		}
	})
}

func TestGateway_UnknownModel(t *testing.T) {
	var mu sync.Mutex
	var said []string
	r := newRig(t, func(c *modelgw.Config) {
		c.Providers[0].Models = []string{"claude-x", "claude-y"}
		c.Providers = c.Providers[:2] // no gemini
		c.OnRefused = func(id session.ID, turn int64, message string) {
			mu.Lock()
			defer mu.Unlock()
			said = append(said, fmt.Sprintf("%s/%d: %s", id, turn, message))
		}
	})
	defer func() {
		// The session is told once per activation, naming the model.
		mu.Lock()
		defer mu.Unlock()
		if len(said) != 1 || !strings.HasPrefix(said[0], "s1/1: ") || !strings.Contains(said[0], `model "claude-z" is not configured`) {
			t.Errorf("OnRefused calls %q, want one naming claude-z", said)
		}
	}()
	tok := r.token(t, "s1", "")
	resp, body := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-z"}`, "x-api-key", tok)
	if resp.StatusCode != 404 || !strings.Contains(body, `"not_found_error"`) || !strings.Contains(body, `model \"claude-z\" is not configured`) ||
		!strings.Contains(body, "anthropic (anthropic: claude-x, claude-y)") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = do(t, "POST", r.url+"/gemini/v1beta/models/g:generateContent", `{}`, "x-goog-api-key", tok)
	if resp.StatusCode != 404 || !strings.Contains(body, "no gemini provider is configured") || !strings.Contains(body, `"NOT_FOUND"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = do(t, "POST", r.url+"/v1/messages", `{}`, "x-api-key", tok)
	if resp.StatusCode != 404 || !strings.Contains(body, "/anthropic/") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := len(r.up.Requests()); n != 0 {
		t.Fatalf("%d requests reached upstream", n)
	}
	// An allowed model goes through.
	if resp, body := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-y"}`, "x-api-key", tok); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

func TestGateway_Budgets(t *testing.T) {
	r := newRig(t, func(c *modelgw.Config) {
		c.Budgets = []modelgw.Budget{
			{Scope: modelgw.ScopeSession, Period: modelgw.PeriodHour, Tokens: 1000},
			{Scope: modelgw.ScopeTenant, Tenant: "acme", Period: modelgw.PeriodDay, CostUSD: 0.01},
		}
	})
	a := r.token(t, "sa", "")
	r.up.SetDefault(modeltest.Reply{Text: "x", Usage: &modeltest.Usage{InputTokens: 600, OutputTokens: 500}})
	call := func(tok string) (*http.Response, string) {
		return do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x","stream":true}`, "x-api-key", tok)
	}
	if resp, body := call(a); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	waitUsage(t, r, 1)
	for range 2 {
		resp, body := call(a)
		if resp.StatusCode != 429 || !strings.Contains(body, `"rate_limit_error"`) ||
			!strings.Contains(body, "session budget of 1000 tokens per hour") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "1" {
			t.Fatalf("Retry-After %q", ra)
		}
	}
	r.mu.Lock()
	over := append([]string(nil), r.over...)
	r.mu.Unlock()
	if len(over) != 1 || over[0] != "sa/1: over the session budget of 1000 tokens per hour" {
		t.Fatalf("OnOverBudget calls %q, want one", over)
	}
	// Another session has its own budget.
	b := r.token(t, "sb", "")
	if resp, body := call(b); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// The next hour starts a new window.
	r.mu.Lock()
	r.now = r.now.Add(time.Hour)
	r.mu.Unlock()
	if resp, body := call(a); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}

	// Tenant acme: 1100 tokens of claude-x cost 600*3+500*15 = $0.0093
	// each; two sessions of acme share the day's $0.01.
	c1, c2 := r.token(t, "c1", "acme"), r.token(t, "c2", "acme")
	if resp, body := call(c1); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if resp, body := call(c2); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	waitUsage(t, r, 5)
	// A third session of acme, with its own session budget untouched, is
	// refused for the tenant's.
	c3 := r.token(t, "c3", "acme")
	resp, body := do(t, "POST", r.url+"/openai/v1/chat/completions", `{"model":"gpt-x"}`, "Authorization", "Bearer "+c3)
	if resp.StatusCode != 429 || !strings.Contains(body, "tenant acme budget of $0.01 per day") || !strings.Contains(body, "rate_limit_exceeded") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// Another tenant is not limited by acme's budget.
	d := r.token(t, "d1", "other")
	if resp, body := call(d); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

func TestNew_Invalid(t *testing.T) {
	for name, c := range map[string]struct {
		cfg  modelgw.Config
		want string
	}{
		"kind":        {modelgw.Config{Providers: []modelgw.Provider{{Name: "x", Kind: "azure"}}}, `unknown kind "azure"`},
		"compat url":  {modelgw.Config{Providers: []modelgw.Provider{{Name: "x", Kind: modelgw.KindOpenAICompatible}}}, "base_url is required"},
		"bad url":     {modelgw.Config{Providers: []modelgw.Provider{{Name: "x", Kind: modelgw.KindOpenAI, BaseURL: "api.openai.com"}}}, "is not an http(s) URL"},
		"twice":       {modelgw.Config{Providers: []modelgw.Provider{{Name: "x", Kind: modelgw.KindOpenAI}, {Name: "x", Kind: modelgw.KindGemini}}}, "used twice"},
		"budget none": {modelgw.Config{Budgets: []modelgw.Budget{{Scope: modelgw.ScopeSession, Period: modelgw.PeriodDay}}}, "neither tokens nor cost_usd"},
		"period":      {modelgw.Config{Budgets: []modelgw.Budget{{Scope: modelgw.ScopeSession, Period: "week", Tokens: 1}}}, `unknown period "week"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := modelgw.New(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

func TestGateway_UncleanPath(t *testing.T) {
	r := newRig(t, nil)
	tok := r.token(t, "s1", "")
	for _, p := range []string{"/openai/v1/../../admin", "/openai/v1//chat/completions", "/gemini/v1beta/models/x%2F..%2F..%2Fadmin:generateContent"} {
		req, _ := http.NewRequest("POST", r.url+p, strings.NewReader(`{"model":"gpt-x"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("x-goog-api-key", tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "is not clean") {
			t.Errorf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
	if n := len(r.up.Requests()); n != 0 {
		t.Fatalf("%d requests reached upstream", n)
	}
}

// sharedLedger is a Ledger two gateways share, as nodes share NATS KV.
type sharedLedger struct {
	mu sync.Mutex
	m  map[string][2]float64 // guarded by mu
}

func (l *sharedLedger) Spent(_ context.Context, key string) (int64, float64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.m[key]
	return int64(v[0]), v[1], nil
}

func (l *sharedLedger) Add(_ context.Context, key string, tokens int64, cost float64, _ time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.m[key]
	l.m[key] = [2]float64{v[0] + float64(tokens), v[1] + cost}
	return nil
}

func TestGateway_SharedLedger(t *testing.T) {
	l := &sharedLedger{m: map[string][2]float64{}}
	budget := func(c *modelgw.Config) {
		c.Ledger = l
		c.Budgets = []modelgw.Budget{{Scope: modelgw.ScopeTenant, Period: modelgw.PeriodMonth, Tokens: 1500}}
	}
	a, b := newRig(t, budget), newRig(t, budget)
	for _, r := range []*rig{a, b} {
		r.up.SetDefault(modeltest.Reply{Text: "x", Usage: &modeltest.Usage{InputTokens: 600, OutputTokens: 400}})
	}
	call := func(r *rig, id session.ID) int {
		resp, _ := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key", r.token(t, id, "acme"))
		return resp.StatusCode
	}
	if s := call(a, "s1"); s != 200 {
		t.Fatalf("first call on node a: %d", s)
	}
	waitUsage(t, a, 1)
	if s := call(b, "s2"); s != 200 {
		t.Fatalf("first call on node b: %d", s)
	}
	waitUsage(t, b, 1)
	// 2000 tokens of acme's 1500 are spent across both nodes.
	if s := call(a, "s3"); s != 429 {
		t.Fatalf("third call: %d, want 429", s)
	}
	if s := call(b, "s4"); s != 429 {
		t.Fatalf("fourth call: %d, want 429", s)
	}
}

// TestGateway_TokenScope: a call is counted for the session, turn and user
// of the token it carries, whatever other tokens are active.
func TestGateway_TokenScope(t *testing.T) {
	r := newRig(t, nil)
	a := r.gw.Issue("sa", "")
	b := r.gw.Issue("sb", "")
	if err := r.gw.Activate(a, 3, "ann"); err != nil {
		t.Fatal(err)
	}
	if err := r.gw.Activate(b, 7, "bob"); err != nil {
		t.Fatal(err)
	}
	for i, tok := range []string{b, a} {
		if resp, body := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key", tok); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		waitUsage(t, r, i+1)
	}
	r.gw.Deactivate(b) // sb's turn ends; sa's goes on
	if resp, _ := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key", b); resp.StatusCode != 401 {
		t.Fatalf("sb's token after its turn: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "POST", r.url+"/anthropic/v1/messages", `{"model":"claude-x"}`, "x-api-key", a); resp.StatusCode != 200 {
		t.Fatalf("sa's token during its turn: %d", resp.StatusCode)
	}
	waitUsage(t, r, 3)
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := strings.Join(r.who, " "); got != "sb/7/bob sa/3/ann sa/3/ann" {
		t.Fatalf("usage counted for %s", got)
	}
}
