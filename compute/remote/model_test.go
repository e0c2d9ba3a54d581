package remote_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
)

// askModel posts a Messages request to $ANTHROPIC_BASE_URL with the key in
// $ANTHROPIC_API_KEY over bash's /dev/tcp and prints the answer.
const askModel = `u=${ANTHROPIC_BASE_URL#http://}; hp=${u%%/*}; path=/${u#*/}
body='{"model":"claude-x","max_tokens":10,"messages":[]}'
exec 3<>/dev/tcp/${hp%:*}/${hp##*:} || exit 9
printf 'POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$path" "$hp" "$ANTHROPIC_API_KEY" "${#body}" "$body" >&3
cat <&3 | sed 's/^{/answer: {/'`

// TestSandbox_ModelGateway: a VM sandbox reaches the node's model gateway
// at compute.ModelAddr through the agent's tunnels, and the real key stays
// on the node.
func TestSandbox_ModelGateway(t *testing.T) {
	realKey := "sk-ant-" + string(session.NewID())
	up := modeltest.New(t)
	up.SetDefault(modeltest.Text("hello from the model"))
	gw, err := modelgw.New(modelgw.Config{Providers: []modelgw.Provider{
		{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: realKey}}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "model.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-served
	})
	for name, hook := range map[string]func(t *testing.T) remote.Hook{
		"in-process unsafe":     func(t *testing.T) remote.Hook { return newInProcessHook(t, true) },
		"in-process bubblewrap": func(t *testing.T) remote.Hook { return newInProcessHook(t, false) },
		"netns":                 func(t *testing.T) remote.Hook { requireBwrap(t); return newNetnsHook(t) },
	} {
		t.Run(name, func(t *testing.T) {
			p := newProvider(t, hook(t), remote.Config{})
			sb := computetest.Open(t, p, compute.Spec{ModelSocket: sock})
			tok := gw.Issue("s1", "")
			if err := gw.Activate(tok, 1, "ann"); err != nil {
				t.Fatal(err)
			}
			env := []string{"ANTHROPIC_BASE_URL=" + gw.Endpoints().Anthropic, "ANTHROPIC_API_KEY=" + tok}
			// Several calls in a row take several tunnels.
			for i := range 3 {
				r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"bash", "-c", askModel}, Env: env}), "")
				if !strings.Contains(r.Stdout, "HTTP/1.1 200") || !strings.Contains(r.Stdout, `"text":"hello from the model"`) {
					t.Fatalf("call %d: answer %q (stderr %q)", i, r.Stdout, r.Stderr)
				}
			}
			r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{
				Argv: []string{"bash", "-c", `k=$1$2; env | grep -F -- "$k" && echo LEAK; echo checked`, "bash", realKey[:10], realKey[10:]}}), "")
			if strings.Contains(r.Stdout, "LEAK") || !strings.Contains(r.Stdout, "checked") {
				t.Fatalf("leak check %q", r.Stdout)
			}
		})
	}
	for _, r := range up.Requests() {
		if r.Header.Get("X-Api-Key") != realKey {
			t.Fatalf("upstream got key %q", r.Header.Get("X-Api-Key"))
		}
	}
}
