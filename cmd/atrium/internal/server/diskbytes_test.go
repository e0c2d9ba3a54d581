package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestServer_SessionDiskBytes: a session's settings.disk_bytes sizes its
// sandbox's workspace within the node's sandbox.workspace_disk_bytes: beyond
// it is forbidden naming the key, below 16 MiB a bad request; the Session
// object shows it back; and in the sandbox a write past the session's 32
// MiB (on a node allowing 64 MiB) fails with ENOSPC, the turn's error
// event naming the full workspace.
func TestServer_SessionDiskBytes(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, as a node runs")
	}
	s := startStack(t, func(c *server.Config) {
		c.Sandbox.WorkspaceDiskBytes = 64 << 20
	})
	alice := s.as("alice")
	sess := alice.create("disk", nil)
	path := "/v1/sessions/" + string(sess.ID)

	status, body := alice.request("PATCH", path, `{"settings":{"disk_bytes":134217728}}`)
	if status != http.StatusForbidden || !strings.Contains(string(body), "disk_bytes 134217728 is beyond this server's limit of 67108864 (sandbox.workspace_disk_bytes)") {
		t.Errorf("disk_bytes beyond the node's: %d %s, want 403 naming sandbox.workspace_disk_bytes", status, body)
	}
	status, body = alice.request("PATCH", path, `{"settings":{"disk_bytes":1048576}}`)
	if status != http.StatusBadRequest || !strings.Contains(string(body), "at least 16777216") {
		t.Errorf("disk_bytes of 1 MiB: %d %s, want 400", status, body)
	}
	var got session.Session
	alice.must(http.StatusOK, "PATCH", path, `{"settings":{"disk_bytes":33554432}}`, &got)
	if got.Settings == nil || got.Settings.DiskBytes != 32<<20 {
		t.Fatalf("settings after PATCH disk_bytes: %+v", got.Settings)
	}
	if g := alice.get(sess.ID); g.Settings == nil || g.Settings.DiskBytes != 32<<20 {
		t.Errorf("GET shows settings %+v, want disk_bytes 33554432", g.Settings)
	}

	// Given at creation, as POST /v1/sessions "settings".
	var made session.Session
	alice.must(http.StatusCreated, "POST", "/v1/sessions", `{"title":"made","settings":{"disk_bytes":33554432}}`, &made)
	if made.Settings == nil || made.Settings.DiskBytes != 32<<20 {
		t.Errorf("created with disk_bytes: settings %+v", made.Settings)
	}
	alice.mustError(http.StatusForbidden, session.CodeForbidden, "POST", "/v1/sessions", `{"title":"big","settings":{"disk_bytes":134217728}}`)

	alice.prompt(sess.ID, "df -k /workspace | tail -1; head -c 50331648 /dev/zero > big; echo exit=$?")
	fin := alice.waitTurn(sess.ID, 1)
	evs := alice.events(sess.ID, 0)
	out, errOut := outputOf(evs, 1, "stdout"), outputOf(evs, 1, "stderr")
	if !strings.Contains(out, "exit=1") || !strings.Contains(errOut, "No space left on device") {
		t.Errorf("a 48 MiB write into the session's 32 MiB: stdout %q stderr %q, want ENOSPC", out, errOut)
	}
	if f := strings.Fields(out); len(f) < 2 || len(f[1]) != 5 || f[1] > "32768" {
		t.Errorf("df in the sandbox shows %q, want the session's 32 MiB, not the node's 64", out)
	}
	said := false
	for _, ev := range evs {
		var d struct {
			Message string `json:"message"`
		}
		if ev.Kind == session.KindError && json.Unmarshal(ev.Data, &d) == nil &&
			strings.Contains(d.Message, "workspace is full") && strings.Contains(d.Message, "quota of 33554432 bytes") {
			said = true
		}
	}
	if !said {
		t.Errorf("no error event says the session's 32 MiB workspace is full (turn %+v)", fin)
	}
}
