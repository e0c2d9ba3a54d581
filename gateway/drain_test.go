package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
	"github.com/atriumhq/atrium/session"
)

// TestServer_Drain: a draining gateway closes every WebSocket with 1012
// "reconnect" (so clients resume on another gateway), ends SSE streams, and
// stops being ready.
func TestServer_Drain(t *testing.T) {
	e := newEnv(t)
	s := e.create("alice", "drain")
	ws1 := e.dial(s.ID, "alice", 0)
	ws1.nextOf(session.FrameHello)
	ws2 := e.dial(s.ID, "alice", 0)
	ws2.nextOf(session.FrameHello)
	sse := e.stream(s.ID, "alice", nil, "")
	sse.next()
	done := make(chan error, 1)
	go func() { // owned: the result is received below.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		done <- e.gw.Drain(ctx)
	}()
	for i, c := range []*wsClient{ws1, ws2} {
		if ce := c.closed(); ce.Code != websocket.StatusServiceRestart || ce.Reason != "reconnect" {
			t.Fatalf("websocket %d closed with %v, want 1012 reconnect", i+1, ce)
		}
	}
	sse.ended()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code, body := e.call("GET", "/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz after drain: %d %s", code, body)
	}
	if code, body := e.call("GET", "/v1/sessions/"+string(s.ID)+"/ws", "alice", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("a new WebSocket during drain: %d %s, want 503", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := e.gw.Drain(ctx); err != nil {
		t.Fatalf("drain twice: %v", err)
	}
}

// bearerAuth authenticates "Bearer <user>" as the principal of that user.
type bearerAuth map[string]session.Principal

func (a bearerAuth) Authenticate(r *http.Request) (session.Principal, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if p, known := a[tok]; ok && known {
		return p, nil
	}
	return session.Principal{}, session.Errorf(session.CodeUnauthenticated, "unknown bearer")
}

var _ auth.Authenticator = bearerAuth(nil)

func TestServer_ClusterRoute(t *testing.T) {
	status := map[string]any{"nodes": []any{map[string]any{"id": "node-a"}}}
	var fail atomic.Pointer[error] // set by the test, read by the handler
	e := newEnv(t, func(c *gateway.Config) {
		c.Auth = bearerAuth{
			"admin":    {User: "ada", Tenant: "acme", Admin: true, Operator: true, Via: session.ViaOIDC},
			"tenantad": {User: "tia", Tenant: "globex", Admin: true, Via: session.ViaOIDC},
			"bob":      {User: "bob", Tenant: "acme", Via: session.ViaOIDC},
		}
		c.ClusterStatus = func(context.Context) (any, error) {
			if err := fail.Load(); err != nil {
				return nil, *err
			}
			return status, nil
		}
		c.TenantClusterStatus = func(_ context.Context, tenant string) (any, error) {
			return map[string]any{"tenant": tenant, "nodes": []any{}}, nil
		}
	})
	get := func(bearer string) (int, []byte) {
		return callURL(t, e.srv.URL, "GET", "/v1/cluster", "", nil, http.Header{"Authorization": {"Bearer " + bearer}})
	}
	code, body := get("admin")
	var got map[string]any
	if code != http.StatusOK || json.Unmarshal(body, &got) != nil || !strings.Contains(string(body), `"node-a"`) {
		t.Fatalf("admin: %d %s", code, body)
	}
	if code, body := get("bob"); code != http.StatusForbidden || errCode(t, body) != session.CodeForbidden {
		t.Fatalf("non-admin: %d %s, want 403 forbidden", code, body)
	}
	// Issue 20, finding 5: a tenant admin saw every tenant's sessions,
	// leases and nodes. Now only an operator does; a tenant admin gets
	// the tenant's own part.
	if code, body := get("tenantad"); code != http.StatusOK || strings.Contains(string(body), "node-a") ||
		!strings.Contains(string(body), `"tenant":"globex"`) {
		t.Fatalf("tenant admin: %d %s, want only globex's part", code, body)
	}
	if code, body := get("nobody"); code != http.StatusUnauthorized {
		t.Fatalf("unauthenticated: %d %s, want 401", code, body)
	}
	var unavailable error = session.Errorf(session.CodeUnavailable, "not connected to NATS")
	fail.Store(&unavailable)
	if code, body := get("admin"); code != http.StatusServiceUnavailable || errCode(t, body) != session.CodeUnavailable {
		t.Fatalf("status failing: %d %s, want 503 unavailable", code, body)
	}
	boom := errors.New("boom")
	fail.Store(&boom)
	if code, body := get("admin"); code != http.StatusInternalServerError {
		t.Fatalf("status failing: %d %s, want 500", code, body)
	}

	t.Run("absent without ClusterStatus", func(t *testing.T) {
		e := newEnv(t)
		if code, body := e.call("GET", "/v1/cluster", "alice", nil); code != http.StatusNotFound {
			t.Fatalf("GET /v1/cluster: %d %s, want 404", code, body)
		}
	})
}
