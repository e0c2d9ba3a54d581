package gateway

import (
	"cmp"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atriumhq/atrium/session"
)

// metrics are the gateway's Prometheus metrics.
type metrics struct {
	conns        *prometheus.GaugeVec     // open watchers by transport (ws, sse)
	sessions     prometheus.Gauge         // sessions with local watchers (NATS subscriptions)
	fanout       prometheus.Counter       // event frames queued to watchers
	slow         prometheus.Counter       // connections closed as slow consumers
	gapRefetches prometheus.Counter       // history fetches that filled a gap in live events
	requests     *prometheus.CounterVec   // HTTP requests by route and status code
	natsLatency  *prometheus.HistogramVec // gateway → node request round trips by kind and result
	authFailures *prometheus.CounterVec   // failed authentications by reason class
	limited      prometheus.Counter       // HTTP responses 429 Too Many Requests
	fanoutLag    prometheus.Histogram     // live event: arrival from NATS → written to a WebSocket
	affinity     *prometheus.CounterVec   // activations by placement affinity result (hit, miss, unknown)
	failovers    *prometheus.CounterVec   // commands whose node's lease ended in flight, by result (retried, unavailable)
	// placeRefusals counts activations a node refused unavailable, by
	// result (retried, lasting: answered at once; owner.go).
	placeRefusals *prometheus.CounterVec
	nodeWatch     prometheus.Gauge // 1 while the node lease watcher runs (nodes.go)

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

func newMetrics(s *Server, reg prometheus.Registerer) (*metrics, error) {
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
		natsLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "atrium_gateway_nats_request_duration_seconds",
			Help:    "Round trips of gateway → node requests over NATS, by kind (place, cmd) and result (ok, error).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 11),
		}, []string{"kind", "result"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_gateway_auth_failures_total",
			Help: "Failed authentications by reason class: invalid (bad or expired credentials), throttled (429), error (identity provider or token store failing).",
		}, []string{"reason"}),
		limited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_gateway_rate_limited_total",
			Help: "HTTP responses 429 Too Many Requests.",
		}),
		fanoutLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "atrium_gateway_fanout_lag_seconds",
			Help:    "Time from a live event's arrival at the gateway from NATS to its write on a WebSocket.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 3, 11),
		}),
		affinity: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_gateway_place_affinity_total",
			Help: "Session activations by placement affinity: hit (the node that last held the session answered), miss (that node is gone: the queue group was asked), unknown (the catalog names no node: the queue group was asked).",
		}, []string{"result"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_gateway_node_failovers_total",
			Help: "Commands in flight to a node whose lease ended (it died or stopped) before it answered, by result: retried (safe to repeat: sent again at once), unavailable (perhaps applied: the client was told to check the history).",
		}, []string{"result"}),
		placeRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_gateway_place_refusals_total",
			Help: "Session activations a node refused as unavailable, by result: retried (a transient condition: another node holds the lease, the node is stopping), lasting (a condition the node knows lasts, such as a full JetStream store: the client was answered at once with Retry-After).",
		}, []string{"result"}),
		nodeWatch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "atrium_gateway_node_lease_watch_up",
			Help: "1 while the gateway watches the nodes' leases; at 0, commands in flight to a node that dies wait for the request timeout.",
		}),
	}
	for _, tr := range []string{"ws", "sse"} {
		m.conns.WithLabelValues(tr)
	}
	for _, k := range []string{"place", "cmd"} {
		for _, r := range []string{"ok", "error"} {
			m.natsLatency.WithLabelValues(k, r)
		}
	}
	for _, r := range []string{authInvalid, authThrottled, authError} {
		m.authFailures.WithLabelValues(r)
	}
	for _, r := range []string{affinityHit, affinityMiss, affinityUnknown} {
		m.affinity.WithLabelValues(r)
	}
	for _, r := range []string{failoverRetried, failoverUnavailable} {
		m.failovers.WithLabelValues(r)
	}
	for _, r := range []string{placeRefusalRetried, placeRefusalLasting} {
		m.placeRefusals.WithLabelValues(r)
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.conns, m.sessions, m.fanout, m.slow, m.gapRefetches, m.requests,
		m.natsLatency, m.authFailures, m.limited, m.fanoutLag, m.affinity, m.failovers, m.placeRefusals, m.nodeWatch, catalogCollector{c: &s.cache}} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// Reason classes of atrium_gateway_auth_failures_total.
const (
	authInvalid   = "invalid"
	authThrottled = "throttled"
	authError     = "error"
)

// Results of atrium_gateway_place_affinity_total.
const (
	affinityHit     = "hit"
	affinityMiss    = "miss"
	affinityUnknown = "unknown"
)

// Results of atrium_gateway_node_failovers_total.
const (
	failoverRetried     = "retried"
	failoverUnavailable = "unavailable"
)

// Results of atrium_gateway_place_refusals_total.
const (
	placeRefusalRetried = "retried"
	placeRefusalLasting = "lasting"
)

// authFailed counts a failed authentication.
func (m *metrics) authFailed(err error) {
	switch session.AsError(err).Code {
	case session.CodeTooManyRequests:
		m.authFailures.WithLabelValues(authThrottled).Inc()
	case session.CodeUnauthenticated:
		m.authFailures.WithLabelValues(authInvalid).Inc()
	default:
		m.authFailures.WithLabelValues(authError).Inc()
	}
}

// natsRequest records the round trip of a request to subj that started at
// start.
func (s *Server) natsRequest(subj string, start time.Time, err error) {
	kind, result := "cmd", "ok"
	if subj == s.subj.Place() || strings.HasPrefix(subj, s.subj.Place()+".") { // Place or a node's PlaceOn
		kind = "place"
	}
	if err != nil {
		result = "error"
	}
	s.metrics.natsLatency.WithLabelValues(kind, result).Observe(time.Since(start).Seconds())
}

// catalogCollector reports the gateway's copy of the session catalog:
// sessions by state and sandboxes by state, cluster-wide (every gateway
// reports the same numbers; aggregate with max, not sum).
type catalogCollector struct{ c *catalogCache }

var (
	catalogSessionsDesc = prometheus.NewDesc("atrium_sessions",
		"Sessions in the catalog by state (active, hibernated), as this gateway's copy sees it.", []string{"state"}, nil)
	catalogSandboxesDesc = prometheus.NewDesc("atrium_sandboxes",
		"Sessions' sandboxes in the catalog by state (none, ready, sleeping, failed, …), as this gateway's copy sees it.", []string{"state"}, nil)
)

// Describe implements prometheus.Collector.
func (cc catalogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- catalogSessionsDesc
	ch <- catalogSandboxesDesc
}

// Collect implements prometheus.Collector. Nothing is reported until the
// copy holds the whole catalog.
func (cc catalogCollector) Collect(ch chan<- prometheus.Metric) {
	sessions := map[session.State]int{session.StateActive: 0, session.StateHibernated: 0}
	boxes := map[session.SandboxState]int{}
	for _, st := range []session.SandboxState{session.SandboxNone, session.SandboxProvisioning, session.SandboxRestoring,
		session.SandboxReady, session.SandboxSaving, session.SandboxSleeping, session.SandboxStopped, session.SandboxFailed} {
		boxes[st] = 0 // Present at zero, so dashboards and alerts see every state.
	}
	cc.c.mu.RLock()
	ready := cc.c.ready
	for _, it := range cc.c.entries {
		if it.entry == nil {
			continue
		}
		sessions[it.entry.State]++
		boxes[cmp.Or(it.entry.Sandbox, session.SandboxNone)]++
	}
	cc.c.mu.RUnlock()
	if !ready {
		return
	}
	for st, n := range sessions {
		ch <- prometheus.MustNewConstMetric(catalogSessionsDesc, prometheus.GaugeValue, float64(n), string(st))
	}
	for st, n := range boxes {
		ch <- prometheus.MustNewConstMetric(catalogSandboxesDesc, prometheus.GaugeValue, float64(n), string(st))
	}
}
