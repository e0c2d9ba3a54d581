package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go/jetstream"
)

// Delays before the node lease watcher restarts after it failed: the first,
// doubling up to the last. The last is shorter than the catalog's: until the
// watcher runs, a command in flight to a node that dies waits for the whole
// request timeout.
const (
	nodesRetryMin = 100 * time.Millisecond
	nodesRetryMax = 2 * time.Second
)

// ownersMarkerTTL is how long the owners bucket keeps the marker of a node
// lease that expired. It is the nodes' value (package actor, openOwners): a
// gateway that starts before any node creates the bucket as a node would.
const ownersMarkerTTL = time.Minute

// errNodeGone is the cause of a command's wait ending because the lease of
// the node serving its session ended (the node died, was cut off from NATS
// or stopped): no answer will come.
var errNodeGone = errors.New("gateway: the node serving the session stopped")

// nodeLeases lets requests follow the node that serves their session: a
// watcher of the node leases in the owners bucket (watchNodes) cancels, with
// errNodeGone as the cause, the wait of every request that follows a node
// whose lease ends. A node that is killed never answers the commands it had
// received; without this their callers would wait the request timeout
// although another node serves the session again about a lease TTL later.
//
// The node a request follows is a hint (the catalog's Node, which lags a
// session that moves): a request may follow the wrong node, and then it
// waits the request timeout as it always did, or is cancelled although
// another node is handling it (call treats that as any other failover).
type nodeLeases struct {
	mu      sync.Mutex
	waiters map[string]map[*nodeWaiter]struct{} // guarded by mu: by node ID
	// live holds the nodes whose lease this gateway last saw written,
	// gone those whose lease it last saw end; guarded by mu. A node is in
	// at most one of them.
	live, gone map[string]bool
}

// renewed records that node's lease was taken or renewed.
func (n *nodeLeases) renewed(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.live == nil {
		n.live, n.gone = map[string]bool{}, map[string]bool{}
	}
	n.live[node] = true
	delete(n.gone, node)
}

// isGone reports whether node's lease was last seen ending.
func (n *nodeLeases) isGone(node string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gone[node]
}

// pick returns a node whose lease this gateway last saw written, other
// than not, or "" if it knows none: where to place a session away from a
// node that is gone (the place queue group may still include it: a frozen
// process keeps its subscriptions until NATS's ping timeout).
func (n *nodeLeases) pick(not string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	for node := range n.live { // map order: a random live node
		if node != not {
			return node
		}
	}
	return ""
}

// nodeWaiter is one request following a node.
type nodeWaiter struct{ cancel context.CancelCauseFunc }

// follow returns a context derived from ctx that is cancelled with a cause
// matching errNodeGone if node's lease ends before stop is called. With no
// node ("": the catalog does not know) it only ends with ctx. stop must be
// called when the request is over.
func (n *nodeLeases) follow(ctx context.Context, node string) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if node == "" {
		return ctx, func() { cancel(nil) }
	}
	w := &nodeWaiter{cancel: cancel}
	n.mu.Lock()
	if n.waiters == nil {
		n.waiters = make(map[string]map[*nodeWaiter]struct{})
	}
	ws := n.waiters[node]
	if ws == nil {
		ws = make(map[*nodeWaiter]struct{})
		n.waiters[node] = ws
	}
	ws[w] = struct{}{}
	n.mu.Unlock()
	return ctx, func() {
		n.mu.Lock()
		if ws := n.waiters[node]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(n.waiters, node)
			}
		}
		n.mu.Unlock()
		cancel(nil)
	}
}

// ended cancels every request following node, whose lease ended, and
// reports how many there were.
func (n *nodeLeases) ended(node string) int {
	n.mu.Lock()
	ws := n.waiters[node]
	delete(n.waiters, node)
	if n.gone == nil {
		n.live, n.gone = map[string]bool{}, map[string]bool{}
	}
	delete(n.live, node)
	n.gone[node] = true
	n.mu.Unlock()
	cause := fmt.Errorf("lease of node %s ended: %w", node, errNodeGone)
	for w := range ws {
		w.cancel(cause)
	}
	return len(ws)
}

// watchNodes follows the node leases until the server closes, restarting
// its watcher when it fails. While no watcher runs, requests to a node that
// dies wait for the request timeout.
func (s *Server) watchNodes() {
	s.keepWatching(nodesRetryMin, nodesRetryMax, s.followNodes, func() { s.metrics.nodeWatch.Set(0) },
		"node lease watcher stopped: commands to a node that dies wait for the request timeout until it restarts")
}

// followNodes runs one watcher of the node leases, new changes only, until
// the watcher fails or the server closes. It reports whether the watcher
// started.
func (s *Server) followNodes() (watched bool, err error) {
	kv, err := s.owners(s.ctx)
	if err != nil {
		return false, err
	}
	prefix := session.NodeLeaseKey("")
	w, err := kv.Watch(s.ctx, prefix+"*", jetstream.UpdatesOnly())
	if err != nil {
		return false, fmt.Errorf("watch node leases: %w", err)
	}
	defer func() { _ = w.Stop() }()
	s.metrics.nodeWatch.Set(1)
	for {
		select {
		case <-s.ctx.Done():
			return true, nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return true, errors.New("node lease watcher ended")
			case e == nil:
			case e.Operation() == jetstream.KeyValuePut:
				// A node took or renewed its lease.
				s.nodes.renewed(strings.TrimPrefix(e.Key(), prefix))
			default: // deleted (the node stopped) or purged (the lease expired)
				node := strings.TrimPrefix(e.Key(), prefix)
				if n := s.nodes.ended(node); n > 0 {
					s.log.Info("node lease ended: failing over the commands in flight to it", "node", node, "commands", n)
				}
			}
		}
	}
}

// owners opens the bucket of ownership and node leases, creating it as a
// node would (see ownersMarkerTTL) if no node has yet.
func (s *Server) owners(ctx context.Context) (jetstream.KeyValue, error) {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	bucket := s.subj.OwnersBucket()
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         bucket,
			Description:    "Atrium node leases, session ownership records and fencing tokens",
			Storage:        jetstream.FileStorage,
			Replicas:       s.replicas,
			LimitMarkerTTL: ownersMarkerTTL,
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // a node created it meanwhile
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open owners bucket %s: %w", bucket, err)
	}
	return kv, nil
}
