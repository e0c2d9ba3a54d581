package modelgw

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// call is one request in flight through the gateway.
type call struct {
	g       *Gateway
	who     caller
	p       *provider
	model   string
	path    string
	start   time.Time
	fam     family
	meter   *meter // nil for answers that are not metered
	status  int
	settled bool
}

// ServeHTTP routes a sandbox's model request to its provider.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fam, rest, ok := route(r.URL.Path)
	if !ok {
		writeError(w, famOpenAI, http.StatusNotFound, fmt.Sprintf(
			"no model API at %s: the gateway serves /anthropic/…, /openai/v1/… and /gemini/…", r.URL.Path))
		return
	}
	if raw := strings.ToLower(r.URL.RawPath); rest != "" && rest != path.Clean(rest) && rest != path.Clean(rest)+"/" ||
		strings.Contains(raw, "%2f") || strings.Contains(raw, "%2e") || strings.Contains(raw, "%5c") {
		// Dot segments or encoded slashes could reach other paths of the
		// provider's host with its key.
		writeError(w, fam, http.StatusBadRequest, fmt.Sprintf("model API path %q is not clean", r.URL.Path))
		return
	}
	who, ok := g.authenticate(r)
	if !ok {
		g.metrics.refused.WithLabelValues("unauthenticated").Inc()
		writeError(w, fam, http.StatusUnauthorized,
			"invalid or expired Atrium model token: a sandbox's token is accepted only while its session has a turn running")
		return
	}
	if r.ContentLength > g.cfg.MaxBody {
		g.tooLarge(w, fam)
		return
	}
	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, g.cfg.MaxBody+1))
		if err != nil {
			writeError(w, fam, http.StatusBadRequest, "read request body: "+err.Error())
			return
		}
		if int64(len(body)) > g.cfg.MaxBody {
			g.tooLarge(w, fam)
			return
		}
	}
	model := requestModel(fam, rest, body)
	p, err := g.pick(fam, model)
	if err != nil {
		g.metrics.refused.WithLabelValues("unknown_model").Inc()
		writeError(w, fam, http.StatusNotFound, err.Error())
		notify := false
		g.mu.Lock()
		if gr := g.tokens[who.token]; gr != nil && !gr.refused {
			gr.refused, notify = true, true
		}
		g.mu.Unlock()
		if notify && g.cfg.OnRefused != nil {
			g.cfg.OnRefused(who.session, who.turn, "the model gateway refused the agent's request: "+err.Error())
		}
		return
	}
	now := g.now()
	if b, over := g.over(r.Context(), who.session, who.tenant, now); over {
		// The node is told once per activation; the agent may retry.
		notify := false
		g.mu.Lock()
		if gr := g.tokens[who.token]; gr != nil && !gr.warned {
			gr.warned, notify = true, true
		}
		g.mu.Unlock()
		g.metrics.refused.WithLabelValues("over_budget").Inc()
		reason := "over the " + b.String()
		writeError(w, fam, http.StatusTooManyRequests, "Atrium: "+reason+"; the turn is ended")
		if notify && g.cfg.OnOverBudget != nil {
			g.cfg.OnOverBudget(who.session, who.turn, reason)
		}
		return
	}
	c := &call{g: g, who: who, p: p, model: model, path: rest, start: now, fam: fam}
	rp := &httputil.ReverseProxy{
		Rewrite:        func(pr *httputil.ProxyRequest) { c.rewrite(pr, rest, body) },
		Transport:      g.transport,
		FlushInterval:  -1,
		ModifyResponse: c.modifyResponse,
		ErrorHandler:   c.errorHandler,
		ErrorLog:       g.errorLog,
	}
	rp.ServeHTTP(w, r)
	c.settle()
}

func (g *Gateway) tooLarge(w http.ResponseWriter, fam family) {
	g.metrics.refused.WithLabelValues("too_large").Inc()
	writeError(w, fam, http.StatusRequestEntityTooLarge,
		fmt.Sprintf("request body over the gateway's limit of %d bytes", g.cfg.MaxBody))
}

// route splits a gateway path into its API family and the path to append
// to the provider's base URL.
func route(path string) (family, string, bool) {
	for _, f := range []family{famAnthropic, famOpenAI, famGemini} {
		pre := f.prefix()
		if path == pre || strings.HasPrefix(path, pre+"/") {
			return f, path[len(pre):], true
		}
	}
	return "", "", false
}

// requestModel is the model a request asks for: Gemini's is in the path
// (/v1beta/models/NAME:method), the others' in the JSON body.
func requestModel(fam family, rest string, body []byte) string {
	if fam == famGemini {
		i := strings.Index(rest, "/models/")
		if i < 0 {
			return ""
		}
		m, _, _ := strings.Cut(rest[i+len("/models/"):], ":")
		return m
	}
	if len(body) == 0 {
		return ""
	}
	var b struct {
		Model string `json:"model"`
	}
	json.Unmarshal(body, &b)
	return b.Model
}

// pick chooses the provider of fam serving model: the first whose
// allowlist names it, else the first without an allowlist.
func (g *Gateway) pick(fam family, model string) (*provider, error) {
	var open *provider
	found := false
	for _, p := range g.providers {
		if p.fam != fam {
			continue
		}
		found = true
		if model != "" && slices.Contains(p.Models, model) {
			return p, nil
		}
		if (len(p.Models) == 0 || model == "") && open == nil {
			open = p
		}
	}
	switch {
	case open != nil:
		return open, nil
	case !found:
		return nil, fmt.Errorf("no %s provider is configured on this Atrium node (configured: %s)", fam, g.describe())
	default:
		return nil, fmt.Errorf("model %q is not configured on this Atrium node (configured: %s)", model, g.describe())
	}
}

// rewrite makes the upstream request: the provider's URL, the real key in
// the vendor's header, and no trace of the sandbox's token.
func (c *call) rewrite(pr *httputil.ProxyRequest, rest string, body []byte) {
	out := pr.Out
	u := *c.p.base
	u.Path = c.p.base.Path + rest
	u.RawPath = ""
	q := pr.In.URL.Query()
	q.Del("key")
	u.RawQuery = q.Encode()
	out.URL = &u
	out.Host = u.Host
	h := out.Header
	h.Del("Authorization")
	h.Del("X-Api-Key")
	h.Del("X-Goog-Api-Key")
	// Let the transport ask for gzip and decompress, so usage can be read.
	h.Del("Accept-Encoding")
	switch c.p.fam {
	case famAnthropic:
		h.Set("X-Api-Key", c.p.APIKey)
	case famGemini:
		h.Set("X-Goog-Api-Key", c.p.APIKey)
	default:
		if c.p.APIKey != "" {
			h.Set("Authorization", "Bearer "+c.p.APIKey)
		}
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		out.Body, out.GetBody = http.NoBody, nil
	}
	h.Del("Content-Length")
	h.Set("Content-Length", strconv.Itoa(len(body)))
}

// modifyResponse meters a successful answer as it streams through.
func (c *call) modifyResponse(resp *http.Response) error {
	c.status = resp.StatusCode
	if resp.StatusCode/100 == 2 && resp.Request.Method == http.MethodPost {
		ct := resp.Header.Get("Content-Type")
		c.meter = newMeter(c.fam, strings.HasPrefix(ct, "text/event-stream"))
		resp.Body = &meteredBody{ReadCloser: resp.Body, m: c.meter}
	}
	return nil
}

// errorHandler answers when upstream could not be reached (or the answer
// broke before its header): a 502 in the vendor's shape; the gateway
// never retries.
func (c *call) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		c.status = 499 // the client went away
		return
	}
	c.status = http.StatusBadGateway
	writeError(w, c.fam, http.StatusBadGateway, fmt.Sprintf("Atrium model gateway: provider %s unreachable: %v", c.p.Name, err))
}

// meteredBody feeds what passes to a meter.
type meteredBody struct {
	io.ReadCloser
	m *meter
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.m.write(p[:n])
	}
	return n, err
}

// settle records the call once its answer has been sent: usage, budgets,
// metrics and the audit entry.
func (c *call) settle() {
	if c.settled {
		return
	}
	c.settled = true
	g := c.g
	var u usage
	if c.meter != nil {
		u = c.meter.finish()
	}
	model := c.model
	if model == "" {
		model = u.model
	}
	data := u.data(c.who.turn, model, c.p.price(model))
	if c.meter != nil && (data.InputTokens > 0 || data.OutputTokens > 0) {
		g.spend(context.Background(), c.who.session, c.who.tenant, g.now(), data)
		g.metrics.usage(c.p.Name, model, data)
		if g.cfg.OnUsage != nil {
			g.cfg.OnUsage(c.who.session, c.who.turn, c.who.user, data)
		}
	}
	status := c.status
	if status == 0 {
		status = 499
	}
	g.metrics.requests.WithLabelValues(c.p.Name, metricModel(model), strconv.Itoa(status)).Inc()
	if g.cfg.Audit != nil {
		g.cfg.Audit(AuditEntry{Time: c.start, Session: c.who.session, Tenant: c.who.tenant, User: c.who.user,
			Turn: c.who.turn, Provider: c.p.Name, Model: model, Path: c.path, Status: status, Usage: data,
			Duration: g.now().Sub(c.start)})
	}
}

// price is the price of model's tokens.
func (p *provider) price(model string) Price {
	if pr, ok := p.Prices[model]; ok {
		return pr
	}
	return p.Prices["*"]
}

// metricModel bounds the model label's length.
func metricModel(m string) string {
	if len(m) > 64 {
		return m[:64]
	}
	return m
}
