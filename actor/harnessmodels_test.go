package actor

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
	"github.com/atriumhq/atrium/session"
)

// askModelScript posts a Messages request to $ANTHROPIC_BASE_URL with the
// key $KEY (default $ANTHROPIC_API_KEY) over bash's /dev/tcp and prints the
// answer, each line quoted (a JSON line is a harness object).
const askModelScript = `k=${KEY:-$ANTHROPIC_API_KEY}; u=${ANTHROPIC_BASE_URL#http://}; hp=${u%%/*}; path=/${u#*/}
body='{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'
exec 3<>/dev/tcp/${hp%:*}/${hp##*:} || exit 9
printf 'POST %s/v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: %s\r\nanthropic-version: 2023-06-01\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$path" "$hp" "$k" "${#body}" "$body" >&3
cat <&3 | sed 's/^/> /'; echo  # a JSON line would be a harness object
`

// TestHost_HarnessModels: a harness turn reaches the node's real model
// gateway (in front of a scripted model) with a token of its own, in the
// vendors' environment variables; the token ends with the turn.
func TestHost_HarnessModels(t *testing.T) {
	up := modeltest.New(t)
	up.SetDefault(modeltest.Text("hello from the model"))
	gw, err := modelgw.New(modelgw.Config{Providers: []modelgw.Provider{
		{Name: "anthropic", Kind: modelgw.KindAnthropic, BaseURL: up.URL, APIKey: "sk-ant-upstream"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "model.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})

	e := newEnv(t, func(c *Config) { c.Models = gw; c.SandboxSpec.ModelSocket = sock })
	id := e.create("alice", shell())
	w := e.watch(id)

	// Turn 1 asks the model and keeps its token in the workspace.
	e.prompt(id, "alice", `printf %s "$ANTHROPIC_API_KEY" > /workspace/tok; env | grep -E '^(ANTHROPIC|OPENAI|GOOGLE_GEMINI|GEMINI)_' | cut -d= -f1 | sort | tr '\n' ' '; echo; `+askModelScript)
	if fin := data[session.TurnFinishedData](t, w.until("turn 1", finished(1))); fin.Status != session.TurnOK {
		t.Fatalf("turn 1 %+v\n%s", fin, outputText(t, w.evs, 1, "stderr"))
	}
	out := outputText(t, w.evs, 1, "stdout")
	if !strings.Contains(out, "HTTP/1.1 200") || !strings.Contains(out, "hello from the model") {
		t.Fatalf("turn 1's answer from the model: %q", out)
	}
	if !strings.Contains(out, "ANTHROPIC_API_KEY ANTHROPIC_BASE_URL") {
		t.Fatalf("turn 1's model environment: %q", out)
	}
	if strings.Contains(out, "sk-ant-upstream") {
		t.Fatalf("the provider's key reached the harness: %q", out)
	}

	// Turn 2 gets a new token that works; turn 1's no longer does.
	e.prompt(id, "alice", askModelScript+`echo; echo OLD; KEY=$(cat /workspace/tok); `+askModelScript+`echo; [ "$KEY" != "$ANTHROPIC_API_KEY" ] && echo NEW-TOKEN`)
	if fin := data[session.TurnFinishedData](t, w.until("turn 2", finished(2))); fin.Status != session.TurnOK {
		t.Fatalf("turn 2 %+v\n%s", fin, outputText(t, w.evs, 2, "stderr"))
	}
	out = outputText(t, w.evs, 2, "stdout")
	now, old, ok := strings.Cut(out, "OLD")
	if !ok || !strings.Contains(now, "HTTP/1.1 200") || !strings.Contains(old, "NEW-TOKEN") {
		t.Fatalf("turn 2: %q", out)
	}
	if strings.Contains(old, "HTTP/1.1 200") || strings.Contains(old, "hello from the model") {
		t.Fatalf("turn 1's token still reaches the model in turn 2: %q", old)
	}
}
