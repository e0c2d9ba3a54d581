package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/retry"
)

// agent is the client of one VM's sandbox agent.
type agent struct {
	p    *Provider
	vm   VM
	req  HookRequest // what created the VM, for DestroyVM
	base string      // http(s)://host:port, no trailing slash
}

// newAgent checks vm's address and returns its client.
func newAgent(p *Provider, vm VM, req HookRequest) (*agent, error) {
	base := vm.Addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, session.Errorf(session.CodeUnavailable, "provisioning hook answered addr %q: want host:port or an http(s) URL", vm.Addr)
	}
	return &agent{p: p, vm: vm, req: req, base: strings.TrimSuffix(u.String(), "/")}, nil
}

// unreachableError is a call that got no answer from the agent: the VM may
// be gone.
type unreachableError struct {
	addr string
	err  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("the sandbox agent at %s is unreachable: %v", e.addr, e.err)
}

// Unwrap returns the cause and a *session.Error with code unavailable and
// the same message, so the error matches session.ErrUnavailable and keeps
// its message through session.AsError.
func (e *unreachableError) Unwrap() []error {
	return []error{e.err, &session.Error{Code: session.CodeUnavailable, Message: e.Error()}}
}

// isUnreachable reports whether err is a call that got no answer.
func isUnreachable(err error) bool {
	var u *unreachableError
	return errors.As(err, &u)
}

// header returns the headers of a call with fence.
func (a *agent) header(fence int64) http.Header {
	return http.Header{
		"Authorization":          {"Bearer " + a.vm.Token},
		compute.AgentFenceHeader: {strconv.FormatInt(fence, 10)},
	}
}

// call makes an API call and decodes the answer into out (if not nil). A
// call the agent refused returns its *session.Error; one that got no
// answer an *unreachableError.
func (a *agent) call(ctx context.Context, method, path string, fence int64, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, a.p.cfg.RequestTimeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header = a.header(fence)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.p.client.Do(req)
	if err != nil {
		return &unreachableError{addr: a.vm.Addr, err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return a.answerError(resp.StatusCode, resp.Body)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return &unreachableError{addr: a.vm.Addr, err: fmt.Errorf("decode answer to %s %s: %w", method, path, err)}
	}
	return nil
}

// answerError turns an error answer of the agent into an error.
func (a *agent) answerError(status int, body io.Reader) error {
	var e struct {
		Error *session.Error `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(body, 4096))
	if json.Unmarshal(b, &e) == nil && e.Error != nil && e.Error.Code != "" {
		if e.Error.Code == session.CodeUnauthenticated {
			return session.Errorf(session.CodeUnavailable,
				"the sandbox agent at %s refused the sandbox's token: the provisioning hook must answer the token the agent was started with", a.vm.Addr)
		}
		return e.Error
	}
	return session.Errorf(session.CodeUnavailable, "the sandbox agent at %s answered status %d", a.vm.Addr, status)
}

// health checks the agent's health endpoint once.
func (a *agent) health(ctx context.Context) (compute.AgentHealth, error) {
	var h compute.AgentHealth
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/healthz", nil)
	if err != nil {
		return h, err
	}
	resp, err := a.p.client.Do(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return h, fmt.Errorf("health check answered %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&h); err != nil {
		return h, fmt.Errorf("decode health: %w", err)
	}
	return h, nil
}

// waitHealthy polls the health endpoint until it answers or ctx ends.
func (a *agent) waitHealthy(ctx context.Context) (compute.AgentHealth, error) {
	backoff := retry.Policy{Min: 5 * time.Millisecond, Max: 200 * time.Millisecond}.BackOff()
	for {
		hctx, cancel := context.WithTimeout(ctx, a.p.cfg.RequestTimeout)
		h, err := a.health(hctx)
		cancel()
		if err == nil {
			return h, nil
		}
		t := time.NewTimer(backoff.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return h, session.Errorf(session.CodeUnavailable,
				"the sandbox agent at %s did not become healthy (%v): check that the provisioning hook starts "+
					"`atrium sandbox-agent` listening on that address and that this node can reach it", a.vm.Addr, err)
		}
	}
}
