package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
)

// maxPlanAnswer bounds the JSON answer of a workspace call (a scan of a
// large workspace runs to megabytes).
const maxPlanAnswer = 256 << 20

// Workspace is a sandbox's /workspace as a mount.Workspace: a
// mount.Volume on the node saves and restores it through the agent, which
// runs mount.Dir in the VM and moves the bytes through the presigned URLs
// of the plans. It carries the fence of its Sandbox handle.
type Workspace struct {
	s     *Sandbox
	mount string // the sandbox path of a mount the agent keeps (Sandbox.Mount); "" for /workspace
}

var _ mount.Workspace = (*Workspace)(nil)

// Workspace returns the sandbox's workspace, for a mount.Volume. A sandbox
// without a VM gets one at the first call (with an empty workspace: restore
// it before running commands).
func (s *Sandbox) Workspace() *Workspace { return &Workspace{s: s} }

// Mount returns the directory the VM's agent keeps for the sandbox's mount
// at sandboxPath, one of the node's mounts outside Config.AgentsDir (an
// agent's home), as a mount.Workspace: the node saves it to the object
// store and restores it into a fresh VM exactly as /workspace. The agent
// refuses it (session.ErrNotFound) when the sandbox was not opened with
// such a mount, and its Restore while commands run.
func (s *Sandbox) Mount(sandboxPath string) *Workspace { return &Workspace{s: s, mount: sandboxPath} }

// MountWorkspace is Mount as a mount.Workspace, for the node's session
// actor, which declares the interface it needs and cannot name this
// package.
func (s *Sandbox) MountWorkspace(sandboxPath string) mount.Workspace { return s.Mount(sandboxPath) }

// Scan implements mount.Workspace.
func (w *Workspace) Scan(ctx context.Context, req *mount.ScanRequest) (*mount.ScanResult, error) {
	var res mount.ScanResult
	if err := w.call(ctx, "scan", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Upload implements mount.Workspace.
func (w *Workspace) Upload(ctx context.Context, plan *mount.UploadPlan) (*mount.Transfer, error) {
	var tr mount.Transfer
	if err := w.call(ctx, "upload", plan, &tr); err != nil {
		return nil, err
	}
	return &tr, nil
}

// Restore implements mount.Workspace. The agent refuses it (session
// ErrConflict) while commands run in the sandbox.
func (w *Workspace) Restore(ctx context.Context, plan *mount.RestorePlan) (*mount.Transfer, error) {
	var tr mount.Transfer
	if err := w.call(ctx, "restore", plan, &tr); err != nil {
		return nil, err
	}
	return &tr, nil
}

// call posts in to /v1/workspace/<op> and decodes the answer into out. ctx
// alone bounds it: transfers of large workspaces take a while. Errors of
// compute/mount come back matching its sentinels.
func (w *Workspace) call(ctx context.Context, op string, in, out any) error {
	a, err := w.s.ready(ctx)
	if err != nil {
		return err
	}
	b, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode workspace %s: %w", op, err)
	}
	u := a.base + "/v1/workspace/" + op
	if w.mount != "" {
		u += "?mount=" + url.QueryEscape(w.mount)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("workspace %s: %w", op, err)
	}
	req.Header = a.header(w.s.fence)
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.s.m.p.client.Do(req)
	if err != nil {
		return fmt.Errorf("workspace %s: %w", op, &unreachableError{addr: a.vm.Addr, err: err})
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code    session.Code `json:"code"`
				Message string       `json:"message"`
				Kind    string       `json:"kind"`
			} `json:"error"`
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &e) == nil && e.Error.Kind != "" {
			return fmt.Errorf("workspace %s in the sandbox: %w", op, mount.FromCode(e.Error.Kind, e.Error.Message))
		}
		return fmt.Errorf("workspace %s: %w", op, a.answerError(resp.StatusCode, bytes.NewReader(body)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPlanAnswer)).Decode(out); err != nil {
		return fmt.Errorf("workspace %s: %w", op, &unreachableError{addr: a.vm.Addr, err: fmt.Errorf("decode answer: %w", err)})
	}
	return nil
}
