package actor

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/session"
)

// Issue 20 finding 4: a turn that fills the sandbox's workspace quota gets
// ENOSPC inside, and the session says so outside with an error event.
func TestHost_WorkspaceQuotaFull(t *testing.T) {
	p, err := local.New(local.Config{Dir: t.TempDir(), Bwrap: "/usr/bin/bwrap", WorkspaceBytes: 16 << 20, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("local compute: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	e := newEnv(t, func(c *Config) { c.Provider = p })
	id := e.create("alice", command("bash", "-c", `read -r _; head -c 33554432 /dev/zero > big 2>/dev/null || echo enospc`))
	w := e.watch(id)
	e.prompt(id, "alice", "fill it")
	var errs []string
	w.until("the full workspace's error", func(ev session.Event) bool {
		if ev.Kind == session.KindError {
			var d session.ErrorData
			_ = json.Unmarshal(ev.Data, &d)
			errs = append(errs, d.Message)
			return strings.Contains(d.Message, "workspace is full") && strings.Contains(d.Message, "16777216 bytes")
		}
		return false
	})
	w.until("turn_finished", finished(1))
	if got := outputText(t, w.evs, 1, "stdout"); got != "enospc\n" {
		t.Errorf("stdout %q, want the write refused in the sandbox", got)
	}
}
