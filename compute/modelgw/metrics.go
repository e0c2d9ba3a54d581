package modelgw

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atriumhq/atrium/session"
)

// metrics are the gateway's Prometheus metrics.
type metrics struct {
	requests *prometheus.CounterVec
	tokens   *prometheus.CounterVec
	cost     *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_model_requests_total",
			Help: "Model calls forwarded by the model gateway, by provider, model and HTTP status.",
		}, []string{"provider", "model", "status"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_model_tokens_total",
			Help: "Tokens used through the model gateway, by provider, model and type (input, output, cached; input includes cached).",
		}, []string{"provider", "model", "type"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_model_cost_usd_total",
			Help: "Cost of model calls through the model gateway in US dollars, from the configured prices.",
		}, []string{"provider", "model"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_model_refused_total",
			Help: "Model requests the gateway refused, by reason (unauthenticated, too_large, unknown_model, over_budget).",
		}, []string{"reason"}),
	}
	for _, r := range []string{"unauthenticated", "too_large", "unknown_model", "over_budget"} {
		m.refused.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.requests, m.tokens, m.cost, m.refused} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

func (m *metrics) usage(provider, model string, u session.UsageData) {
	model = metricModel(model)
	m.tokens.WithLabelValues(provider, model, "input").Add(float64(u.InputTokens))
	m.tokens.WithLabelValues(provider, model, "output").Add(float64(u.OutputTokens))
	m.tokens.WithLabelValues(provider, model, "cached").Add(float64(u.CachedTokens))
	m.cost.WithLabelValues(provider, model).Add(u.CostUSD)
}
