package actor

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
)

// The cluster protocol (DESIGN §4, §5) behind two small interfaces, so the
// session actor's state machine around ownership and capture is tested
// with fakes (cluster_fake_test.go) as well as over JetStream. Host.Start
// wires actor/jetstream's implementations; tests may set Host.ownersFor and
// Host.eventsFor before Start.

// OwnerStore is the compare-and-set register that holds node leases,
// sessions' ownership records and rescue claims. A key's revision grows with
// every write to the register and survives restarts: the revision of the
// write that took a session's record is its activation's fencing token, the
// only one (sandbox handles, workspace manifests and checkpoints carry it).
// Failed compare-and-sets wrap ajs.ErrExists or ajs.ErrRevision.
type OwnerStore interface {
	// Latest returns key's newest record as the store's leader has it (a
	// decision must not rest on a lagging replica); nil if there is none.
	Latest(ctx context.Context, key string) (*ajs.Record, error)
	// Create writes val at a key that holds nothing or a delete marker;
	// ttl > 0 gives the write its own TTL.
	Create(ctx context.Context, key string, val []byte, ttl time.Duration) (uint64, error)
	// Swap writes val at key if rev is still its newest revision.
	Swap(ctx context.Context, key string, val []byte, rev uint64, ttl time.Duration) (uint64, error)
	// Delete writes a delete marker at key if rev is still its newest
	// revision and returns the marker's revision.
	Delete(ctx context.Context, key string, rev uint64) (uint64, error)
	// List returns the newest record of every key matching pattern that
	// is not deleted, read from any replica (it may miss a recent write).
	List(ctx context.Context, pattern string) ([]*ajs.Record, error)
	// Watch delivers later writes to the keys matching pattern until stop.
	Watch(ctx context.Context, pattern string) (updates <-chan *ajs.Record, stop func(), err error)
}

// EventStore is the stream that captures every session's events and
// metadata, from which a node taking a session over replays.
type EventStore interface {
	// Capture stores msgs, retrying with backoff for a bounded time, and
	// returns the highest stream sequence stored; guard runs before every
	// attempt. A first-attempt duplicate fails with ajs.ErrSeqTaken; a
	// store out of space wraps ajs.ErrStoreFull.
	Capture(ctx context.Context, msgs []*nats.Msg, guard func() error) (uint64, error)
	// SameStored returns nil if the stream holds data at seq, ajs.ErrSeqTaken
	// if something else.
	SameStored(ctx context.Context, seq uint64, data []byte) error
	// Last returns the newest message of subject, read from the leader.
	Last(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error)
	// Replay delivers the messages of subjects from stream sequence start
	// until one at or after target.
	Replay(ctx context.Context, subjects []string, start, target uint64, fn func(ajs.Msg) error) error
	// Purge removes every message of subject.
	Purge(ctx context.Context, subject string) error
}

var (
	_ OwnerStore = (*ajs.Owners)(nil)
	_ EventStore = (*ajs.Events)(nil)
)
