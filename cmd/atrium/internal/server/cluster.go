package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/session"
)

// ClusterTimeout bounds the reads of one ClusterStatus.
const ClusterTimeout = 10 * time.Second

// Key prefixes in the owners bucket: a session's ownership record and a
// node's lease (session.LeaseKey, session.NodeLeaseKey).
const (
	leaseKeyPrefix     = "lease."
	nodeLeaseKeyPrefix = "node."
)

// ClusterStatus is what `atrium cluster status` and GET /v1/cluster show:
// the processes heartbeating, the sessions their nodes own, and NATS's
// health as seen from the process that answered.
type ClusterStatus struct {
	Time  time.Time    `json:"time"`
	Nodes []NodeStatus `json:"nodes"`
	// Orphaned are ownership records whose node has no heartbeat or whose
	// node lease no longer names their incarnation: the node died or was
	// cut off, and the session is taken over by the next node to get a
	// command for it (within the lease TTL of the node's last renewal).
	Orphaned []LeaseStatus `json:"orphaned_leases"`
	NATS     NATSStatus    `json:"nats"`
	// Errors lists what could not be read; the rest is still shown.
	Errors []string `json:"errors,omitempty"`
}

// NodeStatus is one process: its heartbeat and its leases.
type NodeStatus struct {
	NodeInfo
	// HeartbeatAge is how long ago the heartbeat was written, in seconds.
	HeartbeatAge float64 `json:"heartbeat_age_seconds"`
	// Leases are the sessions the node owns.
	Leases []LeaseStatus `json:"leases"`
}

// LeaseStatus is one session's ownership lease.
type LeaseStatus struct {
	Session  string    `json:"session"`
	Node     string    `json:"node"`
	Acquired time.Time `json:"acquired"`
	// Age is the time since the session was acquired and Renewed the time
	// since its node's lease, which holds it, was last renewed, in seconds
	// (-1 for an orphaned record: no live node lease holds it).
	Age     float64 `json:"age_seconds"`
	Renewed float64 `json:"renewed_seconds_ago"`
	// Fence is the lease's current revision.
	Fence uint64 `json:"fence"`
}

// NATSStatus is NATS's health from this process's connection.
type NATSStatus struct {
	Connected bool   `json:"connected"`
	Server    string `json:"server"`
	URL       string `json:"url"`
	Cluster   string `json:"cluster,omitempty"`
	// RTT is the round trip to the server, in milliseconds.
	RTT float64 `json:"rtt_ms"`
	// Servers are the servers the connection knows of.
	Servers   []string         `json:"servers"`
	JetStream *JetStreamStatus `json:"jetstream,omitempty"`
	// Streams are Atrium's streams and buckets.
	Streams []StreamStatus `json:"streams"`
}

// JetStreamStatus is the JetStream account's usage and limits (a limit of
// -1 is unlimited).
type JetStreamStatus struct {
	Domain       string `json:"domain,omitempty"`
	Memory       uint64 `json:"memory_bytes"`
	Storage      uint64 `json:"storage_bytes"`
	Streams      int    `json:"streams"`
	Consumers    int    `json:"consumers"`
	MaxMemory    int64  `json:"max_memory_bytes"`
	MaxStorage   int64  `json:"max_storage_bytes"`
	MaxStreams   int    `json:"max_streams"`
	MaxConsumers int    `json:"max_consumers"`
	APIErrors    uint64 `json:"api_errors"`
}

// StreamStatus is the replica health of one stream (a KV bucket is the
// stream KV_<bucket>).
type StreamStatus struct {
	Name     string `json:"name"`
	Replicas int    `json:"replicas"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	Leader   string `json:"leader,omitempty"`
	// Peers are the replicas other than the leader.
	Peers []PeerStatus `json:"peers,omitempty"`
	// Healthy means a leader and every replica current and online.
	Healthy bool `json:"healthy"`
}

// PeerStatus is one follower replica of a stream.
type PeerStatus struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	Offline bool   `json:"offline,omitempty"`
	Lag     uint64 `json:"lag,omitempty"`
}

// clusterStatusAny serves gateway.Config.ClusterStatus.
func (s *Server) clusterStatusAny(ctx context.Context) (any, error) {
	st, err := s.ClusterStatus(ctx)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// TenantClusterStatus is what a tenant admin who is not an operator sees of
// GET /v1/cluster: the leases of the tenant's own sessions and the ids of
// the nodes holding them. Other tenants' sessions, the nodes' addresses and
// versions, and NATS's state are an operator's.
type TenantClusterStatus struct {
	Time     time.Time          `json:"time"`
	Tenant   string             `json:"tenant"`
	Nodes    []TenantNodeStatus `json:"nodes"`
	Orphaned []LeaseStatus      `json:"orphaned_leases"`
}

// TenantNodeStatus is one node as a tenant admin sees it.
type TenantNodeStatus struct {
	ID     string        `json:"id"`
	State  string        `json:"state"`
	Leases []LeaseStatus `json:"leases"`
}

// tenantClusterStatus serves gateway.Config.TenantClusterStatus: the
// cluster's state cut down to the leases of tenant's sessions, as the
// session catalog says whose they are.
func (s *Server) tenantClusterStatus(ctx context.Context, tenant string) (any, error) {
	st, err := s.ClusterStatus(ctx)
	if err != nil {
		return nil, err
	}
	out := TenantClusterStatus{Time: st.Time, Tenant: tenant, Nodes: []TenantNodeStatus{}, Orphaned: []LeaseStatus{}}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, ClusterTimeout)
	defer cancel()
	catalog, err := js.KeyValue(ctx, session.Subjects{}.CatalogBucket())
	if err != nil {
		return nil, session.Errorf(session.CodeUnavailable, "read the session catalog: %v", err)
	}
	mine := map[string]bool{}
	owned := func(id string) bool {
		if v, ok := mine[id]; ok {
			return v
		}
		var e session.CatalogEntry
		kv, err := catalog.Get(ctx, id)
		v := err == nil && json.Unmarshal(kv.Value(), &e) == nil && e.Tenant == tenant
		mine[id] = v
		return v
	}
	keep := func(ls []LeaseStatus) []LeaseStatus {
		out := []LeaseStatus{}
		for _, l := range ls {
			if owned(l.Session) {
				out = append(out, l)
			}
		}
		return out
	}
	for _, n := range st.Nodes {
		if ls := keep(n.Leases); len(ls) > 0 {
			out.Nodes = append(out.Nodes, TenantNodeStatus{ID: n.ID, State: n.State, Leases: ls})
		}
	}
	out.Orphaned = keep(st.Orphaned)
	return out, nil
}

// ClusterStatus reads the cluster's state from NATS: heartbeats, leases,
// and stream health. A part that cannot be read is named in Errors; an
// error is returned only when NATS is not connected at all.
func (s *Server) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, ClusterTimeout)
	defer cancel()
	now := time.Now().UTC()
	st := ClusterStatus{Time: now, Nodes: []NodeStatus{}, Orphaned: []LeaseStatus{}}
	if !s.nc.IsConnected() {
		return st, session.Errorf(session.CodeUnavailable, "not connected to NATS (status %s): retry, or ask another gateway", s.nc.Status())
	}
	fail := func(what string, err error) { st.Errors = append(st.Errors, fmt.Sprintf("%s: %v", what, err)) }
	js, err := jetstream.New(s.nc)
	if err != nil {
		return st, fmt.Errorf("jetstream: %w", err)
	}
	subj := session.Subjects{}

	nodes := map[string]int{} // id -> index in st.Nodes
	err = watchAll(ctx, js, NodesBucket(subj), "", func(e jetstream.KeyValueEntry) {
		var ni NodeInfo
		if err := json.Unmarshal(e.Value(), &ni); err != nil {
			fail("node "+e.Key(), fmt.Errorf("undecodable heartbeat: %w", err))
			return
		}
		nodes[ni.ID] = len(st.Nodes)
		st.Nodes = append(st.Nodes, NodeStatus{NodeInfo: ni, HeartbeatAge: now.Sub(e.Created()).Seconds(), Leases: []LeaseStatus{}})
	})
	if err != nil {
		fail("nodes", err)
	}
	// Node leases: a session's record is held while its node's lease names
	// the record's incarnation (actor/lease.go).
	type nodeLease struct {
		inc     string
		renewed float64
	}
	nodeLeases := map[string]nodeLease{}
	err = watchAll(ctx, js, subj.OwnersBucket(), nodeLeaseKeyPrefix+">", func(e jetstream.KeyValueEntry) {
		var l session.Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			fail("node lease "+e.Key(), fmt.Errorf("undecodable lease: %w", err))
			return
		}
		nodeLeases[l.Node] = nodeLease{inc: l.Inc, renewed: now.Sub(e.Created()).Seconds()}
	})
	if err != nil {
		fail("node leases", err)
	}
	err = watchAll(ctx, js, subj.OwnersBucket(), leaseKeyPrefix+">", func(e jetstream.KeyValueEntry) {
		var l session.Lease
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			fail("lease "+e.Key(), fmt.Errorf("undecodable lease: %w", err))
			return
		}
		ls := LeaseStatus{
			Session: strings.TrimPrefix(e.Key(), leaseKeyPrefix), Node: l.Node, Acquired: l.Acquired.Time,
			Age: now.Sub(l.Acquired.Time).Seconds(), Renewed: -1, Fence: e.Revision(),
		}
		nl, live := nodeLeases[l.Node]
		live = live && l.Inc != "" && nl.inc == l.Inc
		if live {
			ls.Renewed = nl.renewed
		}
		if i, ok := nodes[l.Node]; ok && live {
			st.Nodes[i].Leases = append(st.Nodes[i].Leases, ls)
		} else {
			st.Orphaned = append(st.Orphaned, ls)
		}
	})
	if err != nil {
		fail("leases", err)
	}
	slices.SortFunc(st.Nodes, func(a, b NodeStatus) int { return strings.Compare(a.ID, b.ID) })
	for _, n := range st.Nodes {
		sortLeases(n.Leases)
	}
	sortLeases(st.Orphaned)

	st.NATS = s.natsStatus(ctx, js, subj, fail)
	return st, nil
}

func sortLeases(ls []LeaseStatus) {
	slices.SortFunc(ls, func(a, b LeaseStatus) int { return strings.Compare(a.Session, b.Session) })
}

// watchAll calls f with every current entry of bucket (keys matching filter,
// or all), skipping deleted ones. A missing bucket has no entries.
func watchAll(ctx context.Context, js jetstream.JetStream, bucket, filter string, f func(jetstream.KeyValueEntry)) error {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	var w jetstream.KeyWatcher
	if filter == "" {
		w, err = kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	} else {
		w, err = kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	}
	if err != nil {
		return fmt.Errorf("read bucket %s: %w", bucket, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("read bucket %s: %w", bucket, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok || e == nil { // nil marks the end of the current entries.
				return nil
			}
			f(e)
		}
	}
}

// natsStatus reads the connection's state, the JetStream account and the
// health of Atrium's streams.
func (s *Server) natsStatus(ctx context.Context, js jetstream.JetStream, subj session.Subjects, fail func(string, error)) NATSStatus {
	ns := NATSStatus{
		Connected: s.nc.IsConnected(),
		Server:    s.nc.ConnectedServerName(),
		URL:       s.nc.ConnectedUrlRedacted(),
		Cluster:   s.nc.ConnectedClusterName(),
		Servers:   redactedServers(s.nc),
		Streams:   []StreamStatus{},
	}
	if rtt, err := s.nc.RTT(); err == nil {
		ns.RTT = float64(rtt.Microseconds()) / 1000
	} else {
		fail("nats rtt", err)
	}
	if ai, err := js.AccountInfo(ctx); err == nil {
		ns.JetStream = &JetStreamStatus{
			Domain: ai.Domain, Memory: ai.Memory, Storage: ai.Store, Streams: ai.Streams, Consumers: ai.Consumers,
			MaxMemory: ai.Limits.MaxMemory, MaxStorage: ai.Limits.MaxStore, MaxStreams: ai.Limits.MaxStreams,
			MaxConsumers: ai.Limits.MaxConsumers, APIErrors: ai.API.Errors,
		}
	} else {
		fail("jetstream account", err)
	}
	prefix := cmp.Or(subj.Prefix, session.DefaultPrefix)
	ours := func(name string) bool {
		return strings.HasPrefix(name, "KV_"+prefix+"_") || strings.HasPrefix(name, strings.ToUpper(prefix)+"_")
	}
	l := js.ListStreams(ctx)
	for si := range l.Info() {
		if ours(si.Config.Name) {
			ns.Streams = append(ns.Streams, streamStatus(si))
		}
	}
	if err := l.Err(); err != nil {
		fail("streams", err)
	}
	slices.SortFunc(ns.Streams, func(a, b StreamStatus) int { return strings.Compare(a.Name, b.Name) })
	return ns
}

func streamStatus(si *jetstream.StreamInfo) StreamStatus {
	st := StreamStatus{Name: si.Config.Name, Replicas: max(1, si.Config.Replicas), Messages: si.State.Msgs, Bytes: si.State.Bytes}
	c := si.Cluster
	if c == nil {
		st.Healthy = st.Replicas == 1
		return st
	}
	st.Leader = c.Leader
	st.Healthy = c.Leader != "" && len(c.Replicas)+1 >= st.Replicas
	for _, p := range c.Replicas {
		if p == nil {
			continue
		}
		st.Peers = append(st.Peers, PeerStatus{Name: p.Name, Current: p.Current, Offline: p.Offline, Lag: p.Lag})
		st.Healthy = st.Healthy && p.Current && !p.Offline
	}
	return st
}

// redactedServers lists the servers nc knows, without credentials.
func redactedServers(nc *nats.Conn) []string {
	out := []string{}
	for _, u := range nc.Servers() {
		if i := strings.Index(u, "@"); i >= 0 {
			if j := strings.Index(u, "://"); j >= 0 && j < i {
				u = u[:j+3] + u[i+1:]
			}
		}
		out = append(out, u)
	}
	return out
}
