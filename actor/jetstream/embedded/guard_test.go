package embedded

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
)

type discard struct{}

func (discard) Noticef(string, ...any) {}
func (discard) Warnf(string, ...any)   {}
func (discard) Fatalf(string, ...any)  {}
func (discard) Errorf(string, ...any)  {}
func (discard) Debugf(string, ...any)  {}
func (discard) Tracef(string, ...any)  {}

// TestGuard_FullStoreRecovers: on a 32 MiB tmpfs, a stream whose writes
// fail for lack of space stops answering publishes; the guard says the
// store is full (naming its directory), and once space is freed restarts
// JetStream, after which the same stream stores again and keeps what it
// had.
func TestGuard_FullStoreRecovers(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("SKIPPED, NOT PASSED: mount a tmpfs (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	ns, err := server.NewServer(&server.Options{DontListen: true, JetStream: true, StoreDir: filepath.Join(dir, "nats"), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	g := &Guard{Server: ns, Interval: 50 * time.Millisecond, MinFree: 4 << 20}
	ns.SetLoggerV2(g.Wrap(discard{}), false, false, false)
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("not ready")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { g.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := njs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), njs.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: njs.FileStorage}); err != nil {
		t.Fatal(err)
	}
	publish := func(i int) error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := js.Publish(ctx, "s.x", []byte(strings.Repeat("x", 1000)+string(rune('a'+i%26))))
		return err
	}
	if err := publish(0); err != nil {
		t.Fatal(err)
	}
	if err := g.Err(); err != nil {
		t.Fatalf("Err before the disk filled: %v", err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	// Publish until the store's write fails and the guard trips.
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; g.Err() == nil; i++ {
		if time.Now().After(deadline) {
			t.Fatal("the guard did not trip on a full store")
		}
		_ = publish(i)
	}
	if err := g.Err(); !errors.Is(err, ajs.ErrStoreFull) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Err on a full store: %v, want ErrStoreFull naming %s", err, dir)
	}
	if err := publish(99); err == nil && g.Restarts() == 0 {
		t.Fatal("a publish on the full store was acknowledged")
	}
	info, err := js.Stream(t.Context(), "S")
	if err != nil {
		t.Fatal(err)
	}
	before := info.CachedInfo().State.Msgs
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for g.Err() != nil || publish(100) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after space came back: Err %v, restarts %d", g.Err(), g.Restarts())
		}
		time.Sleep(50 * time.Millisecond) // the guard ticks every 50ms
	}
	if g.Restarts() == 0 {
		t.Error("recovered without a JetStream restart")
	}
	st, err := js.Stream(t.Context(), "S")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n < 2 || n < before {
		t.Errorf("after recovery the stream holds %d messages, had %d before the restart", n, before)
	}
}
