package actor

import (
	"context"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/local"
)

// newProvider returns a real bubblewrap sandbox provider under a temporary
// directory; Cleanup closes it.
func newProvider(t testing.TB) Provider {
	return newLocal(t, 0)
}

func newLocal(t testing.TB, memory int64) *local.Provider {
	t.Helper()
	p, err := local.New(local.Config{Dir: t.TempDir(), Bwrap: "/usr/bin/bwrap", MemoryBytes: memory, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("local compute: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close local compute: %v", err)
		}
	})
	return p
}
