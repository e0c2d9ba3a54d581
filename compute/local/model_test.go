package local

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
	"github.com/atriumhq/atrium/session"
)

// realModelKey is made at run time, so that not even the test binary (the
// sandbox's forwarder) holds it.
var realModelKey = "sk-ant-" + string(session.NewID())

// modelGateway serves a model gateway, in front of a scripted model, on a
// Unix socket; it returns the socket's path.
func modelGateway(t *testing.T) (*modelgw.Gateway, *modeltest.Server, string) {
	t.Helper()
	return modelGatewayAt(t, filepath.Join(t.TempDir(), "model.sock"))
}

// modelGatewayAt is modelGateway with its socket at sock.
func modelGatewayAt(t *testing.T, sock string) (*modelgw.Gateway, *modeltest.Server, string) {
	t.Helper()
	up := modeltest.New(t)
	gw, err := modelgw.New(modelgw.Config{Providers: []modelgw.Provider{
		{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: realModelKey},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	return gw, up, sock
}

// askModel is a bash script that posts a Messages request to the gateway
// at $ANTHROPIC_BASE_URL with the key in $ANTHROPIC_API_KEY, using bash's
// /dev/tcp, and prints the answer.
const askModel = `u=${ANTHROPIC_BASE_URL#http://}; hp=${u%%/*}; path=/${u#*/}
body='{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'
exec 3<>/dev/tcp/${hp%:*}/${hp##*:} || exit 9
printf 'POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\nanthropic-version: 2023-06-01\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$path" "$hp" "$ANTHROPIC_API_KEY" "${#body}" "$body" >&3
cat <&3`

// leakCheck looks for the real key everywhere a sandboxed program could:
// its environment, every process's environment and command line, and the
// files it can write or that the node put there. The key comes in two
// halves, so that the check's own command line does not hold it.
const leakCheck = `k=$1$2
env | grep -F -- "$k" && echo LEAK-ENV
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -aF -- "$k" "$f" >/dev/null 2>&1 && echo "LEAK $f"; done
grep -rlF -- "$k" /workspace /run /tmp /etc 2>/dev/null && echo LEAK-FILE
echo checked`

func TestSandbox_ModelGateway(t *testing.T) {
	gw, up, sock := modelGateway(t)
	up.SetDefault(modeltest.Text("hello from the model"))
	for name, cfg := range map[string]struct {
		spec     compute.Spec
		noZygote bool // every command starts its own bubblewrap
	}{
		"no network":             {compute.Spec{ModelSocket: sock}, false},
		"with egress":            {compute.Spec{ModelSocket: sock, Egress: []string{"allowed.test"}}, false},
		"bubblewrap per command": {compute.Spec{ModelSocket: sock}, true},
	} {
		t.Run(name, func(t *testing.T) {
			p := newTestProvider(t, Config{})
			if cfg.noZygote {
				p.mu.Lock()
				p.zygote = -1
				p.mu.Unlock()
			}
			sb := computetest.Open(t, p, cfg.spec)
			tok := gw.Issue("s1", "")
			if err := gw.Activate(tok, 1, "ann"); err != nil {
				t.Fatal(err)
			}
			e := gw.Endpoints()
			env := []string{"ANTHROPIC_BASE_URL=" + e.Anthropic, "ANTHROPIC_API_KEY=" + tok}
			r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"bash", "-c", askModel}, Env: env}), "")
			if !strings.Contains(r.Stdout, "HTTP/1.1 200") || !strings.Contains(r.Stdout, `"text":"hello from the model"`) {
				t.Fatalf("answer %q (stderr %q)", r.Stdout, r.Stderr)
			}
			reqs := up.Requests()
			if got := reqs[len(reqs)-1].Header.Get("X-Api-Key"); got != realModelKey {
				t.Fatalf("upstream got key %q", got)
			}
			r = computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{
				Argv: []string{"bash", "-c", leakCheck, "bash", realModelKey[:10], realModelKey[10:]}, Env: env}), "")
			if strings.Contains(r.Stdout, "LEAK") || !strings.Contains(r.Stdout, "checked") {
				t.Fatalf("leak check: %q (stderr %q)", r.Stdout, r.Stderr)
			}
			if z := sb.(*Sandbox).m.zyg; (z == nil) != cfg.noZygote {
				t.Fatalf("zygote %v, want none: %v", z != nil, cfg.noZygote)
			}
			// The check finds what is there: the token, in the environment.
			r = computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{
				Argv: []string{"bash", "-c", leakCheck, "bash", tok[:10], tok[10:]}, Env: env}), "")
			if !strings.Contains(r.Stdout, "LEAK-ENV") {
				t.Fatalf("leak check misses the token: %q", r.Stdout)
			}
			// Once the turn ends the token is refused, in Anthropic's shape.
			gw.Deactivate(tok)
			r = computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"bash", "-c", askModel}, Env: env}), "")
			if !strings.Contains(r.Stdout, "HTTP/1.1 401") || !strings.Contains(r.Stdout, "authentication_error") {
				t.Fatalf("answer after the turn %q", r.Stdout)
			}
		})
	}
}

func TestSandbox_ModelGatewayUnsafe(t *testing.T) {
	gw, up, sock := modelGateway(t)
	up.Push(modeltest.Text("hello from the model"))
	p := newTestProvider(t, Config{Unsafe: true})
	sb := computetest.Open(t, p, compute.Spec{ModelSocket: sock})
	tok := gw.Issue("s1", "")
	if err := gw.Activate(tok, 1, "ann"); err != nil {
		t.Fatal(err)
	}
	env := []string{"ANTHROPIC_BASE_URL=" + gw.Endpoints().Anthropic, "ANTHROPIC_API_KEY=" + tok}
	r := computetest.Finish(t, computetest.Start(t, sb, compute.ExecRequest{
		Argv: []string{"bash", "-c", `case $ANTHROPIC_BASE_URL in *` + compute.ModelAddr + `*) echo not rewritten; exit 1;; esac; ` + askModel},
		Env:  env}), "")
	if !strings.Contains(r.Stdout, `"text":"hello from the model"`) {
		t.Fatalf("answer %q (stderr %q)", r.Stdout, r.Stderr)
	}
}

func TestSandbox_ModelSocketBad(t *testing.T) {
	p := newTestProvider(t, Config{})
	for name, sock := range map[string]string{"relative": "model.sock", "missing": filepath.Join(t.TempDir(), "none.sock"),
		"not a socket": t.TempDir()} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID(), Fence: 1, ModelSocket: sock})
			if err == nil {
				t.Fatal("opened")
			}
		})
	}
}
