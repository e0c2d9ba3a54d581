package actor

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/local"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/compute/sandboxagent"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// withStore saves the workspaces of the env's local sandboxes in store.
func withStore(store blob.Store) envOption {
	return func(c *Config) {
		c.Store = store
		c.WorkspaceOf = func(sb compute.Sandbox) (mount.Workspace, error) {
			ls, ok := sb.(*local.Sandbox)
			if !ok {
				return nil, fmt.Errorf("not a local sandbox: %T", sb)
			}
			d := ls.Workspace()
			d.Blob = store
			return d, nil
		}
	}
}

// dirStore returns an object store in a temporary directory.
func dirStore(t testing.TB) *blob.Dir {
	return &blob.Dir{Path: filepath.Join(t.TempDir(), "objects")}
}

// manifestOf reads the saved manifest of id's workspace.
func manifestOf(t testing.TB, store blob.Store, id session.ID) (mount.Manifest, []byte) {
	t.Helper()
	rc, _, err := store.Get(context.Background(), mount.Prefix(id)+mount.ManifestKey)
	if err != nil {
		t.Fatalf("read manifest of %s: %v", id, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	var m mount.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("manifest %s: %v", b, err)
	}
	return m, b
}

// hasEntry reports whether m lists path.
func hasEntry(m mount.Manifest, path string) bool {
	for _, e := range m.Entries {
		if e.Path == path {
			return true
		}
	}
	return false
}

// sandboxStates returns the states of the sandbox events of evs after seq
// after, in order.
func sandboxStates(t testing.TB, evs []session.Event, after session.Seq) []string {
	var out []string
	for _, ev := range evs {
		if ev.Seq > after && ev.Kind == session.KindSandbox {
			out = append(out, string(data[session.SandboxData](t, ev).State))
		}
	}
	return out
}

// errorsOf returns the messages of the error events of evs after seq after.
func errorsOf(t testing.TB, evs []session.Event, after session.Seq) []string {
	var out []string
	for _, ev := range evs {
		if ev.Seq > after && ev.Kind == session.KindError {
			out = append(out, data[session.ErrorData](t, ev).Message)
		}
	}
	return out
}

// isSandbox matches a sandbox event with state.
func isSandbox(state session.SandboxState) func(session.Event) bool {
	return func(ev session.Event) bool {
		if ev.Kind != session.KindSandbox {
			return false
		}
		var d session.SandboxData
		json.Unmarshal(ev.Data, &d)
		return d.State == state
	}
}

// runTurn prompts and waits for the turn to finish; it returns the turn's
// stdout, its turn_finished data and the seq the prompt got.
func runTurn(t testing.TB, e *env, w *watcher, id session.ID, n int64, prompt string) (string, session.TurnFinishedData, session.Seq) {
	t.Helper()
	seq := e.prompt(id, "alice", prompt)
	fin := w.until(fmt.Sprintf("turn %d finished", n), finished(n))
	return outputText(t, w.evs, n, "stdout"), data[session.TurnFinishedData](t, fin), seq
}

// TestSandbox_SleepWhileHibernated: an idle sandbox's workspace is saved and
// the sandbox put to sleep after SandboxSleepAfter, although its session
// hibernated long before; the next turn wakes it (restoring, ready) with the
// files intact.
func TestSandbox_SleepWhileHibernated(t *testing.T) {
	store := dirStore(t)
	e := newEnv(t, withStore(store), withHibernate(50*time.Millisecond), func(c *Config) {
		c.SandboxSleepAfter = 600 * time.Millisecond
	})
	id := e.create("alice", shell())
	w := e.watch(id)
	out, fin, _ := runTurn(t, e, w, id, 1, "echo kept > notes.txt; mkdir -p src; echo 'package main' > src/main.go; echo one")
	if fin.Status != session.TurnOK || out != "one\n" {
		t.Fatalf("turn 1: %+v %q", fin, out)
	}
	if got := sandboxStates(t, w.evs, 0); strings.Join(got, ",") != "provisioning,restoring,ready" {
		t.Errorf("sandbox events of the first turn: %v", got)
	}
	// Saved at the end of the turn, without a sandbox event.
	if m, _ := manifestOf(t, store, id); !hasEntry(m, "notes.txt") || !hasEntry(m, "src/main.go") {
		t.Errorf("manifest after turn 1: %+v", m.Entries)
	}

	// The session hibernates well before the sandbox's timer fires.
	eventually(t, "catalog says hibernated", func() bool {
		c, _ := e.catalog(id)
		return c.State == session.StateHibernated && c.Sandbox == session.SandboxReady
	})
	sleeping := w.until("sandbox sleeping", isSandbox(session.SandboxSleeping))
	if d := data[session.SandboxData](t, sleeping); !strings.Contains(d.Detail, "no turn for") {
		t.Errorf("sleeping detail = %q", d.Detail)
	}
	if got := sandboxStates(t, w.evs, 0); strings.Join(got, ",") != "provisioning,restoring,ready,saving,sleeping" {
		t.Errorf("sandbox events: %v", got)
	}
	// It hibernates again, its catalog entry saying the sandbox sleeps.
	eventually(t, "hibernated with a sleeping sandbox", func() bool {
		c, _ := e.catalog(id)
		return c.State == session.StateHibernated && c.Sandbox == session.SandboxSleeping
	})

	last := w.evs[len(w.evs)-1].Seq
	out, fin, _ = runTurn(t, e, w, id, 2, "cat notes.txt src/main.go")
	if fin.Status != session.TurnOK || out != "kept\npackage main\n" {
		t.Fatalf("turn 2 after waking: %+v %q", fin, out)
	}
	if got := sandboxStates(t, w.evs, last); strings.Join(got, ",") != "restoring,ready" {
		t.Errorf("sandbox events when waking: %v", got)
	}
	checkContiguous(t, decode(t, e.history(id, "alice")))
}

// TestSandbox_ShutdownSleepsHibernated: closing the host saves and sleeps
// the awake sandbox of a hibernated session, and logs it.
func TestSandbox_ShutdownSleepsHibernated(t *testing.T) {
	store := dirStore(t)
	e := newEnv(t, withStore(store), withHibernate(50*time.Millisecond))
	id := e.create("alice", shell())
	w := e.watch(id)
	runTurn(t, e, w, id, 1, "echo one > a.txt")
	eventually(t, "hibernated", func() bool {
		c, _ := e.catalog(id)
		return c.State == session.StateHibernated
	})
	if err := e.host.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	l, err := e.dir.Open(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raw, _, err := l.Range(t.Context(), 0, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	evs := decode(t, raw)
	checkContiguous(t, evs)
	if got := sandboxStates(t, evs, 0); strings.Join(got, ",") != "provisioning,restoring,ready,saving,sleeping" {
		t.Errorf("sandbox events:%s", summarize(evs))
	}
	if c, _ := e.catalog(id); c.State != session.StateHibernated || c.Sandbox != session.SandboxSleeping {
		t.Errorf("catalog after close: %+v", c)
	}
}

// TestSandbox_Busy: a turn waiting on an approval is activity; the sandbox
// does not sleep under it.
func TestSandbox_Busy(t *testing.T) {
	e := newEnv(t, withStore(dirStore(t)), func(c *Config) { c.SandboxSleepAfter = 100 * time.Millisecond })
	id := e.create("alice", shell())
	w := e.watch(id)
	runTurn(t, e, w, id, 1, "echo one")
	w.until("sandbox sleeping", isSandbox(session.SandboxSleeping))
	e.prompt(id, "alice", `echo '{"type":"approval_request","id":"a1","summary":"go?"}'; read -r answer; echo "$answer"`)
	w.until("approval requested", isKind(session.KindApprovalRequested))
	at := w.evs[len(w.evs)-1].Seq
	// Several sleep periods pass while the turn waits; a later event
	// proves the node kept serving meanwhile.
	time.Sleep(500 * time.Millisecond) // The time that must pass, not synchronization.
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpApprove, ApprovalID: "a1", Allow: true}); rep.Error != nil {
		t.Fatalf("approve: %v", rep.Error)
	}
	w.until("turn 2", finished(2))
	for _, s := range sandboxStates(t, w.evs, at) {
		if s == string(session.SandboxSleeping) || s == string(session.SandboxSaving) {
			t.Fatalf("the sandbox slept while its turn waited for an approval:%s", summarize(w.evs))
		}
	}
}

// TestSandbox_SaveDuringTurn: a long turn's workspace is saved every
// SaveInterval while it runs.
func TestSandbox_SaveDuringTurn(t *testing.T) {
	store := dirStore(t)
	e := newEnv(t, withStore(store), func(c *Config) { c.SaveInterval = 50 * time.Millisecond })
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo progress > step1; echo written; exec sleep 600")
	w.until("the file is written", func(ev session.Event) bool {
		return ev.Kind == session.KindOutput && strings.Contains(string(ev.Data), "written")
	})
	eventually(t, "step1 saved while the turn runs", func() bool {
		rc, _, err := store.Get(context.Background(), mount.Prefix(id)+mount.ManifestKey)
		if err != nil {
			return false
		}
		defer rc.Close()
		var m mount.Manifest
		return json.NewDecoder(rc).Decode(&m) == nil && hasEntry(m, "step1")
	})
	if rep := e.cmd(id, "alice", session.Command{Op: session.OpCancel}); rep.Error != nil {
		t.Fatalf("cancel: %v", rep.Error)
	}
	if d := data[session.TurnFinishedData](t, w.until("turn 1", finished(1))); d.Status != session.TurnCancelled {
		t.Errorf("turn 1 = %+v", d)
	}
	if errs := errorsOf(t, w.evs, 0); len(errs) != 0 {
		t.Errorf("errors: %q", errs)
	}
}

// TestSandbox_MaxLifetime: a sandbox older than SandboxMaxLifetime is saved
// and replaced at the next turn; the fresh sandbox has the workspace.
func TestSandbox_MaxLifetime(t *testing.T) {
	store := dirStore(t)
	e := newEnv(t, withStore(store), func(c *Config) { c.SandboxMaxLifetime = time.Hour })
	var skew atomic.Int64
	e.host.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	id := e.create("alice", shell())
	w := e.watch(id)
	runTurn(t, e, w, id, 1, "echo v1 > a.txt")
	last := w.evs[len(w.evs)-1].Seq
	// Still young: the same sandbox, no sandbox events.
	runTurn(t, e, w, id, 2, "echo v2 > a.txt")
	if got := sandboxStates(t, w.evs, last); len(got) != 0 {
		t.Errorf("sandbox events of a turn in a young sandbox: %v", got)
	}
	last = w.evs[len(w.evs)-1].Seq

	skew.Store(int64(2 * time.Hour))
	// The old sandbox (and its directory) is destroyed: the workspace
	// comes from the store.
	out, fin, _ := runTurn(t, e, w, id, 3, "cat a.txt")
	if fin.Status != session.TurnOK || out != "v2\n" {
		t.Fatalf("turn 3 in the replacement sandbox: %+v %q", fin, out)
	}
	if got := sandboxStates(t, w.evs, last); strings.Join(got, ",") != "stopped,provisioning,restoring,ready" {
		t.Errorf("sandbox events of the replacement: %v", got)
	}
	for _, ev := range w.evs {
		if ev.Seq > last && isSandbox(session.SandboxStopped)(ev) {
			if d := data[session.SandboxData](t, ev); !strings.Contains(d.Detail, "maximum lifetime") {
				t.Errorf("stopped detail = %q", d.Detail)
			}
		}
	}
}

// TestSandbox_FencesIncrease: every activation that runs a turn takes a
// fence greater than the last, and saves the workspace with it.
func TestSandbox_FencesIncrease(t *testing.T) {
	store := dirStore(t)
	e := newEnv(t, withStore(store), withHibernate(50*time.Millisecond))
	id := e.create("alice", shell())
	w := e.watch(id)
	var fences []int64
	for n := int64(1); n <= 3; n++ {
		runTurn(t, e, w, id, n, fmt.Sprintf("echo %d >> log", n))
		m, _ := manifestOf(t, store, id)
		fences = append(fences, m.Fence)
		eventually(t, "hibernated", func() bool {
			c, _ := e.catalog(id)
			return c.State == session.StateHibernated
		})
		if n == 2 {
			// A restart of the node, too.
			e.host.Close(t.Context())
			e.start()
		}
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences of the saves in successive activations: %v, want strictly increasing", fences)
		}
	}
	if fences[0] <= 0 {
		t.Errorf("fences %v: want positive", fences)
	}
	out, _, _ := runTurn(t, e, w, id, 4, "cat log")
	if out != "1\n2\n3\n" {
		t.Errorf("log = %q", out)
	}
}

// TestSandbox_StoreUnavailable: with the object store down, a turn says its
// workspace was not saved and nothing is overwritten; a restore that cannot
// reach the store fails the turn without touching the saved copy; once the
// store is back, saves and restores resume with no work lost.
func TestSandbox_StoreUnavailable(t *testing.T) {
	srv := blobtest.StartS3(t)
	cfg := srv.Config("")
	cfg.MaxRetries = -1
	store, err := blob.OpenS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e := newEnv(t, withStore(store), func(c *Config) { c.SandboxMaxLifetime = time.Hour })
	var skew atomic.Int64
	e.host.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	id := e.create("alice", shell())
	w := e.watch(id)

	runTurn(t, e, w, id, 1, "echo one > a.txt")
	good, goodRaw := manifestOf(t, store, id)

	srv.Stop()
	last := w.evs[len(w.evs)-1].Seq
	out, fin, _ := runTurn(t, e, w, id, 2, "echo two > a.txt; echo new > b.txt; echo done")
	if fin.Status != session.TurnOK || out != "done\n" {
		t.Errorf("turn 2: %+v %q", fin, out)
	}
	errs := errorsOf(t, w.evs, last)
	if len(errs) != 1 || !strings.HasPrefix(errs[0], "workspace not saved: object store unavailable") {
		t.Fatalf("errors of turn 2: %q", errs)
	}
	srv.Start()
	if _, raw := manifestOf(t, store, id); string(raw) != string(goodRaw) {
		t.Fatalf("the manifest changed while the store was down:\n%s\n%s", goodRaw, raw)
	}
	// The saved copy is still turn 1's, and whole.
	check := &mount.Dir{Path: filepath.Join(t.TempDir(), "check"), Blob: store}
	v := &mount.Volume{Blob: store, Prefix: mount.Prefix(id), Logger: testLogger(t)}
	if _, err := v.Restore(t.Context(), check, good.Fence); err != nil {
		t.Fatalf("restore the saved copy: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(check.Path, "a.txt")); string(b) != "one\n" {
		t.Errorf("saved a.txt = %q", b)
	}
	if _, err := os.Stat(filepath.Join(check.Path, "b.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("b.txt in the saved copy: %v", err)
	}

	// The sandbox kept turn 2's work; the next save stores it.
	out, _, _ = runTurn(t, e, w, id, 3, "cat a.txt b.txt")
	if out != "two\nnew\n" {
		t.Fatalf("turn 3 = %q", out)
	}
	if m, _ := manifestOf(t, store, id); !hasEntry(m, "b.txt") {
		t.Fatalf("b.txt not saved once the store was back: %+v", m.Entries)
	}

	// A fresh sandbox (its predecessor outlived its lifetime) cannot be
	// restored while the store is down: the turn fails, the saved copy
	// stays, and the next turn restores it.
	_, savedRaw := manifestOf(t, store, id)
	skew.Store(int64(2 * time.Hour))
	srv.Stop()
	last = w.evs[len(w.evs)-1].Seq
	_, fin, _ = runTurn(t, e, w, id, 4, "echo must not run; echo lost > a.txt")
	if fin.Status != session.TurnFailed {
		t.Errorf("turn 4 without a restore: %+v", fin)
	}
	if got := sandboxStates(t, w.evs, last); strings.Join(got, ",") != "stopped,provisioning,restoring,failed" {
		t.Errorf("sandbox events of turn 4: %v", got)
	}
	if errs := errorsOf(t, w.evs, last); len(errs) != 1 || !strings.HasPrefix(errs[0], "workspace not restored: object store unavailable") {
		t.Errorf("errors of turn 4: %q", errs)
	}
	if strings.Contains(outputText(t, w.evs, 4, "stdout"), "must not run") {
		t.Error("the harness ran in a workspace that was not restored")
	}
	srv.Start()
	if _, raw := manifestOf(t, store, id); string(raw) != string(savedRaw) {
		t.Fatalf("the manifest changed after a failed restore:\n%s\n%s", savedRaw, raw)
	}
	last = w.evs[len(w.evs)-1].Seq
	out, fin, _ = runTurn(t, e, w, id, 5, "cat a.txt b.txt; echo \"$ATRIUM_PREVIOUS_TURN\"")
	lines := strings.SplitN(out, "\n", 3)
	if fin.Status != session.TurnOK || len(lines) < 3 || lines[0] != "two" || lines[1] != "new" {
		t.Fatalf("turn 5: %+v %q", fin, out)
	}
	var prev previousTurn
	if err := json.Unmarshal([]byte(lines[2]), &prev); err != nil || prev.Turn != 4 || prev.Status != session.TurnFailed ||
		!strings.HasPrefix(prev.Reason, "workspace not restored") {
		t.Errorf("%s = %s (%v)", EnvPreviousTurn, lines[2], err)
	}
	if got := sandboxStates(t, w.evs, last); strings.Join(got, ",") != "provisioning,restoring,ready" {
		t.Errorf("sandbox events of turn 5: %v", got)
	}
}

// TestSandbox_Death: the VM of a remote sandbox dies mid-turn. The turn
// fails with the reason, the sandbox is failed, and the next turn gets a
// fresh VM restored from the last save, and learns what happened from
// EnvPreviousTurn.
func TestSandbox_Death(t *testing.T) {
	srv := blobtest.StartS3(t)
	store := srv.Open(t, "")
	hook := newAgentHook(t)
	prov, err := remote.New(remote.Config{Hook: hook, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := prov.Close(ctx); err != nil {
			t.Errorf("close remote provider: %v", err)
		}
	})
	e := newEnv(t, func(c *Config) {
		c.Provider = prov
		c.Store = store
		c.WorkspaceOf = func(sb compute.Sandbox) (mount.Workspace, error) { return sb.(*remote.Sandbox).Workspace(), nil }
		c.SandboxGeneration = hook.generation
	})
	id := e.create("alice", shell())
	w := e.watch(id)

	out, fin, _ := runTurn(t, e, w, id, 1, "echo survived > work.txt; echo ok")
	if fin.Status != session.TurnOK || out != "ok\n" {
		t.Fatalf("turn 1: %+v %q", fin, out)
	}
	last := w.evs[len(w.evs)-1].Seq
	e.prompt(id, "alice", "echo unsaved > other.txt; echo started; exec sleep 600")
	w.until("turn 2 started its harness", func(ev session.Event) bool {
		return ev.Kind == session.KindOutput && strings.Contains(string(ev.Data), "started")
	})
	hook.kill(id)
	fin = data[session.TurnFinishedData](t, w.until("turn 2 finished", finished(2)))
	if fin.Status != session.TurnFailed || fin.ExitCode != -1 {
		t.Errorf("turn 2 = %+v, want failed with exit code -1", fin)
	}
	errs := errorsOf(t, w.evs, last)
	if len(errs) != 1 || !strings.Contains(errs[0], "sandbox died") {
		t.Errorf("errors of turn 2: %q", errs)
	}
	if got := sandboxStates(t, w.evs, last); strings.Join(got, ",") != "failed" {
		t.Errorf("sandbox events of turn 2: %v", got)
	}

	last = w.evs[len(w.evs)-1].Seq
	out, fin, _ = runTurn(t, e, w, id, 3, `cat work.txt; test -e other.txt && echo other || echo no-other; echo "$ATRIUM_PREVIOUS_TURN"`)
	lines := strings.SplitN(out, "\n", 3)
	if fin.Status != session.TurnOK || len(lines) < 3 || lines[0] != "survived" || lines[1] != "no-other" {
		t.Fatalf("turn 3: %+v %q", fin, out)
	}
	var prev previousTurn
	if err := json.Unmarshal([]byte(strings.TrimSpace(lines[2])), &prev); err != nil || prev.Turn != 2 ||
		prev.Status != session.TurnFailed || !strings.Contains(prev.Reason, "sandbox died") {
		t.Errorf("%s = %s (%v)", EnvPreviousTurn, lines[2], err)
	}
	if got := sandboxStates(t, w.evs, last); strings.Join(got, ",") != "provisioning,restoring,ready" {
		t.Errorf("sandbox events of turn 3: %v", got)
	}
	if n := hook.created(); n != 2 {
		t.Errorf("VMs created: %d, want 2", n)
	}

	// A VM that dies between turns is replaced when the next turn starts
	// its harness: the harness is stopped at once, the workspace restored
	// on the new VM and the harness started again.
	hook.kill(id)
	last = w.evs[len(w.evs)-1].Seq
	out, fin, _ = runTurn(t, e, w, id, 4, "cat work.txt")
	if fin.Status != session.TurnOK || out != "survived\n" {
		t.Fatalf("turn 4 after the VM died while idle: %+v %q", fin, out)
	}
	if got := sandboxStates(t, w.evs, last); strings.Join(got, ",") != "restoring,ready" {
		t.Errorf("sandbox events of turn 4: %v", got)
	}
	if n := hook.created(); n != 3 {
		t.Errorf("VMs created: %d, want 3", n)
	}

	// How the previous turn ended, in memory and from history after the
	// session reactivates.
	e.host.Close(t.Context())
	e.start()
	_, _, _ = runTurn(t, e, w, id, 5, "exit 3")
	out, _, _ = runTurn(t, e, w, id, 6, `echo "$ATRIUM_PREVIOUS_TURN"`)
	e.host.Close(t.Context())
	e.start()
	out2, _, _ := runTurn(t, e, w, id, 7, `echo "$ATRIUM_PREVIOUS_TURN"`)
	if !strings.Contains(out, `"turn":5,"status":"failed","exit_code":3`) || !strings.Contains(out2, `"turn":6,"status":"ok"`) {
		t.Errorf("previous turn in memory %q, from history %q", out, out2)
	}
}

// agentHook is a remote.Hook whose VMs are sandbox agents served by this
// process on loopback, each with a local (bubblewrap) provider of its own.
// kill makes a VM die: its connections drop and its commands are killed.
type agentHook struct {
	t testing.TB

	mu    sync.Mutex
	vms   map[string]*agentVM     // guarded by mu
	bySes map[session.ID]*agentVM // guarded by mu: the newest VM of each session
	gens  map[session.ID]uint64   // guarded by mu: VMs created per session
	wg    sync.WaitGroup
}

type agentVM struct {
	ln    *trackingListener
	hs    *http.Server
	agent *sandboxagent.Server
	local *local.Provider
	once  sync.Once
}

func newAgentHook(t testing.TB) *agentHook {
	h := &agentHook{t: t, vms: map[string]*agentVM{}, bySes: map[session.ID]*agentVM{}, gens: map[session.ID]uint64{}}
	t.Cleanup(func() {
		h.mu.Lock()
		vms := make([]*agentVM, 0, len(h.vms))
		for _, vm := range h.vms {
			vms = append(vms, vm)
		}
		h.mu.Unlock()
		for _, vm := range vms {
			h.stop(vm)
		}
		h.wg.Wait()
	})
	return h
}

func (h *agentHook) CreateVM(_ context.Context, req remote.HookRequest) (remote.VM, error) {
	dir := h.t.TempDir()
	log := testLogger(h.t).With("vm", req.SandboxID)
	lp, err := local.New(local.Config{Dir: dir, Bwrap: "/usr/bin/bwrap", Logger: log})
	if err != nil {
		return remote.VM{}, err
	}
	token := rand.Text()
	agent, err := sandboxagent.New(sandboxagent.Config{Token: token, Provider: lp, Dir: dir, Logger: log})
	if err != nil {
		return remote.VM{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return remote.VM{}, err
	}
	vm := &agentVM{ln: &trackingListener{Listener: ln}, hs: &http.Server{Handler: agent}, agent: agent, local: lp}
	h.wg.Go(func() { _ = vm.hs.Serve(vm.ln) })
	h.mu.Lock()
	h.vms[req.SandboxID] = vm
	h.bySes[req.Session] = vm
	h.gens[req.Session]++
	h.mu.Unlock()
	return remote.VM{ID: req.SandboxID, Addr: ln.Addr().String(), Token: token}, nil
}

func (h *agentHook) DestroyVM(_ context.Context, req remote.HookRequest) error {
	h.mu.Lock()
	vm := h.vms[req.SandboxID]
	delete(h.vms, req.SandboxID)
	h.mu.Unlock()
	if vm != nil {
		h.stop(vm)
	}
	return nil
}

// kill makes the newest VM of id die at once.
func (h *agentHook) kill(id session.ID) {
	h.mu.Lock()
	vm := h.bySes[id]
	h.mu.Unlock()
	if vm == nil {
		h.t.Fatalf("no VM for session %s", id)
	}
	h.stop(vm)
}

// stop drops every connection of vm, then kills its commands.
func (h *agentHook) stop(vm *agentVM) {
	vm.once.Do(func() {
		vm.ln.closeAll()
		vm.hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := vm.agent.Close(ctx); err != nil {
			h.t.Errorf("close agent: %v", err)
		}
		if err := vm.local.Close(ctx); err != nil {
			h.t.Errorf("close agent's sandboxes: %v", err)
		}
	})
}

// generation counts the VMs created for id (Config.SandboxGeneration).
func (h *agentHook) generation(id session.ID) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gens[id]
}

// created counts every VM created.
func (h *agentHook) created() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n uint64
	for _, g := range h.gens {
		n += g
	}
	return n
}

// trackingListener remembers its connections, so a "VM" can drop them all
// (hijacked WebSocket connections included) the way a dead machine does.
type trackingListener struct {
	net.Listener
	mu     sync.Mutex
	conns  []net.Conn // guarded by mu
	closed bool       // guarded by mu
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	l.conns = append(l.conns, c)
	return c, nil
}

func (l *trackingListener) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.Listener.Close()
	for _, c := range l.conns {
		c.Close()
	}
}
