package actor

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
)

// metrics are the node's Prometheus metrics. They always exist (a Host
// without Config.Registerer counts into collectors nobody scrapes), so call
// sites need no nil checks.
type metrics struct {
	active        prometheus.Gauge
	activations   prometheus.Counter
	hibernations  prometheus.Counter
	appended      prometheus.Counter
	turns         *prometheus.CounterVec
	turnDuration  prometheus.Histogram
	saveBytes     prometheus.Histogram
	saveDuration  *prometheus.HistogramVec
	restoreBytes  prometheus.Histogram
	restoreDur    *prometheus.HistogramVec
	sandboxesOpen prometheus.GaugeFunc
	leaseLost     prometheus.Counter
}

// workspaceBuckets span a few KiB to a few GiB.
var workspaceBuckets = prometheus.ExponentialBuckets(4<<10, 4, 12)

func newMetrics(h *Host, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "atrium_node_sessions_active",
			Help: "Sessions active (an actor with an open history) on this node.",
		}),
		activations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_node_activations_total",
			Help: "Sessions activated (history opened, actor serving) on this node.",
		}),
		hibernations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_node_hibernations_total",
			Help: "Sessions that hibernated (history closed) on this node, including at shutdown.",
		}),
		appended: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_node_events_appended_total",
			Help: "Events committed durably to session histories.",
		}),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "atrium_node_turns_total",
			Help: "Turns finished, by status (ok, failed, cancelled, timeout).",
		}, []string{"status"}),
		turnDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "atrium_node_turn_duration_seconds",
			Help:    "Duration of finished turns, from start to exit.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}),
		saveBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "atrium_node_workspace_save_bytes",
			Help:    "Bytes uploaded to the object store by successful workspace saves.",
			Buckets: workspaceBuckets,
		}),
		saveDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "atrium_node_workspace_save_duration_seconds",
			Help:    "Duration of workspace saves, by result (ok, error).",
			Buckets: prometheus.ExponentialBuckets(0.005, 3, 10),
		}, []string{"result"}),
		restoreBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "atrium_node_workspace_restore_bytes",
			Help:    "Bytes downloaded from the object store by successful workspace restores.",
			Buckets: workspaceBuckets,
		}),
		restoreDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "atrium_node_workspace_restore_duration_seconds",
			Help:    "Duration of workspace restores, by result (ok, error).",
			Buckets: prometheus.ExponentialBuckets(0.005, 3, 10),
		}, []string{"result"}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "atrium_node_leases_lost_total",
			Help: "Sessions this node stopped because it lost their ownership lease (cut off from NATS, or fenced).",
		}),
	}
	m.sandboxesOpen = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "atrium_node_sandboxes_awake",
		Help: "Sandboxes open and awake on this node (asleep and stopped ones are not counted).",
	}, h.boxes.awakeCount)
	for _, s := range []session.TurnStatus{session.TurnOK, session.TurnFailed, session.TurnCancelled, session.TurnTimeout} {
		m.turns.WithLabelValues(string(s)) // Present at zero, so rate() sees the first one.
	}
	for _, r := range []string{"ok", "error"} {
		m.saveDuration.WithLabelValues(r)
		m.restoreDur.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.active, m.activations, m.hibernations, m.appended, m.turns, m.turnDuration,
		m.saveBytes, m.saveDuration, m.restoreBytes, m.restoreDur, m.sandboxesOpen, m.leaseLost} {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}

// turnFinished counts a finished turn; d is zero for a turn that never ran.
func (m *metrics) turnFinished(status session.TurnStatus, d time.Duration) {
	m.turns.WithLabelValues(string(status)).Inc()
	if d > 0 {
		m.turnDuration.Observe(d.Seconds())
	}
}

// saved records a workspace save.
func (m *metrics) saved(st mount.Stats, d time.Duration, err error) {
	if err != nil {
		m.saveDuration.WithLabelValues("error").Observe(d.Seconds())
		return
	}
	m.saveDuration.WithLabelValues("ok").Observe(d.Seconds())
	m.saveBytes.Observe(float64(st.BytesWritten))
}

// restored records a workspace restore.
func (m *metrics) restored(st mount.Stats, d time.Duration, err error) {
	if err != nil {
		m.restoreDur.WithLabelValues("error").Observe(d.Seconds())
		return
	}
	m.restoreDur.WithLabelValues("ok").Observe(d.Seconds())
	m.restoreBytes.Observe(float64(st.BytesRead))
}

// awakeCount counts the boxes whose sandbox is open and awake.
func (r *sandboxes) awakeCount() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, b := range r.boxes {
		if b.awake {
			n++
		}
	}
	return float64(n)
}

// activated counts a session that became active.
func (m *metrics) activated() {
	m.activations.Inc()
	m.active.Inc()
}

// hibernated counts a session that hibernates; metered says whether it was
// counted as active, and is cleared.
func (m *metrics) hibernated(metered *bool) {
	if *metered {
		m.hibernations.Inc()
	}
	m.deactivated(metered)
}

// deactivated takes a session out of the active gauge if it was in it.
func (m *metrics) deactivated(metered *bool) {
	if *metered {
		*metered = false
		m.active.Dec()
	}
}
