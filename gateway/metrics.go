package gateway

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus metrics.
type metrics struct {
	conns        *prometheus.GaugeVec   // open watchers by transport (ws, sse)
	sessions     prometheus.Gauge       // sessions with local watchers (NATS subscriptions)
	fanout       prometheus.Counter     // event frames queued to watchers
	slow         prometheus.Counter     // connections closed as slow consumers
	gapRefetches prometheus.Counter     // history fetches that filled a gap in live events
	requests     *prometheus.CounterVec // HTTP requests by route and status code

	// requestCounters caches requests' counters, which are looked up for
	// every request: routeCode → prometheus.Counter.
	requestCounters sync.Map
}

type routeCode struct {
	route string
	code  int
}

// request returns the counter of requests to route answered with code.
func (m *metrics) request(route string, code int) prometheus.Counter {
	key := routeCode{route, code}
	if c, ok := m.requestCounters.Load(key); ok {
		return c.(prometheus.Counter)
	}
	c := m.requests.WithLabelValues(route, strconv.Itoa(code))
	m.requestCounters.Store(key, c)
	return c
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "atrium_gateway_watchers",
			Help: "Open watcher connections by transport (ws, sse).",
		}, []string{"transport"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "atrium_gateway_watched_sessions",
			Help: "Sessions that have watchers on this gateway, each with one NATS subscription.",
		}),
		fanout: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_gateway_events_fanned_out_total",
			Help: "Live event frames queued to watchers.",
		}),
		slow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_gateway_slow_consumer_disconnects_total",
			Help: "Connections closed because their send queue was full.",
		}),
		gapRefetches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_gateway_gap_refetches_total",
			Help: "History fetches that filled a gap in a watcher's live events.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_gateway_http_requests_total",
			Help: "HTTP requests by route pattern and status code (WebSockets and SSE count when they end).",
		}, []string{"route", "code"}),
	}
	for _, c := range []prometheus.Collector{m.conns, m.sessions, m.fanout, m.slow, m.gapRefetches, m.requests} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
