// Package modelgw is the node's model gateway (DESIGN §6 "Model access"):
// agents in sandboxes reach their language models only through it, and the
// vendors' API keys never enter a sandbox.
//
// A sandbox gets base URLs pointing at the gateway (Endpoints) and, as its
// "API key", a token the gateway issued for its session (Issue). The token
// is accepted only while the session has a turn running (Activate, then
// Deactivate when the turn ends), in whichever header the agent sends its
// key (x-api-key, Authorization: Bearer, x-goog-api-key, or Gemini's ?key=).
// The gateway routes by path prefix to the configured provider of that API
// family (/anthropic/…, /openai/v1/…, /gemini/…), swaps the token for the
// provider's real key, forwards, and streams the answer back unbuffered,
// reading the token usage from it as it passes (the gateway's count is the
// truth: agents report usage inconsistently). Usage goes to OnUsage with
// its cost from the configured prices, to Prometheus counters by provider
// and model, and to an audit entry per call — never prompts or completions.
// Budgets per session and per tenant (tokens or cost per hour, day or
// month) refuse requests once spent, in the vendor's own rate-limit error
// shape, and call OnOverBudget so the node ends the turn itself.
//
// Errors the gateway makes are in the error shape of the API the request
// came to, so agents show them as they would the vendor's own. The gateway
// never retries: upstream errors pass through as they are.
package modelgw

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// Kind is a provider's API.
type Kind string

// The provider kinds.
const (
	KindAnthropic        Kind = "anthropic"         // Anthropic Messages API
	KindOpenAI           Kind = "openai"            // OpenAI (Chat Completions, Responses)
	KindGemini           Kind = "gemini"            // Google Gemini API
	KindOpenAICompatible Kind = "openai_compatible" // any OpenAI-compatible endpoint
)

// Kinds lists the provider kinds, for messages.
var Kinds = []Kind{KindAnthropic, KindOpenAI, KindGemini, KindOpenAICompatible}

// Default base URLs of the vendors' APIs.
const (
	DefaultAnthropicURL = "https://api.anthropic.com"
	DefaultOpenAIURL    = "https://api.openai.com/v1"
	DefaultGeminiURL    = "https://generativelanguage.googleapis.com"
)

// DefaultMaxBody is the largest request body the gateway forwards.
const DefaultMaxBody = 32 << 20

// family is the API family a provider serves, and the path prefix the
// gateway serves it under.
type family string

const (
	famAnthropic family = "anthropic"
	famOpenAI    family = "openai"
	famGemini    family = "gemini"
)

func (k Kind) family() family {
	switch k {
	case KindAnthropic:
		return famAnthropic
	case KindGemini:
		return famGemini
	default:
		return famOpenAI
	}
}

// prefix is the path prefix under which the gateway serves a family; the
// rest of the path is appended to the provider's base URL.
func (f family) prefix() string {
	if f == famOpenAI {
		return "/openai/v1"
	}
	return "/" + string(f)
}

// Provider is an upstream model API.
type Provider struct {
	// Name identifies the provider in metrics, audit entries and messages.
	Name string
	Kind Kind
	// BaseURL is the API's base URL: for anthropic and gemini without a
	// version ("https://api.anthropic.com"), for openai and
	// openai_compatible ending in the version ("https://api.openai.com/v1").
	// Empty means the vendor's default (required for openai_compatible).
	BaseURL string
	// APIKey is the real key, resolved by the caller. It is sent upstream
	// only, in the vendor's header, and never logged.
	APIKey string
	// Models, when set, are the only models this provider serves; requests
	// for others go to another provider of the same family, or are refused.
	Models []string
	// Prices by model id ("*" for any other model).
	Prices map[string]Price
}

// Price is what a model's tokens cost, in US dollars per million tokens.
type Price struct {
	Input  float64 `json:"input" yaml:"input"`
	Output float64 `json:"output" yaml:"output"`
	// Cached is the price of cached input tokens; 0 prices them as Input.
	Cached float64 `json:"cached" yaml:"cached"`
}

// Scope is what a budget counts.
type Scope string

// The budget scopes.
const (
	ScopeSession Scope = "session" // each session separately
	ScopeTenant  Scope = "tenant"  // all sessions of a tenant together
)

// Period is a budget's window, aligned to the UTC calendar.
type Period string

// The budget periods.
const (
	PeriodHour  Period = "hour"
	PeriodDay   Period = "day"
	PeriodMonth Period = "month"
)

// Budget limits the model spend of each session or tenant per period.
type Budget struct {
	Scope Scope
	// Tenant, for a tenant budget, limits only that tenant; "" gives each
	// tenant this budget.
	Tenant string
	Period Period
	// Tokens limits input plus output tokens; 0 means no token limit.
	Tokens int64
	// CostUSD limits the cost; 0 means no cost limit.
	CostUSD float64
}

// String names the budget in messages: "session budget of 100000 tokens
// per day".
func (b Budget) String() string {
	who := string(b.Scope)
	if b.Scope == ScopeTenant && b.Tenant != "" {
		who = "tenant " + b.Tenant
	}
	var limits []string
	if b.Tokens > 0 {
		limits = append(limits, fmt.Sprintf("%d tokens", b.Tokens))
	}
	if b.CostUSD > 0 {
		limits = append(limits, fmt.Sprintf("$%.2f", b.CostUSD))
	}
	return fmt.Sprintf("%s budget of %s per %s", who, strings.Join(limits, " and "), b.Period)
}

// AuditEntry is one model call, for the audit log. It never holds prompts
// or completions.
type AuditEntry struct {
	Time     time.Time
	Session  session.ID
	Tenant   string
	User     string
	Turn     int64
	Provider string
	Model    string
	Path     string
	Status   int
	Usage    session.UsageData
	Duration time.Duration
}

// Config configures a Gateway.
type Config struct {
	Providers []Provider
	Budgets   []Budget
	// Ledger keeps the budgets' spend; default in this gateway's memory
	// (each node counts its own calls, and a restart starts afresh).
	Ledger Ledger
	// MaxBody is the largest request body forwarded; default DefaultMaxBody.
	MaxBody int64
	// Transport sends requests upstream; default a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	Logger    *slog.Logger
	// Registerer receives the gateway's metrics; nil counts into
	// collectors nobody scrapes.
	Registerer prometheus.Registerer
	// OnUsage is called after each model call whose answer reported usage.
	OnUsage func(id session.ID, turn int64, user string, u session.UsageData)
	// OnOverBudget is called when a turn's request is refused for a
	// budget, once per activation of a token: the node ends the turn.
	OnOverBudget func(id session.ID, turn int64, reason string)
	// OnRefused is called when a turn's request names a model or an API
	// family this node has no provider for, once per activation of a
	// token: the agent gets the vendor's 404, and the session is told why
	// (an agent may only say "model not found").
	OnRefused func(id session.ID, turn int64, message string)
	// Audit is called once per forwarded call, when it ends.
	Audit func(AuditEntry)
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Gateway is the model gateway: an http.Handler to serve on the socket that
// sandboxes reach at compute.ModelAddr.
type Gateway struct {
	cfg       Config
	log       *slog.Logger
	providers []*provider
	transport http.RoundTripper
	metrics   *metrics
	now       func() time.Time
	ledger    Ledger
	errorLog  *log.Logger // the reverse proxy's, into log at debug level

	mu     sync.Mutex
	tokens map[string]*grant // guarded by mu
}

// provider is a validated Provider.
type provider struct {
	Provider
	fam  family
	base *url.URL
}

// New validates cfg and returns a gateway.
func New(cfg Config) (*Gateway, error) {
	g := &Gateway{cfg: cfg, log: cfg.Logger, transport: cfg.Transport, now: cfg.Now, ledger: cfg.Ledger,
		tokens: map[string]*grant{}}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.transport == nil {
		g.transport = http.DefaultTransport.(*http.Transport).Clone()
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.ledger == nil {
		g.ledger = newMemLedger(g.now)
	}
	g.errorLog = slog.NewLogLogger(g.log.Handler(), slog.LevelDebug)
	if g.cfg.MaxBody <= 0 {
		g.cfg.MaxBody = DefaultMaxBody
	}
	var errs []error
	names := map[string]bool{}
	for i, p := range cfg.Providers {
		pv, err := validProvider(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("provider %d (%q): %w", i+1, p.Name, err))
			continue
		}
		if names[p.Name] {
			errs = append(errs, fmt.Errorf("provider %d: the name %q is used twice", i+1, p.Name))
		}
		names[p.Name] = true
		g.providers = append(g.providers, pv)
	}
	for i, b := range cfg.Budgets {
		if err := ValidateBudget(b); err != nil {
			errs = append(errs, fmt.Errorf("budget %d: %w", i+1, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("model gateway: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("model gateway: register metrics: %w", err)
	}
	g.metrics = m
	return g, nil
}

// ValidateProvider checks a provider's configuration (the key aside, which
// the caller resolves).
func ValidateProvider(p Provider) error {
	_, err := validProvider(p)
	return err
}

func validProvider(p Provider) (*provider, error) {
	if p.Name == "" {
		return nil, errors.New("name is required")
	}
	if !slices.Contains(Kinds, p.Kind) {
		return nil, fmt.Errorf("unknown kind %q (one of %s)", p.Kind, joinKinds())
	}
	base := p.BaseURL
	if base == "" {
		switch p.Kind {
		case KindAnthropic:
			base = DefaultAnthropicURL
		case KindOpenAI:
			base = DefaultOpenAIURL
		case KindGemini:
			base = DefaultGeminiURL
		default:
			return nil, errors.New("base_url is required for kind openai_compatible")
		}
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("base_url %q is not an http(s) URL such as https://api.example.com/v1", base)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	for name, pr := range p.Prices {
		if pr.Input < 0 || pr.Output < 0 || pr.Cached < 0 {
			return nil, fmt.Errorf("price of %q is negative", name)
		}
	}
	return &provider{Provider: p, fam: p.Kind.family(), base: u}, nil
}

func joinKinds() string {
	s := make([]string, len(Kinds))
	for i, k := range Kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// ValidateBudget checks a budget.
func ValidateBudget(b Budget) error {
	switch b.Scope {
	case ScopeSession, ScopeTenant:
	default:
		return fmt.Errorf("unknown scope %q (session or tenant)", b.Scope)
	}
	if b.Scope == ScopeSession && b.Tenant != "" {
		return errors.New("tenant is set on a session budget (use scope tenant)")
	}
	switch b.Period {
	case PeriodHour, PeriodDay, PeriodMonth:
	default:
		return fmt.Errorf("unknown period %q (hour, day or month)", b.Period)
	}
	if b.Tokens < 0 || b.CostUSD < 0 {
		return errors.New("a limit is negative")
	}
	if b.Tokens == 0 && b.CostUSD == 0 {
		return errors.New("neither tokens nor cost_usd is set")
	}
	return nil
}

// Endpoints are the base URLs of the configured API families as seen
// inside a sandbox (http://127.0.0.1:4180/anthropic, …); Token is left
// empty for the caller to fill with Issue's token.
func (g *Gateway) Endpoints() compute.ModelEndpoints {
	var e compute.ModelEndpoints
	base := "http://" + compute.ModelAddr
	for _, p := range g.providers {
		switch p.fam {
		case famAnthropic:
			e.Anthropic = base + famAnthropic.prefix()
		case famOpenAI:
			e.OpenAI = base + famOpenAI.prefix()
		case famGemini:
			e.Gemini = base + famGemini.prefix()
		}
	}
	return e
}

// describe lists the configured providers for error messages.
func (g *Gateway) describe() string {
	if len(g.providers) == 0 {
		return "none"
	}
	var s []string
	for _, p := range g.providers {
		d := p.Name + " (" + string(p.Kind)
		if len(p.Models) > 0 {
			d += ": " + strings.Join(p.Models, ", ")
		}
		s = append(s, d+")")
	}
	return strings.Join(s, "; ")
}
