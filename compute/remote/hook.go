package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Hook creates and destroys the VMs that run sandbox agents: one VM per
// sandbox, whatever the platform (Firecracker, Kubernetes pods, cloud VMs).
// CommandHook and HTTPHook implement it.
type Hook interface {
	// CreateVM starts a VM running `atrium sandbox-agent` for req and
	// returns where its agent listens and the token it accepts. It may
	// return a VM it already runs for req.Session.
	CreateVM(ctx context.Context, req HookRequest) (VM, error)
	// DestroyVM stops and deletes the VM req.SandboxID. Destroying a VM
	// that is already gone is not an error.
	DestroyVM(ctx context.Context, req HookRequest) error
}

// Sleeper is a Hook that can put a VM to sleep with everything running in
// it (its memory saved on its host, nothing left running) and wake it on the
// same address: VMHosts (atrium vmhost) is one. The provider then keeps a
// sleeping sandbox's commands (see Provider). A hook that wraps another
// exposes it with an `Unwrap() Hook` method.
type Sleeper interface {
	// SleepVM saves and stops the VM req.SandboxID. When it fails, the VM
	// must still be running.
	SleepVM(ctx context.Context, req HookRequest) error
	// WakeVM restores the VM req.SandboxID as it was at SleepVM.
	WakeVM(ctx context.Context, req HookRequest) error
}

// sleeperOf returns h's Sleeper, looking through wrappers; nil if none.
func sleeperOf(h Hook) Sleeper {
	for h != nil {
		if s, ok := h.(Sleeper); ok {
			return s
		}
		u, ok := h.(interface{ Unwrap() Hook })
		if !ok {
			return nil
		}
		h = u.Unwrap()
	}
	return nil
}

// HookRequest describes the VM a hook creates or destroys.
type HookRequest struct {
	Session session.ID `json:"session"`
	// Fence is the ownership fence of the node that asks.
	Fence int64 `json:"fence"`
	// SandboxID names the VM: for CreateVM a fresh name the node proposes
	// (lowercase letters, digits and '-', valid as a DNS label), for
	// DestroyVM the ID that CreateVM returned.
	SandboxID string `json:"sandbox_id"`
	// The sandbox's limits; zero means the platform's default.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int   `json:"pids,omitempty"`
	Network     bool  `json:"network,omitempty"`
}

// VM is a created VM: the JSON a hook answers with.
type VM struct {
	// ID names the VM for DestroyVM; empty means the proposed SandboxID.
	ID string `json:"id"`
	// Addr is where the agent listens: host:port, or an http:// or
	// https:// URL.
	Addr string `json:"addr"`
	// Token is the bearer token the agent accepts, unique to this VM.
	Token string `json:"token"`
}

// maxHookOutput bounds what a hook may print (stdout) or answer.
const maxHookOutput = 64 << 10

// parseVM decodes and checks a hook's answer.
func parseVM(b []byte, proposed string) (VM, error) {
	var vm VM
	if err := json.Unmarshal(bytes.TrimSpace(b), &vm); err != nil {
		return VM{}, fmt.Errorf(`answer is not the JSON object {"id","addr","token"}: %w`, err)
	}
	if vm.Addr == "" || vm.Token == "" {
		return VM{}, errors.New(`answer lacks "addr" or "token"`)
	}
	if vm.ID == "" {
		vm.ID = proposed
	}
	return vm, nil
}

// CommandHook runs commands to create and destroy VMs. Each command gets the
// node's environment plus Env and ATRIUM_SESSION, ATRIUM_FENCE,
// ATRIUM_SANDBOX_ID, ATRIUM_MEMORY_BYTES, ATRIUM_PIDS and ATRIUM_NETWORK
// (0 or 1). Create must print the VM as JSON {"id","addr","token"} on stdout
// and exit 0; Destroy must exit 0. Their stderr is logged, so it must not
// hold secrets; and a process they leave running (the VM, an agent) must not
// keep their stdout open.
type CommandHook struct {
	Create  []string
	Destroy []string
	// Env is added to the commands' environment, as KEY=VALUE.
	Env []string
	// Logger receives the commands' stderr; default slog.Default().
	Logger *slog.Logger
}

var _ Hook = (*CommandHook)(nil)

// hookWaitDelay is how long a hook command's output may stay open after it
// exits (held by a background process it started).
const hookWaitDelay = 2 * time.Second

// CreateVM runs the Create command.
func (h *CommandHook) CreateVM(ctx context.Context, req HookRequest) (VM, error) {
	out, err := h.run(ctx, "create", h.Create, req)
	if err != nil {
		return VM{}, err
	}
	vm, err := parseVM(out, req.SandboxID)
	if err != nil {
		return VM{}, fmt.Errorf("provisioning hook %q: %w", h.Create[0], err)
	}
	return vm, nil
}

// DestroyVM runs the Destroy command.
func (h *CommandHook) DestroyVM(ctx context.Context, req HookRequest) error {
	_, err := h.run(ctx, "destroy", h.Destroy, req)
	return err
}

// run runs argv for req and returns its stdout.
func (h *CommandHook) run(ctx context.Context, what string, argv []string, req HookRequest) ([]byte, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, fmt.Errorf("provisioning hook: no %s command is configured", what)
	}
	log := h.Logger
	if log == nil {
		log = slog.Default()
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), h.Env...),
		"ATRIUM_SESSION="+string(req.Session),
		"ATRIUM_FENCE="+strconv.FormatInt(req.Fence, 10),
		"ATRIUM_SANDBOX_ID="+req.SandboxID,
		"ATRIUM_MEMORY_BYTES="+strconv.FormatInt(req.MemoryBytes, 10),
		"ATRIUM_PIDS="+strconv.Itoa(req.Pids),
		"ATRIUM_NETWORK="+boolDigit(req.Network),
	)
	stdout := &capped{max: maxHookOutput}
	stderr := &capped{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = hookWaitDelay
	start := time.Now()
	err := cmd.Run()
	attrs := []any{"session", string(req.Session), "sandbox", req.SandboxID, "command", argv[0],
		"duration", time.Since(start).Round(time.Millisecond)}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		attrs = append(attrs, "stderr", s)
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		log.Warn("provisioning hook left a process holding its output: redirect the output of what it starts in the background", attrs...)
		err = nil
	}
	switch {
	case err != nil && ctx.Err() != nil:
		log.Warn("provisioning hook "+what+" timed out", attrs...)
		return nil, fmt.Errorf("provisioning hook %q (%s) did not finish: %w", argv[0], what, ctx.Err())
	case err != nil:
		log.Warn("provisioning hook "+what+" failed", append(attrs, "err", err)...)
		return nil, fmt.Errorf("provisioning hook %q (%s) failed: %w (its stderr is in the node's log)", argv[0], what, err)
	case stdout.over:
		return nil, fmt.Errorf("provisioning hook %q (%s) printed more than %d bytes", argv[0], what, maxHookOutput)
	}
	log.Debug("provisioning hook "+what+" done", attrs...)
	return stdout.buf.Bytes(), nil
}

func boolDigit(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// capped is a buffer that keeps the first max bytes written to it.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); len(p) > room {
		c.over = true
		c.buf.Write(p[:max(room, 0)])
	} else {
		c.buf.Write(p)
	}
	return len(p), nil
}

func (c *capped) String() string { return c.buf.String() }

// HTTPHook creates and destroys VMs through an HTTP service: POST URL/create
// with the HookRequest as JSON answers the VM as JSON (status 200 or 201);
// POST URL/destroy with the HookRequest answers any 2xx status (404 counts
// as destroyed).
type HTTPHook struct {
	// URL is the service's base URL. Required.
	URL string
	// Header is added to every request, e.g. Authorization.
	Header http.Header
	// Client makes the requests; default http.DefaultClient. The
	// request's context bounds each call.
	Client *http.Client
	// Logger receives the bodies of failed answers; default
	// slog.Default().
	Logger *slog.Logger
}

var _ Hook = (*HTTPHook)(nil)

// CreateVM posts req to URL/create.
func (h *HTTPHook) CreateVM(ctx context.Context, req HookRequest) (VM, error) {
	body, err := h.post(ctx, "create", req)
	if err != nil {
		return VM{}, err
	}
	vm, err := parseVM(body, req.SandboxID)
	if err != nil {
		return VM{}, fmt.Errorf("provisioning hook %s/create: %w", h.URL, err)
	}
	return vm, nil
}

// DestroyVM posts req to URL/destroy.
func (h *HTTPHook) DestroyVM(ctx context.Context, req HookRequest) error {
	_, err := h.post(ctx, "destroy", req)
	return err
}

func (h *HTTPHook) post(ctx context.Context, what string, req HookRequest) ([]byte, error) {
	if h.URL == "" {
		return nil, errors.New("provisioning hook: HTTPHook.URL is required")
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode hook request: %w", err)
	}
	u := strings.TrimSuffix(h.URL, "/") + "/" + what
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("provisioning hook %s: %w", u, err)
	}
	for k, vs := range h.Header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	r.Header.Set("Content-Type", "application/json")
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(r)
	if err != nil {
		return nil, fmt.Errorf("provisioning hook %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHookOutput+1))
	if err != nil {
		return nil, fmt.Errorf("provisioning hook %s: read answer: %w", u, err)
	}
	if what == "destroy" && resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	if resp.StatusCode/100 != 2 {
		log := h.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Warn("provisioning hook failed", "url", u, "session", string(req.Session), "status", resp.StatusCode,
			"body", string(body[:min(len(body), 2048)]))
		return nil, fmt.Errorf("provisioning hook %s answered %s (its answer is in the node's log)", u, resp.Status)
	}
	if len(body) > maxHookOutput {
		return nil, fmt.Errorf("provisioning hook %s answered more than %d bytes", u, maxHookOutput)
	}
	return body, nil
}
