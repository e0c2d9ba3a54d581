package modelgw

import (
	"bytes"
	"encoding/json"

	"github.com/atriumhq/atrium/session"
)

// maxMeteredLine bounds what a meter holds of one SSE line or JSON answer;
// usage in anything longer is lost (and the answer passes through intact).
const maxMeteredLine = 16 << 20

// meter reads the token usage from an answer as it streams past: SSE
// answers line by line (only data lines that mention usage are parsed),
// other answers as one JSON document (or Gemini's JSON array).
type meter struct {
	fam     family
	sse     bool
	partial []byte // SSE: the line so far; JSON: the body so far
	over    bool   // partial overflowed
	u       usage
}

// usage is what the meter found, in the vendor's terms.
type usage struct {
	model string
	// input counts all input tokens, cached included; cached is the
	// part read from a cache.
	input, output, cached int64
	// Anthropic reports input, cache reads and cache writes apart.
	aInput, aCacheRead, aCacheWrite int64
	seen                            bool
}

func newMeter(fam family, sse bool) *meter { return &meter{fam: fam, sse: sse} }

// write takes the next bytes of the answer.
func (m *meter) write(p []byte) {
	if !m.sse {
		m.keep(p)
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			m.keep(p)
			return
		}
		line := p[:i]
		if len(m.partial) > 0 || m.over {
			m.keep(line)
			line = m.partial
		}
		if !m.over {
			m.line(line)
		}
		m.partial, m.over = m.partial[:0], false
		p = p[i+1:]
	}
}

func (m *meter) keep(p []byte) {
	if m.over {
		return
	}
	if len(m.partial)+len(p) > maxMeteredLine {
		m.over, m.partial = true, m.partial[:0]
		return
	}
	m.partial = append(m.partial, p...)
}

// line handles one SSE line.
func (m *meter) line(l []byte) {
	l = bytes.TrimSuffix(l, []byte("\r"))
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage`)) {
		return
	}
	m.doc(bytes.TrimSpace(data))
}

// finish returns the usage found.
func (m *meter) finish() usage {
	if !m.sse && !m.over && len(m.partial) > 0 {
		body := bytes.TrimSpace(m.partial)
		if len(body) > 0 && body[0] == '[' {
			var docs []json.RawMessage
			if json.Unmarshal(body, &docs) == nil {
				for _, d := range docs {
					m.doc(d)
				}
			}
		} else {
			m.doc(body)
		}
	} else if m.sse && len(m.partial) > 0 && !m.over {
		m.line(m.partial)
	}
	m.partial = nil
	return m.u
}

// probe is every place the vendors put usage, in one shape.
type probe struct {
	Type          string       `json:"type"`
	Model         string       `json:"model"`
	ModelVersion  string       `json:"modelVersion"`
	Usage         *rawUsage    `json:"usage"`
	Message       *container   `json:"message"`  // Anthropic message_start
	Response      *container   `json:"response"` // OpenAI Responses events
	UsageMetadata *geminiUsage `json:"usageMetadata"`
}

type container struct {
	Model string    `json:"model"`
	Usage *rawUsage `json:"usage"`
}

type rawUsage struct {
	// Anthropic, OpenAI Responses.
	InputTokens  *int64 `json:"input_tokens"`
	OutputTokens *int64 `json:"output_tokens"`
	// Anthropic.
	CacheRead  *int64 `json:"cache_read_input_tokens"`
	CacheWrite *int64 `json:"cache_creation_input_tokens"`
	// OpenAI Responses.
	InputDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	// OpenAI Chat Completions.
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	PromptDetails    *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type geminiUsage struct {
	PromptTokenCount        int64 `json:"promptTokenCount"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount"`
}

// doc takes one JSON document of the answer.
func (m *meter) doc(b []byte) {
	var p probe
	if json.Unmarshal(b, &p) != nil {
		return
	}
	u := &m.u
	switch {
	case p.UsageMetadata != nil:
		// Gemini: each chunk carries the usage so far.
		g := p.UsageMetadata
		u.input, u.output, u.cached, u.seen = g.PromptTokenCount, g.CandidatesTokenCount+g.ThoughtsTokenCount, g.CachedContentTokenCount, true
		if p.ModelVersion != "" {
			u.model = p.ModelVersion
		}
		return
	case p.Message != nil && p.Message.Usage != nil:
		m.take(p.Message.Model, p.Message.Usage)
	case p.Response != nil && p.Response.Usage != nil:
		m.take(p.Response.Model, p.Response.Usage)
	case p.Usage != nil:
		m.take(p.Model, p.Usage)
	}
}

// take merges one usage object. Anthropic's counts are cumulative, and
// its message_delta may carry only output_tokens: each field present
// replaces the one before.
func (m *meter) take(model string, r *rawUsage) {
	u := &m.u
	u.seen = true
	if model != "" {
		u.model = model
	}
	if m.fam == famAnthropic {
		set(&u.aInput, r.InputTokens)
		set(&u.output, r.OutputTokens)
		set(&u.aCacheRead, r.CacheRead)
		set(&u.aCacheWrite, r.CacheWrite)
		u.input = u.aInput + u.aCacheRead + u.aCacheWrite
		u.cached = u.aCacheRead
		return
	}
	if r.PromptTokens != nil || r.CompletionTokens != nil {
		set(&u.input, r.PromptTokens)
		set(&u.output, r.CompletionTokens)
		if r.PromptDetails != nil {
			u.cached = r.PromptDetails.CachedTokens
		}
		return
	}
	set(&u.input, r.InputTokens)
	set(&u.output, r.OutputTokens)
	if r.InputDetails != nil {
		u.cached = r.InputDetails.CachedTokens
	}
}

func set(dst *int64, v *int64) {
	if v != nil {
		*dst = *v
	}
}

// data is the usage as a session event's data, costed at pr.
func (u usage) data(turn int64, model string, pr Price) session.UsageData {
	cachedPrice := pr.Cached
	if cachedPrice == 0 {
		cachedPrice = pr.Input
	}
	cost := (float64(u.input-u.cached)*pr.Input + float64(u.cached)*cachedPrice + float64(u.output)*pr.Output) / 1e6
	return session.UsageData{Turn: turn, Model: model, InputTokens: u.input, OutputTokens: u.output,
		CachedTokens: u.cached, CostUSD: cost}
}
