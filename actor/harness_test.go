package actor

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/session"
)

// TestHost_HarnessFailures runs misbehaving harnesses; each must end its
// turn with clear events, and the session must serve the next prompt.
func TestHost_HarnessFailures(t *testing.T) {
	e := newEnv(t)

	t.Run("not executable", func(t *testing.T) {
		id := e.create("alice", command("/nonexistent/harness"))
		w := e.watch(id)
		for turn := int64(1); turn <= 2; turn++ { // and again: the session keeps working
			e.prompt(id, "alice", "hi")
			fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(turn)))
			if fin.Status != session.TurnFailed || fin.ExitCode == 0 {
				t.Errorf("turn %d finished %+v, want failed", turn, fin)
			}
		}
		var errs []string
		for _, ev := range w.evs {
			if ev.Kind == session.KindError {
				errs = append(errs, data[session.ErrorData](t, ev).Message)
			}
		}
		t.Logf("errors: %q; stderr: %q", errs, outputText(t, w.evs, 1, "stderr"))
		if len(errs) != 2 || !strings.Contains(errs[0], "harness") {
			t.Errorf("error events = %q, want one per turn naming the harness", errs)
		}
	})

	id := e.create("alice", shell())
	w := e.watch(id)
	turn := int64(0)
	run := func(t *testing.T, prompt string) session.TurnFinishedData {
		t.Helper()
		turn++
		e.prompt(id, "alice", prompt)
		return data[session.TurnFinishedData](t, w.until("turn_finished", finished(turn)))
	}

	t.Run("non-zero exit", func(t *testing.T) {
		if fin := run(t, "echo bye; exit 3"); fin.Status != session.TurnFailed || fin.ExitCode != 3 {
			t.Errorf("finished %+v, want failed/3", fin)
		}
	})
	t.Run("never reads stdin", func(t *testing.T) {
		// The first stdin line is far larger than a pipe's buffer.
		id := e.create("alice", command("bash", "-c", "sleep 0.1; echo no-read"))
		w := e.watch(id)
		e.prompt(id, "alice", strings.Repeat("x", session.MaxTextBytes))
		if fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(1))); fin.Status != session.TurnOK {
			t.Errorf("finished %+v, want ok", fin)
		}
		if got := outputText(t, w.evs, 1, "stdout"); got != "no-read\n" {
			t.Errorf("stdout = %q", got)
		}
	})
	t.Run("prompt too long for the shell template", func(t *testing.T) {
		if fin := run(t, "echo "+strings.Repeat("x", 130<<10)); fin.Status != session.TurnFailed {
			t.Errorf("finished %+v, want failed", fin)
		}
		if ev := w.evs[len(w.evs)-2]; ev.Kind != session.KindError || !strings.Contains(string(ev.Data), "at most") {
			t.Errorf("event before turn_finished: %s %s", ev.Kind, ev.Data)
		}
	})
	t.Run("binary garbage", func(t *testing.T) {
		fin := run(t, "head -c 300000 /dev/urandom; printf '\\xe2\\x82'; head -c 100000 /dev/urandom >&2")
		if fin.Status != session.TurnOK {
			t.Errorf("finished %+v", fin)
		}
		n := 0
		for i, raw := range w.raw {
			ev := w.evs[i]
			if ev.Kind != session.KindOutput || data[session.OutputData](t, ev).Turn != turn {
				continue
			}
			n++
			d := data[session.OutputData](t, ev)
			if !utf8.ValidString(d.Text) || len(d.Text) > session.MaxOutputEventBytes {
				t.Fatalf("output event of %d bytes, valid UTF-8 %v", len(d.Text), utf8.ValidString(d.Text))
			}
			if !json.Valid(raw) {
				t.Fatalf("invalid JSON event")
			}
		}
		if n < 5 {
			t.Errorf("%d output events for 400 kB of output", n)
		}
	})
	t.Run("long line", func(t *testing.T) {
		// A JSON object longer than an event is plain output, split.
		fin := run(t, `printf '{"type":"x","pad":"%0100000d"}\n' 0`)
		if fin.Status != session.TurnOK {
			t.Errorf("finished %+v", fin)
		}
		for _, ev := range w.evs {
			if ev.Kind == session.KindAgent && data[session.OutputData](t, ev).Turn == turn {
				t.Errorf("a 100 kB line became an agent event")
			}
		}
		if got := outputText(t, w.evs, turn, "stdout"); len(got) != 100000+len(`{"type":"x","pad":""}`)+1 {
			t.Errorf("stdout has %d bytes", len(got))
		}
	})
	t.Run("100 MB of output", func(t *testing.T) {
		// Its own session and a watcher that keeps nothing but a tally, so
		// the heap measures the node, not the test.
		id := e.create("alice", shell())
		var logged, limitErrs atomic.Int64
		fin := make(chan session.TurnFinishedData, 1)
		sub, err := e.gw.Subscribe(e.subj.Events(id), func(m *nats.Msg) {
			// Runs on the subscription's goroutine: decode without t.Fatal.
			var ev struct {
				Kind session.Kind
				Data struct {
					session.TurnFinishedData
					session.ErrorData
					Text string
				}
			}
			json.Unmarshal(m.Data, &ev)
			switch ev.Kind {
			case session.KindOutput:
				logged.Add(int64(len(ev.Data.Text)))
			case session.KindError:
				if ev.Data.Code == session.CodePayloadTooLarge && strings.Contains(ev.Data.Message, "output limit") {
					limitErrs.Add(1)
				}
			case session.KindTurnFinished:
				fin <- ev.Data.TurnFinishedData
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		sub.SetPendingLimits(-1, -1)
		e.gw.Flush()

		// The heap is the whole process's: measure growth from here, after
		// a collection, so that what earlier tests left does not count, and
		// collect often meanwhile, so that garbage (which the default GC
		// lets grow as large as the live heap) does not count either.
		defer debug.SetGCPercent(debug.SetGCPercent(20))
		runtime.GC()
		var base runtime.MemStats
		runtime.ReadMemStats(&base)
		var peak atomic.Uint64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			var ms runtime.MemStats
			for {
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
		e.prompt(id, "alice", "head -c 100000000 /dev/zero | tr '\\0' 'y'; echo done >&2")
		var d session.TurnFinishedData
		select {
		case d = <-fin:
		case <-time.After(60 * time.Second):
			t.Fatal("no turn_finished")
		}
		close(stop)
		wg.Wait()
		if d.Status != session.TurnOK {
			t.Errorf("finished %+v", d)
		}
		if n := limitErrs.Load(); n != 1 {
			t.Errorf("%d output-limit errors, want 1", n)
		}
		if n := logged.Load(); n != DefaultMaxTurnOutput {
			t.Errorf("logged %d bytes of output, want the limit %d", n, DefaultMaxTurnOutput)
		}
		// The node never held the output: far less than 100 MB. (The heap
		// is the whole process's: it includes the in-process NATS server,
		// whose events stream keeps the captured 8 MB in its cache.)
		grew := int64(peak.Load()) - int64(base.HeapInuse)
		if grew > 64<<20 {
			t.Errorf("heap in use grew by %d MB during the turn (from %d MB)", grew>>20, base.HeapInuse>>20)
		}
		t.Logf("heap in use grew by %d MB during the turn (from %d MB)", grew>>20, base.HeapInuse>>20)
		e.prompt(id, "alice", "echo fine")
	})
	t.Run("memory limit", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.Provider = newLocal(t, 64<<20) })
		id := e.create("alice", shell())
		w := e.watch(id)
		e.prompt(id, "alice", "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo survived ${#x}")
		fin := data[session.TurnFinishedData](t, w.until("turn_finished", finished(1)))
		if fin.Status != session.TurnFailed {
			t.Errorf("finished %+v, want failed", fin)
		}
		var msgs []string
		for _, ev := range w.evs {
			if ev.Kind == session.KindError {
				msgs = append(msgs, data[session.ErrorData](t, ev).Message)
			}
		}
		if len(msgs) != 1 || !strings.Contains(msgs[0], "memory limit") {
			t.Errorf("error events %q; events:%s", msgs, summarize(w.evs))
		}
	})
	t.Run("still works", func(t *testing.T) {
		if fin := run(t, "echo fine"); fin.Status != session.TurnOK {
			t.Errorf("finished %+v", fin)
		}
		evs := decode(t, e.history(id, "alice"))
		checkContiguous(t, evs)
	})
}

func TestTextBuf(t *testing.T) {
	b := textBuf{limit: 8}
	var got []string
	got = append(got, b.add([]byte("ab\xe2\x82"))...) // a rune split across reads
	got = append(got, b.add([]byte("\xacc"))...)
	if len(got) != 0 || b.take() != "ab€c" {
		t.Fatalf("split rune: %q", got)
	}
	got = b.add([]byte("\xff\xfe1234567€€"))
	for _, s := range got {
		if len(s) > 8 || !utf8.ValidString(s) {
			t.Errorf("chunk %q", s)
		}
	}
	rest := strings.Join(append(got, b.end()...), "")
	if rest != "\uFFFD1234567€€" {
		t.Errorf("joined %q", rest)
	}
	b.add([]byte("x\xe2"))
	if end := strings.Join(b.end(), ""); end != "x\uFFFD" {
		t.Errorf("end with a partial rune = %q", end)
	}
}
