package gateway_test

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
)

// BenchmarkFiles measures the workspace routes through the real gateway and
// node (bubblewrap sandbox, directory object store) on a workspace of
// 10,000 files of 10,000 bytes (100 MB) plus one 10 MB file:
//
//	go test -run '^$' -bench BenchmarkFiles -benchtime 20x ./gateway/
//
// Targets (docs/benchmarks.md): read the 10 MB file of a hibernated
// session < 200 ms, list the 10,000 files < 100 ms, fork < 1 s writing
// < 1 MB of objects, the changes of a turn that touched one file < 50 ms.
func BenchmarkFiles(b *testing.B) {
	dir := b.TempDir()
	store := &blob.Dir{Path: dir}
	ns := startNATS(b)
	startFilesNode(b, ns, store, func(c *actor.Config) {
		c.HibernateAfter = 100 * time.Millisecond
		c.SandboxSleepAfter = 100 * time.Millisecond
	})
	e := filesEnv{env: &env{t: b, ns: ns}, store: store}
	e.gw, e.srv, e.reg = startGateway(b, ns)
	s := e.create("alice", "bench")
	turn, out := e.prompt(s.ID, "alice",
		"mkdir d && head -c 75000000 /dev/urandom | base64 -w 99 | head -c 100000000 | split -b 10000 -a 5 -d - d/f && head -c 10000000 /dev/urandom > big.bin && ls d | wc -l")
	if strings.TrimSpace(out) != "10000" {
		b.Fatalf("setup turn %d: %q", turn, out)
	}
	turn, _ = e.prompt(s.ID, "alice", "echo changed >> d/f00042")

	b.Run("ReadHibernated10MB", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			e.waitHibernated(s.ID)
			b.StartTimer()
			code, body := e.get(s.ID, "alice", "big.bin")
			if code != 200 || len(body) != 10000000 {
				b.Fatalf("read: %d, %d bytes", code, len(body))
			}
		}
	})
	b.Run("List10000", func(b *testing.B) {
		for b.Loop() {
			code, body := e.call("GET", "/v1/sessions/"+string(s.ID)+"/files?path=d", "alice", nil)
			var l session.FileListing
			if code != 200 || json.Unmarshal(body, &l) != nil || len(l.Entries) != 10000 {
				b.Fatalf("list: %d, %d entries", code, len(l.Entries))
			}
		}
	})
	b.Run("ChangesOneOf10000", func(b *testing.B) {
		for b.Loop() {
			ch := e.changes(s.ID, "alice", turn)
			if len(ch) != 1 || ch[0].Path != "d/f00042" || !strings.Contains(ch[0].Diff, "+changed") {
				b.Fatalf("changes: %+v", ch)
			}
		}
	})
	b.Run("Fork100MB", func(b *testing.B) {
		var written int64
		for b.Loop() {
			b.StopTimer()
			before := dirBytes(b, dir)
			b.StartTimer()
			code, body := e.call("POST", "/v1/sessions/"+string(s.ID)+"/fork", "alice", nil)
			if code != http.StatusCreated {
				b.Fatalf("fork: %d %s", code, body)
			}
			b.StopTimer()
			written += dirBytes(b, dir) - before
			b.StartTimer()
		}
		b.ReportMetric(float64(written)/float64(b.N), "store-bytes/op")
	})
}

// waitHibernated waits until id's actor has hibernated.
func (e filesEnv) waitHibernated(id session.ID) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		code, body := e.call("GET", "/v1/sessions/"+string(id), "alice", nil)
		var s session.Session
		if code == 200 && json.Unmarshal(body, &s) == nil && s.State == session.StateHibernated &&
			(s.Sandbox.State == session.SandboxSleeping || s.Sandbox.State == "") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("session %s did not hibernate", id)
}

// dirBytes is the size of the files under dir.
func dirBytes(tb testing.TB, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
