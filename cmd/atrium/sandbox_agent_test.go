package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
)

func TestSandboxAgent_RefusesWithoutToken(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no listen", []string{"sandbox-agent"}, nil, "--listen is required"},
		{"no token", []string{"sandbox-agent", "--listen", "127.0.0.1:0"}, nil, "no token"},
		{"short token", []string{"sandbox-agent", "--listen", "127.0.0.1:0"}, map[string]string{agentTokenEnv: "short"}, "shorter than 16"},
		{"short token file", []string{"sandbox-agent", "--listen", "127.0.0.1:0", "--token-file", short}, nil, "shorter than 16"},
		{"missing token file", []string{"sandbox-agent", "--listen", "127.0.0.1:0", "--token-file", "/nonexistent"}, nil, "read token"},
		{"half TLS", []string{"sandbox-agent", "--listen", "127.0.0.1:0", "--tls-cert", "c.pem"}, nil, "go together"},
		{"bad upstream proxy", []string{"sandbox-agent", "--listen", "127.0.0.1:0", "--upstream-proxy", "socks5://10.0.2.100:1080"},
			map[string]string{agentTokenEnv: "0123456789abcdef0123"}, "--upstream-proxy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), tc.args, strings.NewReader(""), &out, &errb, func(k string) string { return tc.env[k] })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want it to say %q", err, tc.want)
			}
		})
	}
}

func TestSandboxAgent_Serves(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var errb bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"sandbox-agent", "--listen", addr, "--dir", t.TempDir(), "--unsafe-no-sandbox"},
			strings.NewReader(""), &bytes.Buffer{}, &errb,
			func(k string) string { return map[string]string{agentTokenEnv: "0123456789abcdef"}[k] })
	}()
	var health compute.AgentHealth
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&health)
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never answered: %v\n%s", err, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if health.Version == "" {
		t.Errorf("health %+v", health)
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/sandbox/sleep", nil)
	req.Header.Set("Authorization", "Bearer 0123456789abcdef")
	req.Header.Set(compute.AgentFenceHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("sleep before open: %d, want 404 (authenticated, no sandbox)", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the agent did not stop")
	}
	if !strings.Contains(errb.String(), "sandbox agent stopped") {
		t.Errorf("log:\n%s", errb.String())
	}
}
