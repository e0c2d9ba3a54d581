package server

import (
	"context"
	"log/slog"
	"sync"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/atriumhq/atrium/actor/jetstream/embedded"
)

// storeGuard keeps the embedded NATS server's JetStream serving through a
// full disk (actor/jetstream/embedded): the node's captures fail at once
// with the reason while the store is full (actor.Config.StoreFull = err),
// and JetStream is restarted in the process once there is room again. With
// an external NATS cluster there is none: its operators watch its servers.
type storeGuard struct {
	mu     sync.Mutex
	g      *embedded.Guard    // guarded by mu; nil before watch
	cancel context.CancelFunc // guarded by mu
	wg     sync.WaitGroup
}

// watch guards ns's store, replacing the guard of an earlier server
// (restartNATS in tests). The server's log lines keep going to log
// (natslog.go) through the guard.
func (sg *storeGuard) watch(ns *natsserver.Server, log *slog.Logger) {
	sg.stop()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &embedded.Guard{Server: ns, Logger: log.With("component", "nats")}
	ns.SetLoggerV2(g.Wrap(natsLogger{log.With("component", "nats-server")}), false, false, false)
	ctx, cancel := context.WithCancel(context.Background())
	sg.mu.Lock()
	sg.g, sg.cancel = g, cancel
	sg.mu.Unlock()
	sg.wg.Go(func() { g.Run(ctx) })
}

// err is actor.Config.StoreFull: why the embedded store cannot take writes
// now, nil if nothing says so.
func (sg *storeGuard) err() error {
	sg.mu.Lock()
	g := sg.g
	sg.mu.Unlock()
	if g == nil {
		return nil
	}
	return g.Err()
}

// stop ends the guard's goroutine and waits for it; safe to call twice.
func (sg *storeGuard) stop() {
	sg.mu.Lock()
	cancel := sg.cancel
	sg.cancel = nil
	sg.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	sg.wg.Wait()
}
