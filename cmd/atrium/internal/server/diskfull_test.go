package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/session"
)

// TestServer_DataDirFull (issue 21 item 2), through the wire contract: with
// `atrium dev`'s data dir on a 64 MiB file system that a turn's output
// fills, a prompt is refused with 503 and a message naming the full disk,
// each answer coming within the gateway's request timeout; once space is
// freed the session serves again by itself, with no gap in seq and one
// turn_finished per turn.
func TestServer_DataDirFull(t *testing.T) {
	data := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", data).CombinedOutput(); err != nil {
		t.Skipf("SKIPPED, NOT PASSED: mount a 64 MiB tmpfs (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", data).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	st := startStack(t, func(c *server.Config) { c.DataDir = data })
	alice := st.as("alice")
	s := alice.create("full disk", testHarness)
	alice.prompt(s.ID, "one")
	alice.waitTurn(s.ID, 1)

	// Leave 8 MiB; the flood turn's output fills them.
	filler := filepath.Join(data, "filler")
	fillTo(t, filler, data, 8<<20)
	const answerWithin = 15 * time.Second // the gateway's 10 s request timeout, and slack
	text := "flood"
	refused := ""
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; refused == ""; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no prompt refused for the full disk within 2 minutes")
		}
		start := time.Now()
		status, body := alice.request("POST", "/v1/sessions/"+string(s.ID)+"/messages", map[string]any{"text": text, "client_id": fmt.Sprintf("full-%d", i)})
		took := time.Since(start)
		if took > answerWithin {
			t.Errorf("prompt %d answered after %v (status %d %s)", i, took, status, body)
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		switch {
		case status == http.StatusAccepted:
			t.Logf("prompt %d accepted after %v: %s", i, took.Round(time.Millisecond), body)
		case strings.Contains(e.Error.Message, "out of space") || strings.Contains(e.Error.Message, "disk full"):
			if status != http.StatusServiceUnavailable && status != http.StatusInsufficientStorage {
				t.Errorf("refused for the full disk with status %d, want 503 or 507", status)
			}
			refused = e.Error.Message
			t.Logf("prompt %d refused after %v: %d %s", i, took.Round(time.Millisecond), status, body)
		default:
			// A prompt that reaches the session in the moment it stops
			// for the full store too: its reply waited for a commit
			// the stop abandoned, and is answered with why.
			t.Errorf("prompt %d after %v: %d %s; want accepted or refused naming the full disk", i, took.Round(time.Millisecond), status, body)
		}
		text = "again"
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		status, body := alice.request("POST", "/v1/sessions/"+string(s.ID)+"/messages", map[string]any{"text": "after", "client_id": "after"})
		if status == http.StatusAccepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery a minute after space was freed: %d %s", status, body)
		}
		time.Sleep(250 * time.Millisecond) // the store guard looks once a second
	}
	alice.waitEvent(s.ID, 0, "the turn of the prompt after recovery", func(ev event) bool {
		if ev.Kind != session.KindOutput {
			return false
		}
		var d struct{ Text string }
		ev.decode(t, &d)
		return strings.Contains(d.Text, `"prompt":"after"`)
	})
	evs := alice.events(s.ID, 0)
	finished := map[int64]int{}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: a gap", i+1, ev.Seq)
		}
		if ev.Kind == session.KindTurnFinished {
			if finished[ev.turn()]++; finished[ev.turn()] > 1 {
				t.Errorf("turn %d finished twice (seq %d)", ev.turn(), ev.Seq)
			}
		}
	}
	t.Logf("%d events, gap-free; turn_finished per turn: %v", len(evs), finished)
}

// TestServer_JetStreamStoreFull (issue 21 item 2): with only the embedded
// NATS server's store (`<data_dir>/nats`) on a 64 MiB file system that a
// turn's output fills, the session stops for the full store; the prompt
// after the stop, which asks a node to activate the session, gets the
// node's refusal at once — 503 unavailable naming the full store, with
// Retry-After — and not after the gateway's 10 s of place retries:
// atrium_gateway_place_refusals_total{result="lasting"} counts it, and the
// refusal is the activation's ("cannot take session"). Once space is freed
// the session serves again by itself, with no gap in seq.
func TestServer_JetStreamStoreFull(t *testing.T) {
	data := t.TempDir()
	store := filepath.Join(data, "nats")
	if err := os.MkdirAll(store, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", store).CombinedOutput(); err != nil {
		t.Skipf("SKIPPED, NOT PASSED: mount a 64 MiB tmpfs (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", store).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	st := startStack(t, func(c *server.Config) { c.DataDir = data })
	alice := st.as("alice")
	s := alice.create("full store", testHarness)
	alice.prompt(s.ID, "one")
	alice.waitTurn(s.ID, 1)

	filler := filepath.Join(store, "filler")
	fillTo(t, filler, store, 8<<20)
	path := "/v1/sessions/" + string(s.ID) + "/messages"
	text := "flood"
	for i, deadline := 0, time.Now().Add(2*time.Minute); ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no prompt refused for the full store within 2 minutes")
		}
		if i > 0 {
			time.Sleep(100 * time.Millisecond) // paces the prompts while the flood turn fills the store
		}
		status, _, e := alice.requestError(path, map[string]any{"text": text, "client_id": fmt.Sprintf("full-%d", i)})
		if status != http.StatusAccepted {
			if !strings.Contains(e.Message, "out of space") {
				t.Fatalf("prompt %d: %d %+v; want accepted or refused for the full store", i, status, e)
			}
			t.Logf("prompt %d refused: %d %s", i, status, e.Message)
			break
		}
		text = "again"
	}

	// The session stopped for the full store (or is stopping: then the
	// session itself refuses, with the same reason). The first prompt
	// that finds it stopped asks a node to activate it; the node refuses
	// for the full store, and that refusal is the answer.
	lasting := func() float64 {
		return scrapeMetrics(t, st.url).sum("atrium_gateway_place_refusals_total", `result="lasting"`)
	}
	for i := 0; ; i++ {
		if i == 50 {
			t.Fatal("50 prompts after the stop and no activation refused for the full store")
		}
		before := lasting()
		start := time.Now()
		status, hdr, e := alice.requestError(path, map[string]any{"text": "after the stop", "client_id": fmt.Sprintf("stopped-%d", i)})
		took := time.Since(start)
		if status != http.StatusServiceUnavailable || e.Code != session.CodeUnavailable || !strings.Contains(e.Message, "out of space") ||
			!strings.Contains(e.Message, store) {
			t.Fatalf("prompt %d after the stop: %d %+v; want 503 unavailable naming the full store %s", i, status, e, store)
		}
		if hdr.Get("Retry-After") == "" || e.RetryAfterS <= 0 {
			t.Errorf("prompt %d after the stop: Retry-After %q, retry_after_s %d; want both set", i, hdr.Get("Retry-After"), e.RetryAfterS)
		}
		if lasting() > before {
			if !strings.Contains(e.Message, "cannot take session") {
				t.Errorf("the refusal counted as the activation's says %q", e.Message)
			}
			t.Logf("prompt %d after the stop: the activation's refusal, answered after %v: %s", i, took.Round(time.Millisecond), e.Message)
			break
		}
		t.Logf("prompt %d after the stop: refused by the stopping session after %v: %s", i, took.Round(time.Millisecond), e.Message)
		time.Sleep(100 * time.Millisecond) // no notification for the session's teardown's end
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		status, body := alice.request("POST", path, map[string]any{"text": "after", "client_id": "after"})
		if status == http.StatusAccepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery a minute after space was freed: %d %s", status, body)
		}
		time.Sleep(250 * time.Millisecond) // the store guard looks once a second
	}
	evs := alice.events(s.ID, 0)
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: a gap", i+1, ev.Seq)
		}
	}
	t.Logf("%d events, gap-free", len(evs))
}

// requestError POSTs body to path and returns the status, the headers and
// the error the answer carries (zero if none).
func (c *client) requestError(path string, body any) (int, http.Header, session.Error) {
	c.t.Helper()
	enc, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	req, err := http.NewRequest("POST", c.base+path, bytes.NewReader(enc))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer dev:"+c.user)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	var e session.ErrorBody
	if resp.StatusCode >= 300 {
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error == nil {
			c.t.Fatalf("POST %s: %s with no error body (%v)", path, resp.Status, err)
		}
		return resp.StatusCode, resp.Header, *e.Error
	}
	return resp.StatusCode, resp.Header, session.Error{}
}

// fillTo writes name until the file system of dir has at most keep bytes
// free.
func fillTo(t *testing.T, name, dir string, keep int64) {
	t.Helper()
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
			return
		}
		if _, err := f.Write(buf[:min(int64(len(buf)), free-keep)]); err != nil {
			return
		}
	}
}
