package actor

import (
	"slices"

	proto "github.com/asynkron/protoactor-go/actor"
)

// registryBuckets is how many concurrent maps (of 32 shards each) hold the
// node's actor processes.
const registryBuckets = 4

// compactRegistry replaces protoactor's process registry buckets, 1,024
// concurrent maps of 32 shards each, with registryBuckets of them, keeping
// the processes already registered. A Go map keeps the memory of the most
// entries it ever held, so every one of those 32,768 small maps that a
// session actor was ever registered in kept a slot group (about 300 bytes)
// after the actor stopped: a hibernated session's share of the node's
// memory grew by that much for each of the first 32,768 sessions ever
// active. With a few maps, what they keep is bounded by the most actors
// active at once. Call it before any actor but the system's own is spawned.
func compactRegistry(sys *proto.ActorSystem) {
	old := sys.ProcessRegistry.LocalPIDs
	procs := map[string]any{}
	for _, b := range old.LocalPIDs {
		for id, p := range b.Items() {
			procs[id] = p
		}
	}
	// The first buckets serve again, emptied (an entry's bucket depends on
	// how many there are); the others and their 32 shards each become
	// garbage.
	small := &proto.SliceMap{LocalPIDs: slices.Clone(old.LocalPIDs[:registryBuckets])}
	for _, b := range small.LocalPIDs {
		for id := range b.Items() {
			b.Remove(id)
		}
	}
	for id, p := range procs {
		small.GetBucket(id).Set(id, p)
	}
	sys.ProcessRegistry.LocalPIDs = small
}
