package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/hooks"
	"github.com/atriumhq/atrium/session"
)

// TestChannels_WebhookEndToEnd wires a configuration file's channels section
// through serverConfig into the real server: a signed webhook becomes a
// prompt that the node runs in a real sandbox, a replay with the same
// Idempotency-Key does nothing more, and a forged signature is refused.
func TestChannels_WebhookEndToEnd(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "atrium.yaml")
	os.WriteFile(cfgPath, []byte(`
listen: 127.0.0.1:0
data_dir: `+filepath.Join(dir, "data")+`
auth: {mode: tokens}
channels:
  hooks:
    - name: ci
      secret_env: TEST_HOOK_SECRET
      user: ci-bot
      tenant: acme
      prompt: "echo build {{.build}} failed"
      title: "CI {{.repo}}"
      session_key: "{{.repo}}"
`), 0o600)
	const secret = "a-very-long-webhook-secret"
	getenv := func(k string) string {
		if k == "TEST_HOOK_SECRET" {
			return secret
		}
		return ""
	}
	f, err := config.Load(cfgPath, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(false); err != nil {
		t.Fatal(err)
	}
	cfg, err := serverConfig(f, &lockedBuffer{}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Close(ctx)
	})

	post := func(body, sig, key string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL()+"/v1/hooks/ci", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Atrium-Signature", sig)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	body := `{"repo":"atrium","build":"8812"}`
	if code, v := post(body, hooks.Sign([]byte("not-the-secret-at-all"), time.Now(), []byte(body)), ""); code != http.StatusUnauthorized {
		t.Fatalf("forged signature: %d %v", code, v)
	}
	sig := hooks.Sign([]byte(secret), time.Now(), []byte(body))
	code, first := post(body, sig, "build-8812")
	if code != http.StatusAccepted || first["session"] == nil {
		t.Fatalf("signed webhook: %d %v", code, first)
	}
	if code, again := post(body, sig, "build-8812"); code != http.StatusAccepted || again["seq"] != first["seq"] {
		t.Fatalf("replay with the same key: %d %v, first %v", code, again, first)
	}

	// The node ran the prompt in the sandbox, as ci-bot, exactly once.
	id := first["session"].(string)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out bytes.Buffer
		events := nodeHistory(t, srv, session.Principal{User: "ci-bot", Tenant: "acme"}, session.ID(id))
		n, finished := 0, false
		for _, e := range events {
			if e["kind"] == "message" {
				n++
				if e["by"] != "ci-bot" {
					t.Fatalf("prompt by %v, want ci-bot", e["by"])
				}
			}
			if e["kind"] == "output" {
				out.WriteString(e["data"].(map[string]any)["text"].(string))
			}
			if e["kind"] == "turn_finished" {
				finished = true
			}
		}
		if finished {
			if n != 1 || !strings.Contains(out.String(), "build 8812 failed") {
				t.Fatalf("%d prompts, output %q", n, out.String())
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no turn_finished; history %v", events)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeHistory reads a session's history from its node over NATS, as p
// (the server is in API-token mode and ci-bot has no token).
func nodeHistory(t *testing.T, srv *server.Server, p session.Principal, id session.ID) []map[string]any {
	t.Helper()
	body, _ := json.Marshal(session.Command{Op: session.OpHistory, Limit: 1000})
	msg := &nats.Msg{Subject: session.Subjects{}.Cmd(id), Data: body, Header: nats.Header(p.Headers())}
	resp, err := srv.NATS().RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r session.Reply
	if err := json.Unmarshal(resp.Data, &r); err != nil || r.Err() != nil {
		t.Fatalf("history: %v %v", err, r.Err())
	}
	out := make([]map[string]any, len(r.Events))
	for i, raw := range r.Events {
		json.Unmarshal(raw, &out[i])
	}
	return out
}
