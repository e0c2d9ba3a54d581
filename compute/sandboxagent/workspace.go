package sandboxagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/atriumhq/atrium/compute/mount"
	"github.com/atriumhq/atrium/session"
)

// maxPlanBody bounds the JSON of a scan request or a transfer plan (a
// manifest of a large workspace runs to megabytes).
const maxPlanBody = 256 << 20

// routeWorkspace adds the workspace transfer endpoints: the VM side of
// compute/mount, whose plans carry presigned URLs. With the query
// parameter mount=PATH they work on the directory the agent keeps for the
// sandbox's mount at PATH (an agent's home) instead of /workspace.
func (s *Server) routeWorkspace(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/workspace/scan", s.authed(workspaceHandler(s, false,
		func(ctx context.Context, d *mount.Dir, req *mount.ScanRequest) (any, error) { return d.Scan(ctx, req) })))
	mux.HandleFunc("POST /v1/workspace/upload", s.authed(workspaceHandler(s, false,
		func(ctx context.Context, d *mount.Dir, plan *mount.UploadPlan) (any, error) {
			return d.Upload(ctx, plan)
		})))
	mux.HandleFunc("POST /v1/workspace/restore", s.authed(workspaceHandler(s, true,
		func(ctx context.Context, d *mount.Dir, plan *mount.RestorePlan) (any, error) {
			return d.Restore(ctx, plan)
		})))
}

// WorkspaceError is the error answer of the workspace endpoints: the usual
// error object plus the compute/mount kind of the error (mount.Code), so the
// node can rebuild it with mount.FromCode.
type WorkspaceError struct {
	Code    session.Code `json:"code"`
	Message string       `json:"message"`
	Kind    string       `json:"kind,omitempty"`
}

// workspaceHandler decodes a request of type T and runs fn on the open
// sandbox's workspace. exclusive runs fn only while no command runs, and
// keeps commands from starting meanwhile.
func workspaceHandler[T any](s *Server, exclusive bool, fn func(context.Context, *mount.Dir, *T) (any, error)) func(http.ResponseWriter, *http.Request, int64) {
	return func(w http.ResponseWriter, r *http.Request, _ int64) {
		var req T
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPlanBody))
		if err := dec.Decode(&req); err != nil {
			writeError(w, session.Errorf(session.CodeBadRequest, "request body is not valid JSON: %v", err))
			return
		}
		var dir string
		var err error
		if m := r.URL.Query().Get("mount"); m != "" {
			dir, err = s.keptMount(m)
		} else {
			dir, err = s.workspace()
		}
		if err != nil {
			writeError(w, err)
			return
		}
		if exclusive {
			release, err := s.exclusive()
			if err != nil {
				writeError(w, err)
				return
			}
			defer release()
		}
		start := time.Now()
		out, err := fn(r.Context(), &mount.Dir{Path: dir, Client: s.objects}, &req)
		if err != nil {
			s.log.Warn("workspace transfer failed", "path", r.URL.Path, "err", err)
			writeWorkspaceError(w, err)
			return
		}
		s.log.Debug("workspace transfer", "path", r.URL.Path, "duration", time.Since(start).Round(time.Millisecond))
		writeJSON(w, http.StatusOK, out)
	}
}

// exclusive marks the workspace as being replaced, if no command runs.
func (s *Server) exclusive() (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.running > 0:
		return nil, session.Errorf(session.CodeConflict,
			"%d commands are running in the sandbox: stop them (sleep the sandbox) before restoring its workspace", s.running)
	case s.restoring:
		return nil, session.Errorf(session.CodeConflict, "the workspace is already being restored")
	}
	s.restoring = true
	return func() {
		s.mu.Lock()
		s.restoring = false
		s.mu.Unlock()
	}, nil
}

// writeWorkspaceError answers with err, keeping its message (errors of
// compute/mount never hold a presigned URL's signature) and its kind.
func writeWorkspaceError(w http.ResponseWriter, err error) {
	kind := mount.Code(err)
	code := session.CodeInternal
	switch kind {
	case mount.CodeConflict, mount.CodeFenced, mount.CodeChanged, mount.CodeNotRestored:
		code = session.CodeConflict
	case mount.CodeCorrupt, mount.CodeInvalid:
		code = session.CodeBadRequest
	case mount.CodeUnavailable:
		code = session.CodeUnavailable
	case mount.CodeNotFound:
		code = session.CodeNotFound
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		code = session.CodeUnavailable
	}
	writeJSON(w, code.HTTPStatus(), struct {
		Error WorkspaceError `json:"error"`
	}{WorkspaceError{Code: code, Message: fmt.Sprint(err), Kind: kind}})
}
