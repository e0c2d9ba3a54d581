package remote_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/computetest"
	"github.com/atriumhq/atrium/compute/remote"
	"github.com/atriumhq/atrium/session"
)

// badTokenHook hands out VMs with a token their agent does not accept.
type badTokenHook struct{ remote.Hook }

func (h badTokenHook) CreateVM(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	vm, err := h.Hook.CreateVM(ctx, req)
	vm.Token = "wrong-" + vm.Token
	return vm, err
}

func TestAgent_BadToken(t *testing.T) {
	hook := newNetnsHook(t, "--unsafe-no-sandbox")
	p := newProvider(t, badTokenHook{hook}, remote.Config{})
	_, err := p.Open(context.Background(), compute.Spec{Session: session.NewID()})
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "token") {
		t.Fatalf("open with a wrong token: %v; want unavailable, about the token", err)
	}
	vm := hook.created()[0].vm
	if !hook.isDestroyed(vm.ID) {
		t.Errorf("the VM that refused the token was not destroyed")
	}
}

func TestAgent_Unauthenticated(t *testing.T) {
	hook := newNetnsHook(t, "--unsafe-no-sandbox")
	p := newProvider(t, hook, remote.Config{})
	computetest.Open(t, p, compute.Spec{})
	vm := hook.created()[0].vm
	base := "http://" + vm.Addr
	for _, tc := range []struct {
		name, method, path, auth string
		want                     int
	}{
		{"health needs no token", "GET", "/healthz", "", http.StatusOK},
		{"no token", "GET", "/v1/files/x", "", http.StatusUnauthorized},
		{"wrong token", "POST", "/v1/sandbox/sleep", "Bearer nope", http.StatusUnauthorized},
		{"token of another scheme", "GET", "/v1/exec", "Basic " + vm.Token, http.StatusUnauthorized},
		{"token but no fence", "GET", "/v1/files/x", "Bearer " + vm.Token, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.want)
			}
			if tc.want == http.StatusUnauthorized {
				var e struct{ Error session.Error }
				if json.Unmarshal(body, &e) != nil || e.Error.Code != session.CodeUnauthenticated {
					t.Errorf("body %s: want an unauthenticated error", body)
				}
				if resp.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("401 without WWW-Authenticate")
				}
			}
		})
	}
	http.DefaultClient.CloseIdleConnections()
}

// sharedHook hands out one VM per session, as a hook that finds the VM a
// session already has: a new owner of the session reaches the same agent.
type sharedHook struct {
	remote.Hook
	mu  sync.Mutex
	vms map[session.ID]remote.VM
}

func (h *sharedHook) CreateVM(ctx context.Context, req remote.HookRequest) (remote.VM, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if vm, ok := h.vms[req.Session]; ok {
		return vm, nil
	}
	vm, err := h.Hook.CreateVM(ctx, req)
	if err == nil {
		h.vms[req.Session] = vm
	}
	return vm, err
}

func TestAgent_StaleFence(t *testing.T) {
	hook := &sharedHook{Hook: newNetnsHook(t, "--unsafe-no-sandbox"), vms: make(map[session.ID]remote.VM)}
	ctx := context.Background()
	id := session.NewID()
	// Two nodes: the first owns the session with fence 5, then the second
	// takes it over with fence 6 and reaches the same VM.
	node1 := newProvider(t, hook, remote.Config{})
	node2 := newProvider(t, hook, remote.Config{})
	old, err := node1.Open(ctx, compute.Spec{Session: id, Fence: 5})
	if err != nil {
		t.Fatal(err)
	}
	running := startRunning(t, old)
	cur := computetest.Open(t, node2, compute.Spec{Session: id, Fence: 6})

	if _, err := old.Exec(ctx, compute.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, session.ErrConflict) ||
		!strings.Contains(err.Error(), "newer owner") {
		t.Errorf("exec by the old owner: %v; want conflict, newer owner", err)
	}
	if err := old.Sleep(ctx); !errors.Is(err, session.ErrConflict) {
		t.Errorf("sleep by the old owner: %v; want conflict", err)
	}
	if _, err := node1.Open(ctx, compute.Spec{Session: id, Fence: 5}); !errors.Is(err, session.ErrConflict) {
		t.Errorf("open by the old owner: %v; want conflict", err)
	}
	if err := old.(*remote.Sandbox).WriteFile(ctx, "f", strings.NewReader("x"), 0o644); !errors.Is(err, session.ErrConflict) {
		t.Errorf("file write by the old owner: %v; want conflict", err)
	}
	// A command the old owner started before the takeover still ends
	// normally when the new owner stops it.
	if got := computetest.ShOK(t, cur, "echo ok"); got != "ok\n" {
		t.Errorf("new owner: %q", got)
	}
	if err := running.Signal(9); err != nil {
		t.Errorf("signal: %v", err)
	}
	_, _ = io.Copy(io.Discard, running.Stdout())
	_, _ = io.Copy(io.Discard, running.Stderr())
	if exit, err := running.Wait(); err != nil || exit.Lost {
		t.Errorf("old command: %+v, %v", exit, err)
	}
}

func TestSandbox_Files(t *testing.T) {
	hook := newNetnsHook(t)
	requireBwrap(t)
	p := newProvider(t, hook, remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{}).(*remote.Sandbox)
	ctx := context.Background()

	big := make([]byte, 5<<20+17)
	_, _ = rand.Read(big)
	if err := sb.WriteFile(ctx, "dir/sub/tool.sh", strings.NewReader("#!/bin/sh\necho tool ran\n"), 0o755); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := sb.WriteFile(ctx, "big.bin", bytes.NewReader(big), 0o600); err != nil {
		t.Fatalf("write big: %v", err)
	}
	if got := computetest.ShOK(t, sb, "./dir/sub/tool.sh && stat -c %a dir/sub/tool.sh big.bin && wc -c < big.bin"); got != "tool ran\n755\n600\n5242897\n" {
		t.Errorf("in the sandbox: %q", got)
	}
	computetest.ShOK(t, sb, "printf 'from the sandbox' > out.txt && ln -s / root && ln -s ../.. up && ln -s out.txt link && mkdir d")
	rc, err := sb.ReadFile(ctx, "out.txt")
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "from the sandbox" {
		t.Errorf("read %q", b)
	}
	rc, err = sb.ReadFile(ctx, "big.bin")
	if err != nil {
		t.Fatalf("read big: %v", err)
	}
	b, _ = io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(b, big) {
		t.Errorf("read back %d bytes that differ from the %d written", len(b), len(big))
	}
	rc, err = sb.ReadFile(ctx, "link")
	if err != nil {
		t.Errorf("read through a link inside the workspace: %v", err)
	} else {
		rc.Close()
	}

	for _, name := range []string{"../escape", "dir/../../escape", "/etc/passwd", "root/etc/passwd", "up/etc/passwd", "root/tmp/x"} {
		if err := sb.WriteFile(ctx, name, strings.NewReader("x"), 0o644); !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("write %s: %v; want bad request", name, err)
		}
		if rc, err := sb.ReadFile(ctx, name); !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("read %s: %v; want bad request", name, err)
			if err == nil {
				rc.Close()
			}
		}
	}
	if _, err := sb.ReadFile(ctx, "missing"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("read a missing file: %v; want not found", err)
	}
	if _, err := sb.ReadFile(ctx, "d"); !errors.Is(err, session.ErrBadRequest) {
		t.Errorf("read a directory: %v; want bad request", err)
	}
	if err := sb.WriteFile(ctx, "d", strings.NewReader("x"), 0o644); !errors.Is(err, session.ErrConflict) {
		t.Errorf("write over a directory: %v; want conflict", err)
	}
	if err := sb.WriteFile(ctx, "f", strings.NewReader("x"), fs.ModeDir|0o644); err != nil {
		t.Errorf("write with a mode with type bits: %v", err)
	}
}

func TestHTTPHook(t *testing.T) {
	vms := newInProcessHook(t, true)
	var mu sync.Mutex
	var calls []string
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hook-secret" {
			http.Error(w, "who are you", http.StatusForbidden)
			return
		}
		var req remote.HookRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		calls = append(calls, r.URL.Path+" "+string(req.Session)+" "+req.SandboxID)
		mu.Unlock()
		switch r.URL.Path {
		case "/vms/create":
			vm, err := vms.CreateVM(r.Context(), req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(vm)
		case "/vms/destroy":
			if err := vms.DestroyVM(r.Context(), req); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		default:
			http.NotFound(w, r)
		}
	}))
	defer svc.Close()

	hook := &remote.HTTPHook{URL: svc.URL + "/vms/", Header: http.Header{"Authorization": {"Bearer hook-secret"}}, Logger: testLogger(t)}
	p := newProvider(t, hook, remote.Config{})
	id := session.NewID()
	sb := computetest.Open(t, p, compute.Spec{Session: id})
	if got := computetest.ShOK(t, sb, "echo hi"); got != "hi\n" {
		t.Errorf("exec: %q", got)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	mu.Lock()
	got := append([]string(nil), calls...)
	mu.Unlock()
	if len(got) != 2 || !strings.HasPrefix(got[0], "/vms/create "+string(id)+" sb-") ||
		!strings.HasPrefix(got[1], "/vms/destroy "+string(id)+" sb-") || got[0][len("/vms/create"):] != got[1][len("/vms/destroy"):] {
		t.Errorf("hook calls %q: want create then destroy of the same VM", got)
	}

	bad := newProvider(t, &remote.HTTPHook{URL: svc.URL + "/vms"}, remote.Config{})
	_, err := bad.Open(context.Background(), compute.Spec{Session: session.NewID()})
	if !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "403") {
		t.Errorf("open through a hook that refuses: %v; want unavailable with the status", err)
	}
}

func TestProcess_SlowReaderIsBounded(t *testing.T) {
	const window = 1 << 20
	p := newProvider(t, newInProcessHook(t, true), remote.Config{Window: window})
	sb := computetest.Open(t, p, compute.Spec{})
	const total = 32 << 20
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	pr := computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"head -c 33554432 /dev/zero; echo done > marker"}})
	pr.Stdin().Close()
	// Nobody reads: the provider's buffer fills up to the window, then
	// the agent stops reading the pipe and the command blocks.
	waitFor(t, "stdout buffer full", 10*time.Second, func() bool {
		out, _ := remote.Buffered(pr)
		return out == window
	})
	if got := computetest.ShOK(t, sb, "if [ -e marker ]; then echo finished; else echo blocked; fi"); got != "blocked\n" {
		t.Errorf("with nothing read the command %s", strings.TrimSpace(got))
	}
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
		t.Errorf("the heap grew by %d MiB with %d MiB of output pending; want about the windows", grew>>20, total>>20)
	} else {
		t.Logf("heap grew by %.1f MiB with %d MiB pending", float64(grew)/(1<<20), total>>20)
	}
	n, err := io.Copy(io.Discard, pr.Stdout())
	if err != nil || n != total {
		t.Fatalf("read %d bytes (%v), want %d", n, err, total)
	}
	_, _ = io.Copy(io.Discard, pr.Stderr())
	if exit, err := pr.Wait(); err != nil || exit.Code != 0 {
		t.Fatalf("wait: %+v, %v", exit, err)
	}
}

func TestProcess_StdinStreams(t *testing.T) {
	p := newProvider(t, newInProcessHook(t, true), remote.Config{})
	sb := computetest.Open(t, p, compute.Spec{})
	data := make([]byte, 2<<20+3)
	_, _ = rand.Read(data)
	pr := computetest.Start(t, sb, compute.ExecRequest{Argv: []string{"cat"}})
	r := computetest.Finish(t, pr, string(data))
	if r.Stdout != string(data) || r.Exit.Code != 0 {
		t.Errorf("cat echoed %d bytes (equal: %v), exit %+v", len(r.Stdout), r.Stdout == string(data), r.Exit)
	}
}

func TestProvider_CloseEndsCommands(t *testing.T) {
	p, err := remote.New(remote.Config{Hook: newInProcessHook(t, true), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := p.Open(ctx, compute.Spec{Session: session.NewID()})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := sb.Exec(ctx, compute.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo $$ > pid; echo started; exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(pr.Stdout()).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	rc, err := sb.(*remote.Sandbox).ReadFile(ctx, "pid")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	pid := strings.TrimSpace(string(b))

	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.Close(cctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := p.Close(cctx); err != nil {
		t.Fatalf("close again: %v", err)
	}
	exit, err := pr.Wait()
	if err != nil || exit.Lost || exit.Code != -1 || !strings.Contains(exit.Detail, "closed") {
		t.Errorf("exit after Close: %+v, %v; want stopped, not lost", exit, err)
	}
	// The agent kills a command whose connection is gone.
	waitFor(t, "the command killed", 10*time.Second, func() bool {
		_, err := os.Stat("/proc/" + pid)
		return err != nil
	})
	if _, err := p.Open(ctx, compute.Spec{Session: session.NewID()}); !errors.Is(err, session.ErrUnavailable) {
		t.Errorf("open after close: %v; want unavailable", err)
	}
}
