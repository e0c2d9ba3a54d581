package remote

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// DefaultVMHostStatusTimeout bounds each VM host's status call when
// VMHosts places a VM.
const DefaultVMHostStatusTimeout = 3 * time.Second

// VMHostStatus is what a VM host (`atrium vmhost`, compute/vmhost) answers
// to GET /status: its accelerator, image and VMs.
type VMHostStatus struct {
	Accel   string   `json:"accel"`
	Version string   `json:"image_version"`
	Kernel  string   `json:"kernel"`
	MaxVMs  int      `json:"max_vms"`
	VMs     []VMInfo `json:"vms"`
}

// VMInfo describes one VM in VMHostStatus.
type VMInfo struct {
	ID        string    `json:"id"`
	Session   string    `json:"session"`
	Addr      string    `json:"addr"`
	State     string    `json:"state"` // booting, running, sleeping or exited
	MemoryMiB int       `json:"memory_mib"`
	Started   time.Time `json:"started"`
	BootMs    int64     `json:"boot_ms"`
	RSSBytes  int64     `json:"rss_bytes"`
}

// VMHost is one `atrium vmhost` a node places sandboxes on.
type VMHost struct {
	// URL is the VM host's API, e.g. http://10.0.0.5:7000.
	URL string
	// Token is the bearer token it accepts (its --token-file).
	Token string
}

// VMHosts is the Hook and Sleeper of a set of VM hosts (`atrium vmhost`).
// CreateVM places a VM on the host that already runs one for the session
// (a node that restarted finds its VMs again), or else on the reachable
// host with the most free capacity; a host at capacity or failing is
// skipped for the next, and when none can start the VM the error matches
// session.ErrUnavailable. A VM host that died takes its VMs with it: the
// provider finds them unreachable and provisions fresh ones, which VMHosts
// places on the hosts that answer.
type VMHosts struct {
	// Hosts are the VM hosts, in order of preference among equals.
	// Required.
	Hosts []VMHost
	// Client makes the calls; default a client of its own with no proxy.
	// The request's context bounds each call.
	Client *http.Client
	// StatusTimeout bounds each status call; default
	// DefaultVMHostStatusTimeout.
	StatusTimeout time.Duration
	// Logger receives the hosts' failures; default slog.Default().
	Logger *slog.Logger

	mu     sync.Mutex
	placed map[string]int // guarded by mu: sandbox ID → index in Hosts
}

var (
	_ Hook    = (*VMHosts)(nil)
	_ Sleeper = (*VMHosts)(nil)
)

var defaultVMHostClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second}}

func (h *VMHosts) client() *http.Client {
	if h.Client != nil {
		return h.Client
	}
	return defaultVMHostClient
}

func (h *VMHosts) log() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

// hostError is a VM host's refusal: its status and message.
type hostError struct {
	url    string
	status int
	msg    string
}

func (e *hostError) Error() string {
	return fmt.Sprintf("VM host %s answered %d: %s", e.url, e.status, e.msg)
}

// call makes one API call to host and decodes the answer into out.
func (h *VMHosts) call(ctx context.Context, host VMHost, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	u := strings.TrimSuffix(host.URL, "/") + path
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return fmt.Errorf("VM host %s: %w", host.URL, err)
	}
	req.Header.Set("Authorization", "Bearer "+host.Token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client().Do(req)
	if err != nil {
		return fmt.Errorf("VM host %s: %w", host.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxHookOutput+1))
	if err != nil {
		return fmt.Errorf("VM host %s: read answer: %w", host.URL, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(b[:min(len(b), 512)]))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return &hostError{url: host.URL, status: resp.StatusCode, msg: msg}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("VM host %s: answer to %s %s: %w", host.URL, method, path, err)
		}
	}
	return nil
}

// statuses asks every host for its status at once; a host that does not
// answer has a nil status and an error.
func (h *VMHosts) statuses(ctx context.Context) ([]*VMHostStatus, []error) {
	timeout := cmp.Or(h.StatusTimeout, DefaultVMHostStatusTimeout)
	sts := make([]*VMHostStatus, len(h.Hosts))
	errs := make([]error, len(h.Hosts))
	var wg sync.WaitGroup
	for i, host := range h.Hosts {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			var st VMHostStatus
			if err := h.call(ctx, host, http.MethodGet, "/status", nil, &st); err != nil {
				errs[i] = err
				return
			}
			sts[i] = &st
		})
	}
	wg.Wait()
	return sts, errs
}

// CreateVM places a VM for req on one of the hosts (see VMHosts).
func (h *VMHosts) CreateVM(ctx context.Context, req HookRequest) (VM, error) {
	if len(h.Hosts) == 0 {
		return VM{}, errors.New("VM hosts: none configured")
	}
	sts, errs := h.statuses(ctx)
	type cand struct {
		i, free int
		has     bool
	}
	var cands []cand
	var why []string
	for i, st := range sts {
		if st == nil {
			h.log().Warn("VM host does not answer: skipping it", "url", h.Hosts[i].URL, "err", errs[i])
			why = append(why, errs[i].Error())
			continue
		}
		c := cand{i: i, free: st.MaxVMs - len(st.VMs)}
		for _, v := range st.VMs {
			if v.Session == string(req.Session) && req.Session != "" && v.State != "exited" {
				c.has = true
			}
		}
		if c.free <= 0 && !c.has {
			why = append(why, fmt.Sprintf("VM host %s is full (%d of %d VMs)", h.Hosts[i].URL, len(st.VMs), st.MaxVMs))
			continue
		}
		cands = append(cands, c)
	}
	slices.SortStableFunc(cands, func(a, b cand) int {
		if a.has != b.has {
			if a.has {
				return -1
			}
			return 1
		}
		return b.free - a.free
	})
	for _, c := range cands {
		host := h.Hosts[c.i]
		var vm VM
		err := h.call(ctx, host, http.MethodPost, "/create", req, &vm)
		if err == nil {
			if vm.ID == "" {
				vm.ID = req.SandboxID
			}
			if vm.Addr == "" || vm.Token == "" {
				err = fmt.Errorf("VM host %s: answer lacks addr or token", host.URL)
			}
		}
		if err == nil {
			h.mu.Lock()
			if h.placed == nil {
				h.placed = make(map[string]int)
			}
			h.placed[vm.ID] = c.i
			h.mu.Unlock()
			return vm, nil
		}
		if ctx.Err() != nil {
			return VM{}, fmt.Errorf("VM host %s: %w", host.URL, ctx.Err())
		}
		var he *hostError
		if !errors.As(err, &he) || he.status != http.StatusServiceUnavailable {
			h.log().Warn("VM host could not start a VM: trying the next", "url", host.URL, "session", string(req.Session), "err", err)
		}
		why = append(why, err.Error())
	}
	return VM{}, session.Errorf(session.CodeUnavailable, "no VM host could start a VM for session %s: %s",
		req.Session, strings.Join(why, "; "))
}

// hostOf returns the index of the host that runs VM id: the one it was
// placed on, or (after a restart of this node) the one whose status lists
// it; -1 if none does.
func (h *VMHosts) hostOf(ctx context.Context, id string) int {
	h.mu.Lock()
	i, ok := h.placed[id]
	h.mu.Unlock()
	if ok {
		return i
	}
	sts, _ := h.statuses(ctx)
	for i, st := range sts {
		if st == nil {
			continue
		}
		for _, v := range st.VMs {
			if v.ID == id {
				h.mu.Lock()
				if h.placed == nil {
					h.placed = make(map[string]int)
				}
				h.placed[id] = i
				h.mu.Unlock()
				return i
			}
		}
	}
	return -1
}

// DestroyVM destroys VM req.SandboxID on its host. A VM no host knows is
// gone already.
func (h *VMHosts) DestroyVM(ctx context.Context, req HookRequest) error {
	i := h.hostOf(ctx, req.SandboxID)
	if i < 0 {
		return nil
	}
	err := h.call(ctx, h.Hosts[i], http.MethodPost, "/destroy", req, nil)
	var he *hostError
	if err == nil || errors.As(err, &he) && he.status == http.StatusNotFound {
		h.mu.Lock()
		delete(h.placed, req.SandboxID)
		h.mu.Unlock()
		return nil
	}
	return err
}

// SleepVM saves VM req.SandboxID to its host's disk and stops it.
func (h *VMHosts) SleepVM(ctx context.Context, req HookRequest) error {
	return h.sleepWake(ctx, "/sleep", req)
}

// WakeVM restores VM req.SandboxID.
func (h *VMHosts) WakeVM(ctx context.Context, req HookRequest) error {
	return h.sleepWake(ctx, "/wake", req)
}

func (h *VMHosts) sleepWake(ctx context.Context, path string, req HookRequest) error {
	i := h.hostOf(ctx, req.SandboxID)
	if i < 0 {
		return fmt.Errorf("no VM host runs VM %s", req.SandboxID)
	}
	return h.call(ctx, h.Hosts[i], http.MethodPost, path, HookRequest{Session: req.Session, Fence: req.Fence, SandboxID: req.SandboxID}, nil)
}
