package remote

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// checkName refuses a file name that is not a clean relative path; the
// agent refuses the others that leave the workspace.
func checkName(name string) error {
	if name == "." || !fs.ValidPath(name) {
		return session.Errorf(session.CodeBadRequest,
			"file path %q must be relative to the workspace, without '.', '..' or empty elements", name)
	}
	return nil
}

// filesURL returns the URL of name in a's file API.
func (a *agent) filesURL(name string, perm fs.FileMode, withMode bool) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	u := a.base + "/v1/files/" + strings.Join(parts, "/")
	if withMode {
		u += fmt.Sprintf("?mode=%04o", perm.Perm())
	}
	return u
}

// WriteFile writes r to name, a slash-separated path relative to the
// workspace, creating parent directories; the file appears complete or not
// at all. Paths that leave the workspace, through '..' or a symbolic link,
// are refused with an error matching session.ErrBadRequest. A sandbox
// without a VM gets one first. ctx bounds the whole transfer.
func (s *Sandbox) WriteFile(ctx context.Context, name string, r io.Reader, perm fs.FileMode) error {
	if err := checkName(name); err != nil {
		return err
	}
	a, err := s.ready(ctx)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, a.filesURL(name, perm, true), r)
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	req.Header = a.header(s.fence)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := s.m.p.client.Do(req)
	if err != nil {
		return fmt.Errorf("write %s: %w", name, &unreachableError{addr: a.vm.Addr, err: err})
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("write %s: %w", name, a.answerError(resp.StatusCode, resp.Body))
	}
	return nil
}

// ReadFile opens name, a regular file of the workspace, for reading; the
// caller closes it. ctx bounds the whole transfer.
func (s *Sandbox) ReadFile(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	a, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.filesURL(name, 0, false), nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	req.Header = a.header(s.fence)
	resp, err := s.m.p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, &unreachableError{addr: a.vm.Addr, err: err})
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("read %s: %w", name, a.answerError(resp.StatusCode, resp.Body))
	}
	return resp.Body, nil
}
