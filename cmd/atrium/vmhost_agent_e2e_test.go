package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/storage/blob/blobtest"
)

// TestDev_VMHostAgentSleep runs the real Claude Code as a session's agent
// in a VM of a real `atrium vmhost` (QEMU, software emulation here) and
// checks the two things a VM sandbox owes an agent (DESIGN §6):
//
//   - the agent process survives the VM's sleep: after the sandbox went to
//     sleep (sandbox.sleep_after) and woke for the next prompt, that prompt
//     is served by the same process (the node started one agent process in
//     all; no session/load, no re-hydration, no workspace restore);
//   - after the node's kill -9 while the VM sleeps with the agent process
//     suspended in it, the new node finds the VM again, the orphaned
//     process is killed (else the workspace restore is refused while it
//     waits for an attach), and a new process loads its session from the
//     home the VM kept;
//   - the agent's home is saved back from the VM: a file the agent wrote
//     under its home is in the saved copy in S3, and after the VM host's
//     kill -9 (the sleeping VM is lost) the fresh VM gets the home back
//     before the new agent process starts, which reads the file and loads
//     its session instead of being re-hydrated.
func TestDev_VMHostAgentSleep(t *testing.T) {
	cat, err := agents.New(agents.Config{Dir: agentsCacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := cat.Spec("claude")
	if in, err := cat.Lookup("claude"); err != nil || in.Version != spec.Version {
		msg := "SKIPPING REAL-AGENT TEST: claude " + spec.Version + " is not in the agents cache " + agentsCacheDir() + " (run .ci/deps)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	bin, image := staticAtriumAndImageWith(t, agentsCacheDir())
	up := modeltest.New(t)
	up.Match(modeltest.HasTools) // Claude Code's side requests (titles) get the default answer.
	dir := t.TempDir()
	s3 := blobtest.StartS3On(t, hostAddress(t))
	store := s3.Open(t, "")
	token := "vmhost-agent-sleep-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	tokenFile := filepath.Join(dir, "vmhost-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	state, err := os.MkdirTemp("", "vmh") // short: QMP socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	vh := startVMHost(t, bin, image, state, listen, tokenFile, "--memory", "1024", "--allow", s3.Endpoint)
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(agentsCacheDir(), filepath.Join(data, "agents")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ATRIUM_TEST_ANTHROPIC_KEY", "sk-vm-upstream")
	cfg := filepath.Join(dir, "atrium.yaml")
	yaml := fmt.Sprintf(`agent_mode: auto
models:
  providers:
    - name: anthropic
      kind: anthropic
      base_url: %s
      api_key_env: ATRIUM_TEST_ANTHROPIC_KEY
sandbox:
  provider: remote
  sleep_after: 2s
  remote:
    vm_hosts:
      - url: http://%s
        token_file: %s
storage:
  type: s3
  s3: {endpoint: %q, bucket: %q, access_key: %q, secret_key: %q, insecure: true}
`, up.URL, listen, tokenFile, s3.Endpoint, s3.Bucket, s3.AccessKey, s3.SecretKey)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startDev(t, data, "--config", cfg)
	a := api{t: t, base: p.url, user: "ann"}
	var s session.Session
	a.must(http.StatusCreated, "POST", "/v1/sessions", map[string]any{"title": "claude sleeps in a VM", "agent": "claude"}, &s)

	turn := func(n int64, prompt string, replies ...modeltest.Reply) {
		t.Helper()
		for _, r := range replies {
			up.Push(r)
		}
		begin := time.Now()
		a.prompt(s.ID, prompt)
		fin := waitTurnFor(a, s.ID, n, 8*time.Minute)
		if fin.field("status") != string(session.TurnOK) {
			var why []string
			for _, ev := range a.events(s.ID) {
				if ev.Kind == session.KindError || ev.Kind == session.KindSandbox || ev.Kind == session.KindOutput {
					why = append(why, string(ev.raw))
				}
			}
			t.Fatalf("turn %d: %s\n%s", n, fin.raw, strings.Join(why, "\n"))
		}
		t.Logf("turn %d took %v", n, time.Since(begin).Round(time.Millisecond))
	}
	// sandboxStates returns the states of the sandbox events after seq.
	sandboxStates := func(after int64) []string {
		var out []string
		for _, ev := range a.events(s.ID) {
			if ev.Kind == session.KindSandbox && ev.Seq > after {
				out = append(out, ev.field("state"))
			}
		}
		return out
	}
	// asleep waits until the sandbox went to sleep after seq and the VM
	// host holds the VM paused on its disk.
	asleep := func(after int64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			slept := false
			for _, st := range sandboxStates(after) {
				slept = slept || st == string(session.SandboxSleeping)
			}
			if vms := vmsOf(t, listen, token, s.ID); slept && len(vms) == 1 && vms[0].State == "sleeping" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the sandbox did not go to sleep: sandbox states %v, VMs %+v", sandboxStates(after), vmsOf(t, listen, token, s.ID))
			}
			time.Sleep(200 * time.Millisecond) // Polling interval.
		}
	}
	lastSeq := func() int64 {
		evs := a.events(s.ID)
		return evs[len(evs)-1].Seq
	}
	started := func() int { return strings.Count(p.stderr.String(), "agent process started") }
	scripted := func(from int) []modeltest.Request {
		var out []modeltest.Request
		for _, r := range up.Requests()[from:] {
			if r.Scripted {
				out = append(out, r)
			}
		}
		return out
	}
	const rehydrated = "could not load this conversation" // actor/agent_turn.go's transcript marker

	// Turn 1: the agent writes a file under its home (outside /workspace).
	marker := "home-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	notePath := "/home/atrium/notes/marker.txt"
	turn(1, "Remember the word periwinkle and keep a note.",
		modeltest.Tool("Write", map[string]any{"file_path": notePath, "content": marker}),
		modeltest.Text("I will remember periwinkle."))
	vms := vmsOf(t, listen, token, s.ID)
	if len(vms) != 1 {
		t.Fatalf("VMs of the session after turn 1: %+v", vms)
	}
	first := vms[0].ID

	// The saved home holds what the agent wrote in the VM: the note and
	// Claude Code's transcript.
	m, _, err := mount.ReadManifest(context.Background(), store, "sessions/"+string(s.ID)+"/agent-home/")
	if err != nil || m == nil {
		t.Fatalf("the agent home was not saved from the VM: %v", err)
	}
	var saved []string
	note, transcript := false, false
	for _, e := range m.Entries {
		saved = append(saved, e.Path)
		note = note || e.Path == "notes/marker.txt"
		transcript = transcript || strings.HasPrefix(e.Path, ".claude/projects/") && strings.HasSuffix(e.Path, ".jsonl")
	}
	if !note || !transcript {
		t.Fatalf("the saved agent home holds %q; want notes/marker.txt and Claude Code's transcript", saved)
	}

	// The idle sandbox goes to sleep; the next prompt wakes it and goes
	// to the same agent process.
	seq := lastSeq()
	asleep(seq)
	if n := started(); n != 1 {
		t.Fatalf("%d agent processes started before the sleep, want 1", n)
	}
	from := len(up.Requests())
	turn(2, "Now remember the number 42.", modeltest.Text("Noted: 42."))
	if n := started(); n != 1 {
		t.Errorf("%d agent processes started after the sleep and wake, want the same one (1)", n)
	}
	if !strings.Contains(p.stderr.String(), "agent process kept over the sandbox's sleep") {
		t.Errorf("the node did not say it kept the agent process over the sleep")
	}
	for _, st := range sandboxStates(seq) {
		if st == string(session.SandboxRestoring) || st == string(session.SandboxProvisioning) {
			t.Errorf("the wake %s the sandbox (states %v): the VM kept it", st, sandboxStates(seq))
		}
	}
	reqs := scripted(from)
	if len(reqs) == 0 {
		t.Fatal("no model request for turn 2")
	}
	for _, r := range reqs {
		if bytes.Contains(r.Body, []byte(rehydrated)) {
			t.Errorf("turn 2 was re-hydrated: the agent process was not kept")
		}
		if !bytes.Contains(r.Body, []byte("I will remember periwinkle.")) {
			t.Errorf("turn 2's model request does not hold turn 1's conversation")
		}
	}
	if vms := vmsOf(t, listen, token, s.ID); len(vms) != 1 || vms[0].ID != first {
		t.Fatalf("after the wake the session's VMs are %+v; want the same VM %s", vms, first)
	}

	// The sandbox sleeps again, with the agent process suspended in the
	// VM, and the node dies. The new node finds the VM again (the VM host
	// wakes it): the orphaned agent process is killed, so the workspace
	// can be restored, and the VM's home, newer than nothing, is kept; a
	// new agent process loads its session.
	asleep(lastSeq())
	p.signal(syscall.SIGKILL)
	p.wait()
	p = startDev(t, data, "--config", cfg)
	a = api{t: t, base: p.url, user: "ann"}
	from = len(up.Requests())
	turn(3, "And the number?", modeltest.Text("42."))
	if n := started(); n != 1 {
		t.Errorf("%d agent processes started on the new node, want 1", n)
	}
	if vms := vmsOf(t, listen, token, s.ID); len(vms) != 1 || vms[0].ID != first {
		t.Fatalf("after the node's kill -9 the session's VMs are %+v; want the same VM %s", vms, first)
	}
	for _, r := range scripted(from) {
		if bytes.Contains(r.Body, []byte(rehydrated)) || !bytes.Contains(r.Body, []byte("Noted: 42.")) {
			t.Errorf("after the node's kill -9 the new agent process did not load its session")
		}
	}

	// The sandbox sleeps again; the VM host dies with the sleeping VM and
	// comes back empty. The next prompt gets a fresh VM, the workspace and
	// the agent's home restored, and a new agent process that loads its
	// session and finds its note.
	asleep(lastSeq())
	vh.cmd.Process.Signal(syscall.SIGKILL)
	<-vh.exited
	startVMHost(t, bin, image, state, listen, tokenFile, "--memory", "1024", "--allow", s3.Endpoint)
	from = len(up.Requests())
	turn(4, "What did I ask you to remember first? Read your note too.",
		modeltest.Tool("Read", map[string]any{"file_path": notePath}),
		modeltest.Text("You asked me to remember periwinkle."))
	if n := started(); n != 2 {
		t.Errorf("%d agent processes started on the new node after the VM host's kill -9, want 2", n)
	}
	if vms := vmsOf(t, listen, token, s.ID); len(vms) != 1 || vms[0].ID == first {
		t.Fatalf("after the VM host's kill -9 the session's VMs are %+v; want a fresh one", vms)
	}
	reqs = scripted(from)
	loaded, read := true, false
	for _, r := range reqs {
		if bytes.Contains(r.Body, []byte(rehydrated)) || !bytes.Contains(r.Body, []byte("I will remember periwinkle.")) {
			loaded = false
		}
		read = read || bytes.Contains(r.Body, []byte(marker))
	}
	if len(reqs) < 2 || !loaded {
		t.Errorf("after the VM host's kill -9 the new agent process did not load its session (%d requests): its home was not restored", len(reqs))
	}
	if !read {
		t.Errorf("the agent's note %s (written in the lost VM) was not in the fresh VM: the tool result does not hold %q", notePath, marker)
	}
	for _, ev := range a.events(s.ID) {
		if ev.Kind == session.KindError && ev.Seq > seq {
			t.Errorf("error event: %s", ev.raw)
		}
	}
}
