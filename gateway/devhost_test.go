package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/auth"
)

// TestGateway_DevHostCheck is issue 20's seventh finding: a dev gateway
// answered any Host header, so a page whose name its author rebound to
// 127.0.0.1 could act as any user from a victim's browser. A dev gateway
// now answers only loopback names, on every route; other identities are
// unaffected (their gateways are meant to be reached by name).
func TestGateway_DevHostCheck(t *testing.T) {
	dev := newEnv(t, func(c *gateway.Config) { c.Auth = auth.Chain(&auth.Dev{}) })
	for host, want := range map[string]int{
		"":                       http.StatusOK, // the server's own 127.0.0.1:port
		"localhost:7080":         http.StatusOK,
		"evil.example:7080":      http.StatusForbidden,
		"localhost.evil.example": http.StatusForbidden,
	} {
		for _, path := range []string{"/v1/sessions", "/"} {
			code, body := callHost(t, dev.srv.URL, path, host)
			if code != want && !(want == http.StatusOK && code != http.StatusForbidden) {
				t.Errorf("Host %q %s: %d %s, want %d", host, path, code, body, want)
			}
			if want == http.StatusForbidden && !strings.Contains(string(body), "localhost") {
				t.Errorf("Host %q: %s, want a message naming the loopback names", host, body)
			}
		}
	}
	other := newEnv(t, func(c *gateway.Config) { c.Auth = bearerAuth{} })
	if code, body := callHost(t, other.srv.URL, "/", "atrium.example.com"); code == http.StatusForbidden {
		t.Errorf("a gateway without the dev identity refused its public name: %d %s", code, body)
	}
}

// callHost GETs path from base as the dev user alice with the Host header
// host (empty: the URL's).
func callHost(t *testing.T, base, path, host string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	req.Header.Set("Authorization", "Bearer dev:alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b [4096]byte
	n, _ := resp.Body.Read(b[:])
	return resp.StatusCode, b[:n]
}
