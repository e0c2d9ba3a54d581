package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// agentTurnWait bounds a real agent's turn: a cold start (or a restore of
// its home and a session/load) on a loaded machine, and a model call.
const agentTurnWait = 3 * time.Minute

// requireCachedClaude skips the test loudly (fails it in CI) when the
// pinned Claude Code adapter is not in the agents cache .ci/deps fills,
// and returns the cache directory.
func requireCachedClaude(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("ATRIUM_AGENTS_CACHE")
	if dir == "" {
		dir = "/var/cache/atrium-agents"
	}
	cat, err := agents.New(agents.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := cat.Spec("claude")
	if in, err := cat.Lookup("claude"); err != nil || in.Version != spec.Version {
		msg := fmt.Sprintf("SKIPPING REAL-AGENT TEST: claude %s is not in the agents cache %s (run .ci/deps): %v", spec.Version, dir, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// TestCluster_ClaudeAgentKillOwner runs the real Claude Code (its ACP
// adapter from npm, in a bubblewrap sandbox) as a session's agent on a
// two-node cluster, against a scripted Anthropic API. After turn 1 the
// owning node is killed with SIGKILL (with its sandboxes, as a machine's
// death would); the other node takes the session over and runs turn 2.
// The model's request for turn 2 must carry turn 1's prompt and answer as
// the model's own earlier messages, without the re-hydration transcript's
// marker: the agent home saved at the end of turn 1 (after Claude Code
// wrote the answer into its transcript: actor/agenthomeflush.go) was
// restored on the new node and the agent resumed by session/load (issue 15
// item 3).
func TestCluster_ClaudeAgentKillOwner(t *testing.T) {
	cache := requireCachedClaude(t)
	up := modeltest.New(t)
	up.Match(modeltest.HasTools) // Claude Code's side requests (titles) get the default answer.
	const key = "sk-cluster-upstream"
	t.Setenv("V15_TEST_ANTHROPIC_KEY", key)

	// A lease TTL above the harness's 2 s: a node starting Claude Code on
	// a loaded machine once failed to renew a 2 s lease in time.
	c := StartCluster(t, Options{Gateways: 1, Nodes: 2, Direct: true, LeaseTTL: 5 * time.Second})
	// The nodes again, with the agents (the cache as <data>/agents) and
	// a model provider: the harness's configuration has neither.
	for _, p := range c.Nodes {
		p.Terminate()
		if err := os.Symlink(cache, filepath.Join(p.dataDir, "agents")); err != nil {
			t.Fatal(err)
		}
		cfg, err := os.ReadFile(p.cfgPath)
		if err != nil {
			t.Fatal(err)
		}
		p.writeConfig(string(cfg) + "agent_mode: auto\nmodels:\n  providers:\n    - name: anthropic\n      kind: anthropic\n" +
			"      base_url: " + up.URL + "\n      api_key_env: V15_TEST_ANTHROPIC_KEY\n")
		p.Restart()
	}

	gw := c.Gateways[0].URL
	var s session.Session
	call(t, gw, "POST", "/v1/sessions", map[string]any{"title": "claude takeover", "agent": "claude"}, http.StatusCreated, &s)

	up.Push(modeltest.Tool("Write", map[string]any{"file_path": "/workspace/hello.txt", "content": "hello from claude\n"}),
		modeltest.Text("I wrote hello.txt and will remember periwinkle."))
	call(t, gw, "POST", "/v1/sessions/"+string(s.ID)+"/messages", map[string]any{"text": "Write hello.txt and remember the word periwinkle."}, http.StatusAccepted, nil)
	if st := waitAgentTurn(t, gw, s.ID, 1); st != string(session.TurnOK) {
		t.Fatalf("turn 1 finished %s, want ok", st)
	}

	ctx := t.Context()
	lease, ok, err := c.LeaseOf(ctx, s.ID)
	if err != nil || !ok {
		t.Fatalf("lease of the active session %s: %+v, held %v, %v", s.ID, lease, ok, err)
	}
	owner := c.Node(lease.Node)
	owner.Kill()
	t.Logf("killed the owner %s right after turn 1", owner.Name)

	n := len(up.Requests())
	up.Push(modeltest.Text("You asked me to write hello.txt and remember periwinkle."))
	begin := time.Now()
	// The gateway answers 503 until the other node holds the session.
	deadline := time.Now().Add(waitBound)
	for {
		code, body := do(t, gw, "POST", "/v1/sessions/"+string(s.ID)+"/messages", map[string]any{"text": "What did I ask you in the first turn?", "client_id": "v15-turn-2"})
		if code == http.StatusAccepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prompt after the kill: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond) // Polling interval, not synchronization.
	}
	next := c.WaitOwner(s.ID, owner.Name)
	if st := waitAgentTurn(t, gw, s.ID, 2); st != string(session.TurnOK) {
		t.Fatalf("turn 2 on %s finished %s, want ok", next.Node, st)
	}
	t.Logf("turn 2 on %s finished %v after the kill", next.Node, time.Since(begin).Round(time.Millisecond))

	var carried, rehydrated, answer bool
	for _, r := range up.Requests()[n:] {
		if !r.Scripted || !bytes.Contains(r.Body, []byte("What did I ask you in the first turn?")) {
			continue
		}
		carried = bytes.Contains(r.Body, []byte("remember the word periwinkle"))
		rehydrated = bytes.Contains(r.Body, []byte("could not load this conversation"))
		answer = bytes.Contains(r.Body, []byte("I wrote hello.txt and will remember periwinkle."))
		if got := r.Header.Get("X-Api-Key"); got != key {
			t.Errorf("the model request carried key %q, want the configured key", got)
		}
	}
	switch {
	case !carried:
		t.Fatalf("the model's request for turn 2 on %s does not carry turn 1's prompt: the conversation was not continued", next.Node)
	case rehydrated:
		t.Errorf("turn 2 on %s re-hydrated the conversation instead of loading it: the agent home saved at turn 1's end was not restored, or Claude Code could not load it", next.Node)
	case !answer:
		t.Errorf("turn 2 on %s loaded a conversation without turn 1's answer: the agent home was saved before Claude Code wrote the answer into its transcript", next.Node)
	}
}

// do sends a JSON request to the gateway at base as the test user and
// returns the status and body.
func do(t *testing.T, base, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer dev:"+testUser)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// call is do that requires status want and decodes the answer into out.
func call(t *testing.T, base, method, path string, body any, want int, out any) {
	t.Helper()
	code, b := do(t, base, method, path, body)
	if code != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, code, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}

// waitAgentTurn polls the session's history until turn n finished and
// returns its status; it fails the test after agentTurnWait.
func waitAgentTurn(t *testing.T, base string, id session.ID, n int64) string {
	t.Helper()
	deadline := time.Now().Add(agentTurnWait)
	var last []byte
	for time.Now().Before(deadline) {
		code, b := do(t, base, "GET", "/v1/sessions/"+string(id)+"/events?after=0&limit=1000", nil)
		if code == http.StatusOK {
			last = b
			var page struct {
				Events []session.Event `json:"events"`
			}
			if err := json.Unmarshal(b, &page); err != nil {
				t.Fatalf("events: %v", err)
			}
			for _, ev := range page.Events {
				if ev.Kind != session.KindTurnFinished {
					continue
				}
				var d struct {
					Turn   int64  `json:"turn"`
					Status string `json:"status"`
				}
				if json.Unmarshal(ev.Data, &d) == nil && d.Turn == n {
					if d.Status != string(session.TurnOK) {
						t.Logf("history:\n%s", strings.ReplaceAll(string(b), "},{", "},\n{"))
					}
					return d.Status
				}
			}
		}
		time.Sleep(200 * time.Millisecond) // Polling interval, not synchronization.
	}
	t.Fatalf("session %s: turn %d did not finish within %v; history:\n%s", id, n, agentTurnWait, last)
	return ""
}
