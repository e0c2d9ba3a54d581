package server_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
)

// TestServer_ModelGateway: a node with a model provider serves its gateway
// on a socket in the data dir, and a sandbox's command reaches it at
// 127.0.0.1:4180 with a token the gateway issued; the metrics show the call.
func TestServer_ModelGateway(t *testing.T) {
	up := modeltest.New(t)
	up.Push(modeltest.Text("hello through the node"))
	var dataDir string
	st := startStack(t, func(c *server.Config) {
		dataDir = c.DataDir
		c.Models.Providers = []modelgw.Provider{{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-real"}}
	})
	if fi, err := os.Stat(filepath.Join(dataDir, server.ModelSocketName)); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("model socket: %v", err)
	}
	gw := st.srv.ModelGateway()
	c := st.as("ann")
	s := c.create("models", nil)
	tok := gw.Issue(s.ID, "")
	if err := gw.Activate(tok, 1, "ann"); err != nil {
		t.Fatal(err)
	}
	script := `body='{"model":"claude-x","max_tokens":5,"messages":[]}'
exec 3<>/dev/tcp/127.0.0.1/4180 || exit 9
printf 'POST /anthropic/v1/messages HTTP/1.1\r\nHost: m\r\nx-api-key: ` + tok + `\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' "${#body}" "$body" >&3
cat <&3 | sed "s/^{/answer: {/"` // (a JSON line with a type would be an agent event)
	c.prompt(s.ID, script)
	if d := c.waitTurn(s.ID, 1); d.Status != "ok" {
		for _, ev := range c.events(s.ID, 0) {
			t.Logf("%s %s", ev.Kind, ev.Data)
		}
		t.Fatalf("turn %+v", d)
	}
	if out := outputOf(c.events(s.ID, 0), 1, "stdout"); !strings.Contains(out, "hello through the node") {
		t.Fatalf("output %q", out)
	}
	if got := up.Requests()[0].Header.Get("X-Api-Key"); got != "sk-real" {
		t.Fatalf("upstream key %q", got)
	}
	resp, err := http.Get(st.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `atrium_model_requests_total{model="claude-x",provider="anthropic",status="200"} 1`) {
		t.Fatalf("metrics lack the model call")
	}
}
