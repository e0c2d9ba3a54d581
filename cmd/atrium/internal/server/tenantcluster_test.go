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
	"time"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/gateway/auth"
)

// TestServer_TenantClusterStatus is issue 20's fifth finding: any tenant
// admin read every tenant's session ids, leases and nodes at /v1/cluster.
// A tenant admin who is not an operator now gets only the leases of their
// own tenant's sessions.
func TestServer_TenantClusterStatus(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	srv, err := server.Start(ctx, server.Config{
		Listen: "127.0.0.1:0", DataDir: data, AuthMode: server.AuthTokens, HibernateAfter: time.Hour,
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
	key, err := auth.ReadBootstrapKey(data)
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path, bearer string, body any, out any) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, srv.URL()+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 || json.Unmarshal(rb, out) != nil {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, rb)
		}
	}
	// One session in each of two tenants, each awake (leased) after a prompt.
	ids := map[string]string{}
	for _, tenant := range []string{"acme", "globex"} {
		var tok struct{ Token string }
		call("POST", "/v1/tokens", auth.BootstrapToken(key, "admin-"+tenant, tenant), map[string]any{"name": "t"}, &tok)
		var s struct{ ID string }
		call("POST", "/v1/sessions", tok.Token, map[string]any{"title": tenant}, &s)
		var ack struct{ Seq int64 }
		call("POST", "/v1/sessions/"+s.ID+"/messages", tok.Token, map[string]any{"text": "true"}, &ack)
		ids[tenant] = s.ID
	}
	deadline := time.Now().Add(waitLong)
	for {
		full, err := srv.ClusterStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(full)
		if strings.Contains(string(b), ids["acme"]) && strings.Contains(string(b), ids["globex"]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the operator's status never showed both sessions' leases: %s", b)
		}
		time.Sleep(20 * time.Millisecond) // Polling interval.
	}
	st, err := server.TenantClusterStatusOf(srv, ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(st)
	if !strings.Contains(string(b), ids["acme"]) || strings.Contains(string(b), ids["globex"]) {
		t.Fatalf("acme's admin sees %s: want acme's session %s and not globex's %s", b, ids["acme"], ids["globex"])
	}
	for _, leak := range []string{"nats", "streams", "version", "instance"} {
		if strings.Contains(string(b), `"`+leak) {
			t.Errorf("acme's admin sees %q: %s", leak, b)
		}
	}
}
