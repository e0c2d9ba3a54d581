package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	// A file upload beyond the quota is 507, naming it.
	status, body := alice.request("PUT", "/v1/sessions/"+string(sess.ID)+"/files/upload.bin", strings.Repeat("x", 2<<20))
	if status != 507 || !strings.Contains(string(body), "insufficient_storage") || !strings.Contains(string(body), "storage.tenant_quota_bytes") {
		t.Errorf("an upload beyond the quota: %d %s, want 507 naming the quota", status, body)
	}
	alice.prompt(sess.ID, "rm -f big.bin upload.bin && echo small > small.txt && ls")
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
	_, body = alice.request("GET", "/v1/sessions/"+string(sess.ID)+"/files?path=", nil)
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

// TestServer_StorageGC: the node's garbage collection, with a short
// history and grace: after a turn removes a large file, its object leaves
// the store at a later pass, and the workspace still restores.
func TestServer_StorageGC(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	s := startStack(t, func(c *server.Config) {
		c.DataDir = data
		c.Storage = server.Storage{GCInterval: 500 * time.Millisecond, GCGrace: time.Millisecond, WorkspaceHistory: time.Millisecond}
	})
	alice := s.as("alice")
	sess := alice.create("gc", nil)
	objects := filepath.Join(data, "objects", "sessions", string(sess.ID), "workspace", "objects")
	alice.prompt(sess.ID, "head -c 3000000 /dev/urandom > big.bin && echo keep > small.txt")
	if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
		t.Fatalf("turn 1: %+v", fin)
	}
	big, err := os.ReadDir(objects)
	if err != nil || len(big) != 1 {
		t.Fatalf("after turn 1 the store holds %d large objects (%v), want 1", len(big), err)
	}
	alice.prompt(sess.ID, "rm big.bin && echo removed")
	if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
		t.Fatalf("turn 2: %+v", fin)
	}
	deadline := time.Now().Add(waitLong)
	for {
		if _, err := os.Stat(filepath.Join(objects, big[0].Name())); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removed file's object is still stored %v after the turn", waitLong)
		}
		time.Sleep(100 * time.Millisecond) // Polling interval, not synchronization.
	}
	// The workspace comes back from the store on another machine.
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := s.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(data, "sandboxes")); err != nil {
		t.Fatal(err)
	}
	s = startStack(t, func(c *server.Config) { c.DataDir = data })
	alice = s.as("alice")
	alice.prompt(sess.ID, "cat small.txt; ls")
	if fin := alice.waitTurn(sess.ID, 3); fin.Status != session.TurnOK {
		t.Fatalf("turn 3: %+v", fin)
	}
	if out := outputOf(alice.events(sess.ID, 0), 3, "stdout"); out != "keep\nsmall.txt\n" {
		t.Errorf("the workspace after the collection: %q", out)
	}
}
