// Package embedded keeps the JetStream of an in-process nats-server (the
// `atrium dev` and single-node default) serving through a full disk.
//
// nats-server 2.15 reacts to a write that fails for lack of space by putting
// the stream in a permanent write-error state: it logs "Critical write error
// … no space left on device" once, then drops every later publish to the
// stream without a reply, also after space is freed, until JetStream is
// restarted. Seen on a 64 MiB data dir filled by a turn's output (issue 21):
// every capture and every lease renewal timed out and the session wedged.
// A Guard reads the server's log lines, says the store is full (Err) so the
// node can answer at once with that reason, and once the file system has
// room again restarts JetStream in the process, which reloads every stream
// from disk without the error.
package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	ajs "github.com/atriumhq/atrium/actor/jetstream"
)

// Defaults of Guard.
const (
	// DefaultMinFree is how much space the store's file system must have
	// free before JetStream is restarted.
	DefaultMinFree = 16 << 20
	// DefaultInterval is how often a tripped guard looks at the free space.
	DefaultInterval = time.Second
)

// Guard watches one embedded server's JetStream store. Set its fields,
// install Wrap's logger on the server and run Run; the zero MinFree and
// Interval take the defaults.
type Guard struct {
	Server   *server.Server
	Logger   *slog.Logger
	MinFree  int64
	Interval time.Duration

	mu   sync.Mutex
	full string // guarded by mu: the server's line that tripped the guard; "" when not tripped
	// restarts counts JetStream restarts; guarded by mu.
	restarts int
	// storeDir is the server's JetStream store directory, read when Run
	// starts; guarded by mu.
	storeDir string
	// restarted is when the last restart ended; guarded by mu.
	restarted time.Time
}

// restartQuiet is how long after a restart the guard ignores out-of-space
// lines: the stopped streams' flushers may still report the old failure,
// and restarting again for it would only make JetStream unavailable for a
// moment.
const restartQuiet = 2 * time.Second

// Wrap returns l with the server's errors and warnings also read by the
// guard.
func (g *Guard) Wrap(l server.Logger) server.Logger { return guardLogger{Logger: l, g: g} }

type guardLogger struct {
	server.Logger
	g *Guard
}

func (l guardLogger) Errorf(format string, v ...any) {
	l.g.Observe(fmt.Sprintf(format, v...))
	l.Logger.Errorf(format, v...)
}

func (l guardLogger) Warnf(format string, v ...any) {
	l.g.Observe(fmt.Sprintf(format, v...))
	l.Logger.Warnf(format, v...)
}

// outOfSpace reports whether a server log line says a write failed for lack
// of space.
func outOfSpace(line string) bool {
	l := strings.ToLower(line)
	return strings.Contains(l, "no space left on device") || strings.Contains(l, "out of resources") ||
		strings.Contains(l, "disk quota exceeded")
}

// Observe reads one log line of the server; a line that says a write failed
// for lack of space trips the guard.
func (g *Guard) Observe(line string) {
	if !outOfSpace(line) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.full == "" && time.Since(g.restarted) >= restartQuiet {
		g.full = line
	}
}

// Err returns nil, or while the store is out of space an error wrapping
// ajs.ErrStoreFull that names the store's directory.
func (g *Guard) Err() error {
	g.mu.Lock()
	full := g.full
	g.mu.Unlock()
	if full == "" {
		return nil
	}
	return fmt.Errorf("%w: the file system of %s has no room (free space and JetStream resumes by itself)", ajs.ErrStoreFull, g.dir())
}

// Restarts returns how many times the guard restarted JetStream.
func (g *Guard) Restarts() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.restarts
}

// dir is the store's directory.
func (g *Guard) dir() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.storeDir != "" {
		return g.storeDir
	}
	return "the JetStream store"
}

// Run checks, every Interval while the guard is tripped, the free space of
// the store's file system; once MinFree is free it restarts JetStream and
// clears the trip. It returns when ctx ends.
func (g *Guard) Run(ctx context.Context) {
	log := g.Logger
	if log == nil {
		log = slog.Default()
	}
	minFree, every := g.MinFree, g.Interval
	if minFree <= 0 {
		minFree = DefaultMinFree
	}
	if every <= 0 {
		every = DefaultInterval
	}
	cfg := g.Server.JetStreamConfig()
	if cfg == nil {
		log.Warn("the JetStream store guard has nothing to watch: JetStream is not enabled")
		return
	}
	g.mu.Lock()
	g.storeDir = cfg.StoreDir
	g.mu.Unlock()
	// JetStreamConfig's StoreDir ends in the "jetstream" folder that
	// EnableJetStream adds itself.
	cfg.StoreDir = filepath.Dir(cfg.StoreDir)
	t := time.NewTicker(every)
	defer t.Stop()
	said := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if g.Err() == nil {
			said = false
			continue
		}
		if !said {
			log.Error("the JetStream store is out of space: sessions cannot store events until space is freed", "dir", g.dir())
			said = true
		}
		free, err := freeBytes(g.dir())
		if err != nil {
			log.Warn("read the free space of the JetStream store", "dir", g.dir(), "err", err)
			continue
		}
		if free < minFree {
			continue
		}
		if err := g.restart(cfg); err != nil {
			log.Error("restart JetStream after the store's disk had room again", "err", err)
			continue
		}
		log.Info("JetStream restarted: its store has room again", "dir", g.dir(), "free_bytes", free)
	}
}

// restart stops JetStream, keeping its state on disk, and starts it again
// on the same store; the trip is cleared first, so a write that fails again
// trips it again.
func (g *Guard) restart(cfg *server.JetStreamConfig) error {
	c := *cfg
	g.mu.Lock()
	g.full = ""
	g.restarts++
	g.mu.Unlock()
	err := g.Server.ShutdownJetStream()
	if err != nil {
		err = fmt.Errorf("stop JetStream: %w", err)
	} else if err = g.Server.EnableJetStream(&c); err != nil {
		err = fmt.Errorf("start JetStream: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		// Still unusable: the next tick tries again.
		if g.full == "" {
			g.full = err.Error()
		}
		return err
	}
	g.restarted = time.Now()
	return nil
}

// freeBytes returns the space an unprivileged writer may still use on the
// file system of dir.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
