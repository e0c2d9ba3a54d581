package server_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestServer_TenantQuota: a turn that writes more than the tenant's
// object-store quota keeps its work in the sandbox, and its save is refused
// with an insufficient_storage error event naming the quota; a turn that
// removes the file saves again (issue 20 finding 4).
func TestServer_TenantQuota(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *server.Config) {
		c.Storage = server.Storage{TenantQuotaBytes: 1 << 20}
	})
	alice := s.as("alice")
	sess := alice.create("quota", nil)
	alice.prompt(sess.ID, "head -c 3000000 /dev/urandom > big.bin && echo wrote")
	alice.waitTurn(sess.ID, 1)
	var refused *session.ErrorData
	for _, ev := range alice.events(sess.ID, 0) {
		if ev.Kind != session.KindError {
			continue
		}
		var d session.ErrorData
		ev.decode(t, &d)
		if d.Code == session.CodeInsufficientStorage {
			refused = &d
		}
	}
	if refused == nil {
		t.Fatalf("no insufficient_storage error event after a turn wrote 3 MB with a 1 MiB quota")
	}
	for _, want := range []string{"object-store quota", "1.0 MiB", "storage.tenant_quota_bytes"} {
		if !strings.Contains(refused.Message, want) {
			t.Errorf("the error %q does not say %q", refused.Message, want)
		}
	}
	alice.prompt(sess.ID, "rm big.bin && echo small > small.txt && ls")
	if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
		t.Fatalf("turn 2: %+v", fin)
	}
	evs := alice.events(sess.ID, 0)
	for _, ev := range evs {
		if ev.Kind == session.KindError && ev.turn() == 2 {
			t.Errorf("turn 2, back under the quota, has an error: %s", ev.Data)
		}
	}
	// The saved workspace is the one turn 2 left.
	_, body := alice.request("GET", "/v1/sessions/"+string(sess.ID)+"/files?path=", nil)
	var listing struct {
		Entries []struct {
			Path string `json:"path"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &listing); err != nil {
		t.Fatalf("listing %s: %v", body, err)
	}
	var paths []string
	for _, e := range listing.Entries {
		paths = append(paths, e.Path)
	}
	if got := strings.Join(paths, ","); got != "small.txt" {
		t.Errorf("the saved workspace holds %q, want small.txt", got)
	}
}
