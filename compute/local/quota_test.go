package local

import (
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/session"
)

// Issue 20 finding 4 (the /tmp part): a sandbox's /tmp has a size, and a
// write past it fails with ENOSPC inside the sandbox.
func TestSandbox_TmpSize(t *testing.T) {
	p := newTestProvider(t, Config{TmpBytes: 8 << 20})
	sb := computetest.Open(t, p, compute.Spec{Session: session.NewID()})
	r := computetest.Sh(t, sb, "df -k /tmp | tail -1; head -c 4194304 /dev/zero > /tmp/a && echo small-ok; head -c 16777216 /dev/zero > /tmp/b; echo exit=$?")
	if !strings.Contains(r.Stdout, "small-ok") || !strings.Contains(r.Stdout, "exit=1") ||
		!strings.Contains(r.Stderr, "No space left on device") {
		t.Fatalf("stdout %q stderr %q: want the 4 MiB write to succeed and the 16 MiB one to fail with ENOSPC", r.Stdout, r.Stderr)
	}
	if f := strings.Fields(r.Stdout); len(f) < 2 || f[1] != "8192" {
		t.Errorf("df shows /tmp as %q, want 8192 KiB", r.Stdout)
	}
}
