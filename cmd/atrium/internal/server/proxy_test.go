package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/auth"
)

// TestServer_BehindTrustedProxy is issue 20's second finding end to end:
// behind an ingress, one outsider's bad credentials gave every user 429 and
// every audit entry's remote was the ingress. With trusted_proxies, the
// client is read from X-Forwarded-For: the outsider is throttled alone, a
// valid credential is never refused, and the audit log names the client.
func TestServer_BehindTrustedProxy(t *testing.T) {
	t.Parallel()
	proxies, err := auth.ParseTrustedProxies([]string{"127.0.0.0/8"}) // the test's "ingress" is loopback
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	srv, err := server.Start(ctx, server.Config{
		Listen: "127.0.0.1:0", DataDir: data, AuthMode: server.AuthTokens, TrustedProxies: proxies,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		srv.Close(ctx)
	})
	call := func(method, path, client, bearer string, body any) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, srv.URL()+path, rd)
		req.Header.Set("X-Forwarded-For", client)
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	key, err := auth.ReadBootstrapKey(data)
	if err != nil {
		t.Fatal(err)
	}
	code, body := call("POST", "/v1/tokens", "198.51.100.2", auth.BootstrapToken(key, "admin", ""), map[string]any{"name": "admin"})
	var made struct{ Token string }
	if code != http.StatusCreated && code != http.StatusOK || json.Unmarshal(body, &made) != nil || made.Token == "" {
		t.Fatalf("bootstrap token: %d %s", code, body)
	}
	forged := made.Token[:len(made.Token)-4] + "aaaa"
	for range 12 {
		call("GET", "/v1/sessions", "203.0.113.9", forged, nil)
	}
	if code, body := call("GET", "/v1/sessions", "203.0.113.9", forged, nil); code != http.StatusTooManyRequests {
		t.Fatalf("the outsider's 13th bad request: %d %s, want 429", code, body)
	}
	if code, body := call("GET", "/v1/sessions", "198.51.100.2", made.Token, nil); code != http.StatusOK {
		t.Fatalf("another client behind the same proxy: %d %s", code, body)
	}
	if code, body := call("GET", "/v1/sessions", "203.0.113.9", made.Token, nil); code != http.StatusOK {
		t.Fatalf("a valid credential from the throttled client: %d %s", code, body)
	}
	code, body = call("GET", "/v1/audit?action=auth_failed&limit=50", "198.51.100.2", made.Token, nil)
	var page struct {
		Entries []struct{ Remote, Action string }
	}
	if code != http.StatusOK || json.Unmarshal(body, &page) != nil || len(page.Entries) == 0 {
		t.Fatalf("audit: %d %s", code, body)
	}
	for _, e := range page.Entries {
		if e.Remote != "203.0.113.9" {
			t.Fatalf("audit entry %+v: remote is not the client behind the proxy\n%s", e, body)
		}
	}
	if strings.Contains(string(body), `"remote":"127.0.0.1"`) {
		t.Fatalf("the audit log names the proxy: %s", body)
	}
}
