package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/session"
)

// Heartbeats of the nodes bucket.
const (
	// HeartbeatInterval is how often a process rewrites its entry in the
	// nodes bucket.
	HeartbeatInterval = 5 * time.Second
	// NodeTTL is the nodes bucket's TTL: a process that stopped
	// heartbeating (it died, or is cut off from NATS) disappears from
	// `atrium cluster status` after it.
	NodeTTL = 3 * HeartbeatInterval
)

// States of NodeInfo.State.
const (
	NodeRunning  = "running"
	NodeDraining = "draining" // stopping: finishing turns, handing off sessions
)

// sessionsGauge is the node's gauge of active session actors (actor/metrics.go).
const sessionsGauge = "atrium_node_sessions_active"

// NodeInfo is one process's heartbeat: the value of its key (its node id) in
// the bucket "<prefix>_nodes".
type NodeInfo struct {
	ID      string   `json:"id"`
	Roles   []string `json:"roles"`
	Version string   `json:"version"`
	// State is NodeRunning or NodeDraining.
	State   string    `json:"state"`
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
	// Sessions counts the session actors active on the node (0 for a
	// gateway-only process).
	Sessions int `json:"sessions"`
	// NATSServer and NATSURL are the NATS server the process is connected
	// to (name, and URL without credentials).
	NATSServer string `json:"nats_server"`
	NATSURL    string `json:"nats_url"`
	// Instance tells two processes with the same node id apart.
	Instance string `json:"instance"`
}

// NodesBucket is the KV bucket of heartbeats of subj's prefix.
func NodesBucket(subj session.Subjects) string {
	p := subj.Prefix
	if p == "" {
		p = session.DefaultPrefix
	}
	return p + "_nodes"
}

// heartbeatInstanceFile, in the data dir, holds the instance of the
// process's latest heartbeat.
const heartbeatInstanceFile = "heartbeat.instance"

// heartbeat keeps a process's NodeInfo fresh in the nodes bucket until stop.
type heartbeat struct {
	s        *Server
	kv       jetstream.KeyValue
	log      *slog.Logger
	instance string

	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	state string // guarded by mu
}

// startHeartbeat creates the nodes bucket if needed, writes the process's
// first heartbeat, and keeps it fresh every HeartbeatInterval. A fresh entry
// under the same node id from another instance is warned about: two
// processes with one id confuse leases and status.
func startHeartbeat(ctx context.Context, s *Server) (*heartbeat, error) {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: jetstream: %w", err)
	}
	bucket := NodesBucket(session.Subjects{})
	// Retried like the node's own start-up steps: a reply lost while the
	// NATS cluster forms must not end the process.
	kv, err := actor.RetryStartup(ctx, s.cfg.Logger, "open the nodes bucket", func(ctx context.Context) (jetstream.KeyValue, error) {
		return js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "Atrium processes' heartbeats (atrium cluster status)",
			TTL:         NodeTTL,
			History:     1,
			Replicas:    s.cfg.NATS.Replicas,
		})
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat: open bucket %s: %w", bucket, err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	h := &heartbeat{s: s, kv: kv, log: s.cfg.Logger.With("component", "heartbeat"), instance: hex.EncodeToString(b),
		done: make(chan struct{}), state: NodeRunning}
	// The data dir remembers the instance of the run before, so that its
	// heartbeat, still fresh after a restart (a crash, or a stop whose
	// withdrawal did not reach NATS), is not taken for another process.
	instFile := filepath.Join(s.cfg.DataDir, heartbeatInstanceFile)
	previous, _ := os.ReadFile(instFile)
	if e, err := kv.Get(ctx, s.cfg.NodeID); err == nil {
		var other NodeInfo
		if json.Unmarshal(e.Value(), &other) == nil && other.Instance != h.instance &&
			other.Instance != strings.TrimSpace(string(previous)) && time.Since(e.Created()) < NodeTTL {
			h.log.Warn("another process heartbeats with this node id (or a previous run stopped moments ago): give every process its own node.id",
				"node", s.cfg.NodeID, "other_started", other.Started)
		}
	}
	if err := h.put(ctx); err != nil {
		return nil, err
	}
	if err := os.WriteFile(instFile, []byte(h.instance+"\n"), 0o600); err != nil {
		h.log.Debug("heartbeat instance not remembered", "err", err)
	}
	loop, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.cancel = cancel
	go h.run(loop) // owned: stop waits for done.
	return h, nil
}

func (h *heartbeat) run(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(HeartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := h.put(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			h.log.Warn("heartbeat not written; retrying", "err", err)
		case err == nil && failing:
			h.log.Info("heartbeat written again")
		}
		failing = err != nil
	}
}

// info is the process's heartbeat now.
func (h *heartbeat) info() NodeInfo {
	s := h.s
	h.mu.Lock()
	state := h.state
	h.mu.Unlock()
	return NodeInfo{
		ID:         s.cfg.NodeID,
		Roles:      s.Roles(),
		Version:    s.cfg.Version,
		State:      state,
		Started:    s.started,
		Updated:    time.Now().UTC(),
		Sessions:   int(gaugeValue(s.reg, sessionsGauge)),
		NATSServer: s.nc.ConnectedServerName(),
		NATSURL:    s.nc.ConnectedUrlRedacted(),
		Instance:   h.instance,
	}
}

func (h *heartbeat) put(ctx context.Context) error {
	b, err := json.Marshal(h.info())
	if err != nil {
		return fmt.Errorf("encode heartbeat: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, HeartbeatInterval)
	defer cancel()
	if _, err := h.kv.Put(ctx, h.s.cfg.NodeID, b); err != nil {
		return fmt.Errorf("write heartbeat: %w", err)
	}
	return nil
}

// draining marks the process as draining at once.
func (h *heartbeat) draining(ctx context.Context) {
	h.mu.Lock()
	h.state = NodeDraining
	h.mu.Unlock()
	if err := h.put(ctx); err != nil {
		h.log.Debug("heartbeat not written while draining", "err", err)
	}
}

// stop ends the heartbeats and withdraws the process's entry (if it is
// still ours), so status stops listing it at once. Safe to call twice.
func (h *heartbeat) stop(ctx context.Context) {
	if h.cancel == nil {
		return
	}
	h.cancel()
	<-h.done
	ctx, cancel := context.WithTimeout(ctx, HeartbeatInterval)
	defer cancel()
	e, err := h.kv.Get(ctx, h.s.cfg.NodeID)
	if err != nil {
		return
	}
	var mine NodeInfo
	if json.Unmarshal(e.Value(), &mine) != nil || mine.Instance != h.instance {
		return
	}
	if err := h.kv.Delete(ctx, h.s.cfg.NodeID, jetstream.LastRevision(e.Revision())); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		h.log.Debug("heartbeat not withdrawn; it expires", "err", err)
	}
}

// gaugeValue returns the value of the gauge name in reg (the sum over its
// labels), or 0 when it is not there.
func gaugeValue(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}
