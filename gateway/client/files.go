package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// The workspace of a session (DESIGN §7 "More REST"): files, archives, the
// changes of a turn and forks. Paths are relative to /workspace,
// slash-separated; "" is the workspace itself.

// filePath returns the escaped URL path of a workspace file.
func filePath(id session.ID, name string) (string, error) {
	name = strings.TrimPrefix(name, "/workspace/")
	if name == "" || strings.HasPrefix(name, "/") {
		return "", session.Errorf(session.CodeBadRequest, "file path %q must be relative to /workspace", name)
	}
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return sessionPath(id, "/files/"+strings.Join(parts, "/"))
}

// ListFiles lists the folder dir of the workspace ("" for its root): its
// entries, or everything below it with recursive.
func (c *Client) ListFiles(ctx context.Context, id session.ID, dir string, recursive bool) ([]session.FileEntry, error) {
	q := url.Values{}
	if dir != "" {
		q.Set("path", dir)
	}
	if recursive {
		q.Set("recursive", "1")
	}
	path, err := sessionPath(id, "/files")
	if err != nil {
		return nil, err
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out session.FileListing
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}

// FileInfo describes a file ReadFile opened.
type FileInfo struct {
	Size int64
	Mode fs.FileMode
}

// ReadFile opens the file name of the workspace; the caller closes it. A
// session whose sandbox sleeps is read from its saved workspace without
// waking it. A body that ends early fails with io.ErrUnexpectedEOF.
func (c *Client) ReadFile(ctx context.Context, id session.ID, name string) (io.ReadCloser, FileInfo, error) {
	path, err := filePath(id, name)
	if err != nil {
		return nil, FileInfo{}, err
	}
	resp, err := c.stream(ctx, http.MethodGet, path, nil, -1, "")
	if err != nil {
		return nil, FileInfo{}, err
	}
	info := FileInfo{Size: resp.ContentLength}
	if m, err := strconv.ParseUint(resp.Header.Get("Atrium-Mode"), 8, 32); err == nil {
		info.Mode = fs.FileMode(m)
	}
	return resp.Body, info, nil
}

// WriteFile writes size bytes of r (-1: unknown) to the file name of the
// workspace with permission bits perm (0: 0644), creating its folders. It
// returns once the write is applied and saved: after the running turn, if
// one runs. An upload that fails midway changes nothing.
func (c *Client) WriteFile(ctx context.Context, id session.ID, name string, r io.Reader, size int64, perm fs.FileMode) error {
	path, err := filePath(id, name)
	if err != nil {
		return err
	}
	if perm != 0 {
		path += fmt.Sprintf("?mode=%04o", perm.Perm())
	}
	resp, err := c.stream(ctx, http.MethodPut, path, r, size, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// DeleteFile deletes the file, link or folder name of the workspace.
func (c *Client) DeleteFile(ctx context.Context, id session.ID, name string) error {
	path, err := filePath(id, name)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, path, nil, nil)
}

// ReadArchive opens a tar.gz of the folder dir of the workspace ("" for all
// of it), names relative to dir; the caller closes it.
func (c *Client) ReadArchive(ctx context.Context, id session.ID, dir string) (io.ReadCloser, error) {
	path, err := sessionPath(id, "/archive?path="+url.QueryEscape(dir))
	if err != nil {
		return nil, err
	}
	resp, err := c.stream(ctx, http.MethodGet, path, nil, -1, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteArchive unpacks the tar.gz r (size bytes, -1: unknown) into the
// folder dir of the workspace, whole or not at all.
func (c *Client) WriteArchive(ctx context.Context, id session.ID, dir string, r io.Reader, size int64) error {
	path, err := sessionPath(id, "/archive?path="+url.QueryEscape(dir))
	if err != nil {
		return err
	}
	resp, err := c.stream(ctx, http.MethodPost, path, r, size, "application/gzip")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// TurnChanges returns the files turn n added, modified or deleted, with
// unified diffs of small text files.
func (c *Client) TurnChanges(ctx context.Context, id session.ID, n int64) ([]session.FileChange, error) {
	path, err := sessionPath(id, "/turns/"+strconv.FormatInt(n, 10)+"/changes")
	if err != nil {
		return nil, err
	}
	var out session.TurnChanges
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return out.Files, nil
}

// ForkRequest asks Fork for a fork (the body of POST
// /v1/sessions/{id}/fork, api.Fork).
type ForkRequest struct {
	// AtSeq is the parent's last event the fork keeps; 0 means all.
	AtSeq session.Seq
	Title string
}

// Fork makes a new session owned by the caller with id's history up to
// req.AtSeq and its workspace as of then.
func (c *Client) Fork(ctx context.Context, id session.ID, req ForkRequest) (session.Session, error) {
	path, err := sessionPath(id, "/fork")
	if err != nil {
		return session.Session{}, err
	}
	body := api.Fork{Title: req.Title}
	if req.AtSeq != 0 {
		body.AtSeq = &req.AtSeq
	}
	var out session.Session
	err = c.do(ctx, http.MethodPost, path, body, &out)
	return out, err
}

// stream sends a request with a raw body and returns a 2xx response for
// the caller to read and close.
func (c *Client) stream(ctx context.Context, method, path string, body io.Reader, size int64, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, body)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", method, path, err)
	}
	h, err := c.header(ctx, true)
	if err != nil {
		return nil, err
	}
	req.Header = h
	if body != nil {
		req.ContentLength = size
		if size == 0 {
			req.Body = http.NoBody
		}
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, redactQuery(path), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}
