package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/actor/jetstream/embedded"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/sqlite"
)

// smallFS mounts a tmpfs of size bytes on a new directory and returns it;
// Cleanup unmounts it. The test is skipped (said loudly) without root.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("SKIPPED, NOT PASSED: mount a %s tmpfs (needs root): %v: %s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file in dir until the file system is full, leaving keep
// bytes free, and returns its path.
func fill(t *testing.T, dir string, keep int64) string {
	t.Helper()
	name := filepath.Join(dir, "filler")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		free := int64(st.Bavail) * int64(st.Bsize)
		if free <= keep {
			return name
		}
		n := min(int64(len(buf)), free-keep)
		if _, err := f.Write(buf[:n]); err != nil {
			return name // full
		}
	}
}

// newEnvOn is newEnv with the JetStream store and the histories in dataDir.
// A guard watches the store (embedded.Guard) and is the host's StoreFull.
func newEnvOn(t *testing.T, dataDir, histDir string, opts ...envOption) (*env, *embedded.Guard) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{DontListen: true, JetStream: true, StoreDir: filepath.Join(dataDir, "nats"), NoSigs: true})
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	guard := &embedded.Guard{Server: ns, Logger: testLogger(t), Interval: 200 * time.Millisecond}
	ns.SetLoggerV2(guard.Wrap(natsTestLogger{t}), false, false, false)
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { guard.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name(name))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	e := &env{t: t, ns: ns, nc: connect("node"), gw: connect("gateway")}
	e.dir = &sqlite.Dir{Path: filepath.Join(histDir, "histories"), Logger: testLogger(t)}
	e.cfg = Config{
		NATS: e.nc, Histories: HistoriesOf(e.dir), SecretKeys: testSecretKeys, Provider: newProvider(t),
		NodeID: "n1", HibernateAfter: time.Minute, CancelGrace: time.Second, DrainGrace: 100 * time.Millisecond,
		Logger: testLogger(t), StoreFull: guard.Err,
	}
	for _, o := range opts {
		o(&e.cfg)
	}
	e.start()
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	if e.kv, err = js.KeyValue(context.Background(), e.subj.CatalogBucket()); err != nil {
		t.Fatalf("catalog bucket: %v", err)
	}
	return e, guard
}

// natsTestLogger passes the NATS server's warnings and errors to the test
// log.
type natsTestLogger struct{ t *testing.T }

func (l natsTestLogger) Noticef(string, ...any)    {}
func (l natsTestLogger) Debugf(string, ...any)     {}
func (l natsTestLogger) Tracef(string, ...any)     {}
func (l natsTestLogger) Warnf(f string, v ...any)  { l.t.Logf("nats-server WARN: "+f, v...) }
func (l natsTestLogger) Errorf(f string, v ...any) { l.t.Logf("nats-server ERROR: "+f, v...) }
func (l natsTestLogger) Fatalf(f string, v ...any) { l.t.Logf("nats-server FATAL: "+f, v...) }

// TestHost_JetStreamStoreFull (issue 21 item 2): with the JetStream store
// on a small file system that a turn's output fills, prompts get a precise
// error naming the full store within the gateway's request timeout instead
// of waiting forever; once space is back the store's guard restarts
// JetStream and the session serves again by itself, with no gap in seq,
// one turn_finished per turn, and the stream holding the history's bytes.
//
// In the data-dir case the history files share the small file system: a
// write to either may fail first, and either way the refusal says the disk
// is full.
func TestHost_JetStreamStoreFull(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sharedDisk bool // the histories on the small file system too
	}{
		{"jetstream-store", false},
		{"data-dir", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := smallFS(t, "64m")
			hist := t.TempDir()
			if tc.sharedDisk {
				hist = data
			}
			testStoreFull(t, data, hist, !tc.sharedDisk)
		})
	}
}

// fullDisk reports whether a refusal says the disk is full.
func fullDisk(msg string) bool {
	return strings.Contains(msg, "out of space") || strings.Contains(msg, "disk full")
}

func testStoreFull(t *testing.T, data, histDir string, guardRestarts bool) {
	e, guard := newEnvOn(t, data, histDir)
	id := e.create("alice", shell())
	w := e.watch(id)
	e.prompt(id, "alice", "echo one")
	w.until("turn 1 finished", finished(1))

	filler := fill(t, data, 0)
	// A turn whose output needs more room than is left; prompts follow
	// until one is refused for the full store. Each answer comes within
	// the gateway's request timeout (gateway.DefaultRequestTimeout, 10s).
	const answerWithin = 10 * time.Second
	text := "for i in $(seq 1 3000); do echo line $i of a turn whose output fills the disk; done"
	var refused *session.Error
	deadline := time.Now().Add(90 * time.Second)
	for i := 0; refused == nil; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no prompt was refused for the full store within 90s")
		}
		start := time.Now()
		rep, err := e.tryCmdWithin(id, "alice", session.Command{Op: session.OpPrompt, Text: text, ClientID: fmt.Sprintf("full-%d", i)}, answerWithin)
		took := time.Since(start)
		switch {
		case err != nil:
			t.Fatalf("prompt %d on a full store: no answer within %v: %v", i, answerWithin, err)
		case rep.Error != nil:
			t.Logf("prompt %d refused after %v: %v", i, took.Round(time.Millisecond), rep.Error)
			if fullDisk(rep.Error.Message) {
				refused = rep.Error
			}
		default:
			t.Logf("prompt %d acknowledged at seq %d after %v", i, rep.Seq, took.Round(time.Millisecond))
		}
		text = "echo more"
	}
	if refused.Code != session.CodeUnavailable || (guardRestarts && !strings.Contains(refused.Message, data)) {
		t.Errorf("refusal %v: want unavailable naming the full disk (under %s)", refused, data)
	}
	if guardRestarts && refused.RetryAfterS <= 0 {
		// The gateway answers a refusal with a retry hint at once,
		// instead of retrying the placement (gateway/owner.go).
		t.Errorf("refusal %v for the full store has no retry hint", refused)
	}
	// Still full: the next prompt is refused at once, with the reason.
	// It is sent once the stopped session has let go of its record: a
	// request that reaches a session actor in the moment it tears down
	// can go unanswered (a race of the teardown, not of the full disk:
	// reported in issue 14's notes), which this test is not about.
	// (A history write that failed does not stop the session.)
	for deadline := time.Now().Add(10 * time.Second); guardRestarts && holds(e.host, id); {
		if time.Now().After(deadline) {
			t.Fatal("the session stopped for the full store still holds its record after 10s")
		}
		time.Sleep(10 * time.Millisecond) // no notification for a teardown's end
	}
	start := time.Now()
	rep, err := e.tryCmdWithin(id, "alice", session.Command{Op: session.OpPrompt, Text: "echo still full", ClientID: "still-full"}, answerWithin)
	if err != nil || rep.Error == nil || !fullDisk(rep.Error.Message) {
		t.Errorf("prompt on a store still full: %+v, %v; want refused for the full store", rep.Error, err)
	} else if guardRestarts && rep.Error.RetryAfterS <= 0 {
		t.Errorf("prompt on a store still full: refused with no retry hint: %+v", rep.Error)
	} else if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a prompt on a store known full took %v to be refused", took)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	var seq session.Seq
	for {
		rep, err := e.tryCmdWithin(id, "alice", session.Command{Op: session.OpPrompt, Text: "echo back", ClientID: "back"}, answerWithin)
		if err == nil && rep.Error == nil {
			seq = rep.Seq
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 60s after space came back: %+v %v", rep.Error, err)
		}
		time.Sleep(200 * time.Millisecond) // the guard looks at the free space once a second
	}
	if guardRestarts && guard.Restarts() == 0 {
		t.Error("the session recovered but the guard never restarted JetStream")
	}
	t.Logf("served again: prompt at seq %d", seq)
	waitTurnFinishedAfter(t, e, id, seq)
	checkHistory(t, e, id)
	if guardRestarts {
		// The session says in its history why prompts were refused.
		said := false
		for _, raw := range e.history(id, "alice") {
			var ev session.Event
			var d session.ErrorData
			if json.Unmarshal(raw, &ev) == nil && ev.Kind == session.KindError && json.Unmarshal(ev.Data, &d) == nil &&
				strings.Contains(d.Message, "could not be stored") && strings.Contains(d.Message, "out of space") {
				said = true
				t.Logf("error event at seq %d: %s", ev.Seq, d.Message)
			}
		}
		if !said {
			t.Error("no error event in the history says the events could not be stored for the full store")
		}
	}
}

// holds reports whether h holds id's ownership record.
func holds(h *Host, id session.ID) bool {
	for _, l := range h.Leases() {
		if l.Session == id {
			return true
		}
	}
	return false
}

// waitTurnFinishedAfter waits until the history has a turn_finished after
// seq.
func waitTurnFinishedAfter(t *testing.T, e *env, id session.ID, seq session.Seq) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, raw := range e.history(id, "alice") {
			var ev session.Event
			if json.Unmarshal(raw, &ev) == nil && ev.Seq > seq && ev.Kind == session.KindTurnFinished {
				return
			}
		}
		time.Sleep(100 * time.Millisecond) // no notification for a turn that ran while nobody watched
	}
	t.Fatalf("no turn_finished after seq %d", seq)
}

// checkHistory checks the history has no gap in seq, one turn_finished per
// turn, that the events stream holds every event of it (no acknowledged
// event lost) and the same bytes under every seq it has. Turns may still
// run: the history is read before and after the stream.
func checkHistory(t *testing.T, e *env, id session.ID) {
	t.Helper()
	hist := e.history(id, "alice")
	inStream := map[session.Seq]bool{}
	finishedTurns := map[int64]int{}
	bySeq := map[session.Seq][]byte{}
	for i, raw := range hist {
		var ev session.Event
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Seq != session.Seq(i+1) {
			t.Fatalf("history event %d has seq %d: a gap", i+1, ev.Seq)
		}
		bySeq[ev.Seq] = raw
		if ev.Kind == session.KindTurnFinished {
			var d session.TurnFinishedData
			_ = json.Unmarshal(ev.Data, &d)
			if finishedTurns[d.Turn]++; finishedTurns[d.Turn] > 1 {
				t.Errorf("turn %d finished twice (seq %d)", d.Turn, ev.Seq)
			}
		}
	}
	js, err := jetstream.New(e.gw)
	if err != nil {
		t.Fatal(err)
	}
	// JetStream may be restarting a moment longer (the guard).
	var st jetstream.Stream
	for deadline := time.Now().Add(10 * time.Second); ; {
		st, err = js.Stream(t.Context(), e.subj.EventsStream())
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // nothing to wait on for JetStream to answer again
	}
	if err != nil {
		t.Fatal(err)
	}
	var stream []session.Seq
	var streamRaw [][]byte
	state := st.CachedInfo().State
	for n := state.FirstSeq; n <= state.LastSeq && n > 0; n++ {
		msg, err := st.GetMsg(t.Context(), n)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("stream sequence %d: %v", n, err)
		}
		if msg.Subject != e.subj.Events(id) || msg.Header.Get(session.HeaderControl) != "" {
			continue
		}
		var ev session.Event
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		inStream[ev.Seq] = true
		stream = append(stream, ev.Seq)
		streamRaw = append(streamRaw, msg.Data)
	}
	for i, raw := range e.history(id, "alice") {
		bySeq[session.Seq(i+1)] = raw
	}
	for i, seq := range stream {
		if want := bySeq[seq]; string(want) != string(streamRaw[i]) {
			t.Errorf("the stream holds seq %d as %s, the history as %s", seq, streamRaw[i], want)
		}
	}
	for seq := range session.Seq(len(hist)) {
		if !inStream[seq+1] {
			t.Errorf("the history's event %d is not in the events stream: %s", seq+1, hist[seq])
		}
	}
	t.Logf("history: %d events, gap-free; turns finished: %v", len(hist), finishedTurns)
}
