// Package forge talks to the code forges repository tasks open pull requests
// on: GitHub and Gitea (Forgejo speaks the same API). It does exactly what
// tasks need, following each forge's documented REST shapes: read a user's
// permission on a repository, and open a pull request.
//
// Tokens go in the Authorization header only; they are never logged, and no
// error carries them. A forge that answers 5xx, 429, or not at all gives an
// error marked dlq.Transient (worth retrying); anything else is permanent.
package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/atriumhq/atrium/gateway/dlq"
)

// Forge types.
const (
	TypeGitHub = "github"
	TypeGitea  = "gitea" // also Forgejo
)

// DefaultTimeout bounds one request to a forge.
const DefaultTimeout = 30 * time.Second

// maxBody bounds how much of a forge's answer is read.
const maxBody = 1 << 20

// Permission is a user's access to a repository, as GitHub names it.
type Permission string

// Permissions, weakest first.
const (
	PermNone  Permission = "none"
	PermRead  Permission = "read"
	PermWrite Permission = "write"
	PermAdmin Permission = "admin"
)

// CanPush reports whether p lets its user push branches (write or better).
func (p Permission) CanPush() bool { return p == PermWrite || p == PermAdmin }

// Repo names a repository on a forge.
type Repo struct {
	Owner string
	Name  string
}

func (r Repo) String() string { return r.Owner + "/" + r.Name }

// PullRequest is what opening a pull request needs: the head branch is
// merged into the base branch.
type PullRequest struct {
	Title string `json:"title"`
	Body  string `json:"body"`
	Head  string `json:"head"`
	Base  string `json:"base"`
}

// Opened is an opened pull request.
type Opened struct {
	URL    string `json:"html_url"`
	Number int    `json:"number"`
}

// Forge is a code forge's API, as repository tasks use it.
type Forge interface {
	// Permission returns login's permission on repo; PermNone when the
	// user has no access or does not exist.
	Permission(ctx context.Context, repo Repo, login string) (Permission, error)
	// OpenPullRequest opens pr on repo.
	OpenPullRequest(ctx context.Context, repo Repo, pr PullRequest) (Opened, error)
}

// Config configures a Client.
type Config struct {
	// Type is TypeGitHub or TypeGitea.
	Type string
	// APIURL is the API's base URL: https://api.github.com for GitHub
	// (https://HOST/api/v3 for GitHub Enterprise), https://HOST for Gitea
	// and Forgejo (the client adds /api/v1).
	APIURL string
	// Token authenticates the client: a GitHub token (sent as "Bearer") or
	// a Gitea access token (sent as "token").
	Token string
	// HTTP sends the requests; default a client with DefaultTimeout.
	HTTP *http.Client
}

// Client is a Forge over HTTP.
type Client struct {
	typ   string
	base  string // API base URL without a trailing slash, /api/v1 included for Gitea
	token string
	http  *http.Client
}

var _ Forge = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	if cfg.Type != TypeGitHub && cfg.Type != TypeGitea {
		return nil, fmt.Errorf("forge: type %q is not %s or %s", cfg.Type, TypeGitHub, TypeGitea)
	}
	u, err := url.Parse(cfg.APIURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("forge: api_url %q is not an http(s) URL", cfg.APIURL)
	}
	if cfg.Token == "" {
		return nil, errors.New("forge: a token is required")
	}
	c := &Client{typ: cfg.Type, base: strings.TrimSuffix(cfg.APIURL, "/"), token: cfg.Token, http: cfg.HTTP}
	if c.typ == TypeGitea && !strings.HasSuffix(c.base, "/api/v1") {
		c.base += "/api/v1"
	}
	if c.http == nil {
		c.http = &http.Client{Timeout: DefaultTimeout}
	}
	return c, nil
}

// Permission implements Forge: GitHub's GET
// /repos/{owner}/{repo}/collaborators/{username}/permission, Gitea's GET
// /repos/{owner}/{repo}/collaborators/{collaborator}/permission. Both answer
// {"permission":"admin|write|read|none"}; a 404 (no such user, or not a
// collaborator on Gitea) is PermNone.
func (c *Client) Permission(ctx context.Context, repo Repo, login string) (Permission, error) {
	path := "/repos/" + url.PathEscape(repo.Owner) + "/" + url.PathEscape(repo.Name) +
		"/collaborators/" + url.PathEscape(login) + "/permission"
	var out struct {
		Permission string `json:"permission"`
	}
	status, err := c.do(ctx, http.MethodGet, path, nil, &out)
	switch {
	case status == http.StatusNotFound:
		return PermNone, nil
	case err != nil:
		return "", fmt.Errorf("read %s's permission on %s: %w", login, repo, err)
	}
	switch p := Permission(out.Permission); p {
	case PermAdmin, PermWrite, PermRead, PermNone:
		return p, nil
	case "owner": // Gitea's repository owner.
		return PermAdmin, nil
	case "maintain":
		return PermWrite, nil
	case "triage":
		return PermRead, nil
	default:
		return PermNone, nil
	}
}

// OpenPullRequest implements Forge: POST /repos/{owner}/{repo}/pulls
// {title,body,head,base} → 201 {html_url,number} on both forges.
func (c *Client) OpenPullRequest(ctx context.Context, repo Repo, pr PullRequest) (Opened, error) {
	path := "/repos/" + url.PathEscape(repo.Owner) + "/" + url.PathEscape(repo.Name) + "/pulls"
	var out Opened
	if _, err := c.do(ctx, http.MethodPost, path, pr, &out); err != nil {
		return Opened{}, fmt.Errorf("open pull request on %s: %w", repo, err)
	}
	if out.URL == "" {
		return Opened{}, fmt.Errorf("open pull request on %s: the forge's answer has no html_url", repo)
	}
	return out, nil
}

// StatusError is a forge's answer other than 2xx. Message is the forge's
// own "message" field, if any.
type StatusError struct {
	Status  int
	Message string
}

func (e *StatusError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("the forge answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
	}
	return fmt.Sprintf("the forge answered %d %s", e.Status, http.StatusText(e.Status))
}

// do sends one request and decodes a 2xx answer into out. It returns the
// status (0 if there was none).
func (c *Client) do(ctx context.Context, method, path string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return 0, fmt.Errorf("make request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.typ == TypeGitHub {
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Accept", "application/vnd.github+json")
		req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	} else {
		req.Header.Set("Authorization", "token "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// The URL error names the URL, which holds no secret.
		return 0, dlq.Transient(fmt.Errorf("reach the forge: %w", err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, dlq.Transient(fmt.Errorf("read the forge's answer: %w", err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var msg struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(b, &msg)
		e := &StatusError{Status: resp.StatusCode, Message: msg.Message}
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			return resp.StatusCode, dlq.Transient(e)
		}
		return resp.StatusCode, e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode the forge's answer: %w", err)
		}
	}
	return resp.StatusCode, nil
}
