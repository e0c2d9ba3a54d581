package actor

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMetrics_TurnAndHibernation(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, withHibernate(300*time.Millisecond), func(c *Config) { c.Registerer = reg })
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo hi")
	w.until("turn_finished", finished(1))

	eventually(t, "turn counted", func() bool { return metricValue(t, reg, "atrium_node_turns_total", "status", "ok") == 1 })
	if n := metricValue(t, reg, "atrium_node_activations_total", "", ""); n < 1 {
		t.Errorf("activations = %v, want ≥ 1", n)
	}
	if n := metricValue(t, reg, "atrium_node_events_appended_total", "", ""); n < 5 {
		t.Errorf("events appended = %v, want ≥ 5 (created, message, turn started, output, finished)", n)
	}
	if n := metricValue(t, reg, "atrium_node_turn_duration_seconds", "", ""); n != 1 {
		t.Errorf("turn duration observations = %v, want 1", n)
	}
	if n := metricValue(t, reg, "atrium_node_sandboxes_awake", "", ""); n != 1 {
		t.Errorf("sandboxes awake = %v, want 1", n)
	}
	// Idle, the session hibernates: the gauge comes back to zero.
	eventually(t, "hibernation counted", func() bool {
		return metricValue(t, reg, "atrium_node_hibernations_total", "", "") >= 1 &&
			metricValue(t, reg, "atrium_node_sessions_active", "", "") == 0
	})
}

func TestMetrics_NilRegisterer(t *testing.T) {
	e := newEnv(t) // Config.Registerer nil: metrics are kept but registered nowhere.
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "true")
	w.until("turn_finished", finished(1))
}

// metricValue returns the value of the metric name (a histogram's sample
// count) whose label lname is lvalue (any labels when lname is ""), summed
// over matches; 0 if absent.
func metricValue(t testing.TB, g prometheus.Gatherer, name, lname, lvalue string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if lname != "" && !hasLabel(m, lname, lvalue) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
