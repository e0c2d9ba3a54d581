package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// TestServer_NodeLoss: a node is stopped and replaced by one on another
// machine (same history files and object store, no sandboxes directory);
// the session's /workspace comes back on its next turn, from the object
// store: a local directory in the data dir, or S3.
func TestServer_NodeLoss(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		storage func(t *testing.T) server.Storage
	}{
		{"dir store", func(*testing.T) server.Storage { return server.Storage{} }},
		{"s3 store", func(t *testing.T) server.Storage {
			s3 := blobtest.StartS3(t)
			return server.Storage{Type: server.StorageS3, S3: s3.Config("atrium/")}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			data := t.TempDir()
			storage := tc.storage(t)
			mod := func(c *server.Config) {
				c.DataDir = data
				c.Storage = storage
			}
			s := startStack(t, mod)
			alice := s.as("alice")
			sess := alice.create("moving", nil)
			alice.prompt(sess.ID, "mkdir -p src && echo 'package main' > src/main.go && printf 'notes\\n' > notes.txt && chmod 0600 notes.txt && echo done")
			if fin := alice.waitTurn(sess.ID, 1); fin.Status != session.TurnOK {
				t.Fatalf("turn 1 %+v", fin)
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			if err := s.srv.Close(ctx); err != nil {
				t.Fatalf("stop the first node: %v", err)
			}
			// Another machine: nothing of the sandboxes survives.
			if err := os.RemoveAll(filepath.Join(data, "sandboxes")); err != nil {
				t.Fatal(err)
			}

			s = startStack(t, mod)
			alice = s.as("alice")
			last := alice.page(sess.ID, 0, 0).LastSeq
			alice.prompt(sess.ID, "cat src/main.go notes.txt && stat -c %a notes.txt")
			if fin := alice.waitTurn(sess.ID, 2); fin.Status != session.TurnOK {
				t.Fatalf("turn 2 on the new node %+v", fin)
			}
			evs := alice.events(sess.ID, 0)
			if out := outputOf(evs, 2, "stdout"); out != "package main\nnotes\n600\n" {
				t.Errorf("the workspace on the new node: %q", out)
			}
			var states []string
			for _, ev := range evs {
				if ev.Seq > last && ev.Kind == session.KindSandbox {
					var d session.SandboxData
					ev.decode(t, &d)
					states = append(states, string(d.State))
				}
			}
			if got := strings.Join(states, ","); got != "provisioning,restoring,ready" {
				t.Errorf("sandbox events on the new node: %s", got)
			}
		})
	}
}
