package actor

import (
	"fmt"
	"testing"
	"time"

	proto "github.com/asynkron/protoactor-go/actor"
)

// TestCompactRegistry: the registry keeps the system's own processes, has
// registryBuckets buckets, and still finds, and forgets, spawned actors.
func TestCompactRegistry(t *testing.T) {
	sys := proto.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	if _, ok := sys.ProcessRegistry.GetLocal("eventstream"); !ok {
		t.Fatal("no eventstream process before compacting")
	}
	compactRegistry(sys)
	if n := len(sys.ProcessRegistry.LocalPIDs.LocalPIDs); n != registryBuckets {
		t.Fatalf("%d buckets, want %d", n, registryBuckets)
	}
	count := func() int {
		n := 0
		for _, b := range sys.ProcessRegistry.LocalPIDs.LocalPIDs {
			n += b.Count()
		}
		return n
	}
	for _, id := range []string{"eventstream", "deadletter"} {
		if _, ok := sys.ProcessRegistry.GetLocal(id); !ok {
			t.Fatalf("the %s process was lost", id)
		}
	}
	base := count()
	echo := proto.PropsFromFunc(func(c proto.Context) {
		if s, ok := c.Message().(string); ok {
			c.Respond(s)
		}
	})
	var pids []*proto.PID
	for i := range 100 {
		pid, err := sys.Root.SpawnNamed(echo, fmt.Sprintf("echo-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	for i, pid := range pids {
		got, err := sys.Root.RequestFuture(pid, fmt.Sprint(i), 5*time.Second).Result()
		if err != nil || got != fmt.Sprint(i) {
			t.Fatalf("actor %d answered %v, %v", i, got, err)
		}
	}
	for _, pid := range pids {
		if err := sys.Root.StopFuture(pid).Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != base {
		t.Errorf("%d processes registered after the actors stopped, want %d as before them", n, base)
	}
}

// TestClearStaleChildren: once its children stopped, a parent's child set
// holds no PID in its spare capacity (protoactor leaves them there, and a
// PID reaches its process).
func TestClearStaleChildren(t *testing.T) {
	sys := proto.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	type stale struct{}
	const kids = 20
	terminated := 0
	parent := proto.PropsFromFunc(func(c proto.Context) {
		switch c.Message().(type) {
		case *proto.Started:
			for range kids {
				c.Spawn(proto.PropsFromFunc(func(proto.Context) {}))
			}
			for _, k := range c.Children() {
				c.Stop(k)
			}
		case *proto.Terminated:
			terminated++
			clearStaleChildren(c)
		case stale:
			if terminated < kids {
				c.Respond(-1)
				return
			}
			k := c.Children()
			n := 0
			for _, pid := range k[len(k):cap(k)] {
				if pid != nil {
					n++
				}
			}
			c.Respond(n)
		}
	})
	pid := sys.Root.Spawn(parent)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := sys.Root.RequestFuture(pid, stale{}, 5*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got != -1 {
			if got != 0 {
				t.Errorf("%d stopped children's PIDs left in the child set's spare capacity", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("children did not stop")
		}
		time.Sleep(10 * time.Millisecond) // Terminated has no notification outside the parent
	}
}
