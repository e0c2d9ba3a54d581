// Package client is the Go SDK of Atrium's client protocol (DESIGN §7): REST
// calls that manage sessions and prompt them, and Watch, a live WebSocket
// stream of a session's events that reconnects by itself and resumes from the
// last event it delivered, so a consumer sees every event exactly once and in
// order across disconnects.
//
// It depends only on the wire contract and the JSON types of package session,
// so it works against any gateway that implements the contract.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/atriumhq/atrium/session"
	"github.com/atriumhq/atrium/session/api"
)

// DefaultUserAgent is the User-Agent of requests when Client.UserAgent is
// empty.
const DefaultUserAgent = "atrium-go-client/1"

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// Client calls one Atrium gateway. Its fields may be set directly; the zero
// HTTP uses http.DefaultClient. A Client is safe for concurrent use once its
// fields are no longer changed.
type Client struct {
	// Server is the gateway's base URL, e.g. "http://127.0.0.1:7080" or
	// "https://atrium.example.com/prefix".
	Server string
	// Token is sent as "Authorization: Bearer <Token>" when not empty: an
	// OIDC token, an Atrium API token, or "dev:<user>" for `atrium dev`.
	// It is ignored when Tokens is set.
	Token string
	// Tokens, when not nil, supplies the bearer token of every request and
	// of every WebSocket (re)connection, so a credential that expires
	// (an OIDC ID token) can be refreshed during a long-lived Watch. An
	// error from it fails the request without sending anything.
	Tokens TokenSource
	// HTTP carries every request, WebSocket handshakes included. It should
	// have no overall Timeout: contexts bound each call, and a timeout would
	// cut live streams.
	HTTP *http.Client
	// UserAgent identifies the program; default DefaultUserAgent.
	UserAgent string
}

// New returns a Client for the gateway at server, which must be an absolute
// http or https URL.
func New(server, token string) (*Client, error) {
	u, err := url.Parse(server)
	if err != nil {
		return nil, fmt.Errorf("parse server url %q: %w", server, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("server url %q: want an http:// or https:// url, like http://127.0.0.1:7080", server)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("server url %q has no host", server)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("server url %q: must not have a query or fragment", server)
	}
	return &Client{Server: strings.TrimRight(u.String(), "/"), Token: token}, nil
}

// CreateRequest is the body of POST /v1/sessions.
type CreateRequest struct {
	// Title is the session's title; may be empty.
	Title string
	// Harness is what runs once per turn: a template name
	// (Harness.Template) or an argv (Harness.Command). The zero value means
	// the server's default template. Only a template or a command may be set.
	Harness session.Harness
	// Egress is the session's own egress allowlist (host names,
	// "*.example.com", optional ":port"); the server refuses entries its
	// sandbox.egress_permit does not cover.
	Egress []string
	// Settings are the session's settings, any key PATCH
	// /v1/sessions/{id} accepts ("turn_timeout", "memory_bytes", …) with
	// its JSON value; Harness.PermissionMode is sent as
	// "permission_mode".
	Settings map[string]json.RawMessage
}

// MarshalJSON encodes the wire form, api.CreateSession:
// {"title"?,"harness"?,"agent"?,"egress"?,"settings"?}, the harness as a
// template name, or {"template"|"command","stdin"} when it has a stdin mode,
// an agent (Harness.Agent) as "agent" and Harness.PermissionMode in
// "settings".
func (r CreateRequest) MarshalJSON() ([]byte, error) {
	body := api.CreateSession{Title: r.Title, Agent: r.Harness.Agent, Egress: r.Egress}
	h := r.Harness
	if len(r.Settings) > 0 {
		body.Settings = maps.Clone(r.Settings)
	}
	if h.PermissionMode != "" {
		if body.Settings == nil {
			body.Settings = map[string]json.RawMessage{}
		}
		mode, _ := json.Marshal(h.PermissionMode)
		body.Settings["permission_mode"] = mode
	}
	switch {
	case h.Template != "" && len(h.Command) > 0:
		return nil, session.Errorf(session.CodeBadRequest, "harness: give a template or a command, not both")
	case h.Agent != "" && (h.Template != "" || len(h.Command) > 0):
		return nil, session.Errorf(session.CodeBadRequest, "harness: give an agent, a template or a command, not several")
	case h.Template != "" || h.Command != nil:
		body.Harness.Template, body.Harness.Command, body.Harness.Stdin = h.Template, h.Command, h.Stdin
	}
	return json.Marshal(body)
}

// EventsPage is a page of a session's history.
type EventsPage struct {
	// Events are the events after the requested seq, in order.
	Events []session.Event
	// Raw holds each event exactly as the server encoded it: Raw[i] is
	// Events[i].
	Raw []json.RawMessage
	// LastSeq is the session's last seq when the page was read.
	LastSeq session.Seq
	// Epoch is the session's epoch.
	Epoch string
}

// CreateSession creates a session owned by the caller.
func (c *Client) CreateSession(ctx context.Context, req CreateRequest) (session.Session, error) {
	var s session.Session
	err := c.do(ctx, http.MethodPost, "/v1/sessions", req, &s)
	return s, err
}

// ListSessions returns the sessions the caller may see.
func (c *Client) ListSessions(ctx context.Context) ([]session.Session, error) {
	var body api.SessionList
	if err := c.do(ctx, http.MethodGet, "/v1/sessions", nil, &body); err != nil {
		return nil, err
	}
	return body.Sessions, nil
}

// GetSession returns one session as the caller sees it (Role is the
// caller's role).
func (c *Client) GetSession(ctx context.Context, id session.ID) (session.Session, error) {
	var s session.Session
	p, err := sessionPath(id, "")
	if err != nil {
		return s, err
	}
	err = c.do(ctx, http.MethodGet, p, nil, &s)
	return s, err
}

// DeleteSession deletes a session and its history (owner only).
func (c *Client) DeleteSession(ctx context.Context, id session.ID) error {
	p, err := sessionPath(id, "")
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, p, nil, nil)
}

// Send prompts a session (driver or owner) and returns the seq of its
// message event once it is durable. The prompt is queued: its turn starts
// after the turns queued before it. clientID is optional; it comes back in the
// message event so a client can recognise its own prompts.
func (c *Client) Send(ctx context.Context, id session.ID, text, clientID string) (session.Seq, error) {
	if err := checkPrompt(text, clientID); err != nil {
		return 0, err
	}
	p, err := sessionPath(id, "/messages")
	if err != nil {
		return 0, err
	}
	body := api.Message{Text: text, ClientID: clientID}
	var out api.Accepted
	if err := c.do(ctx, http.MethodPost, p, body, &out); err != nil {
		return 0, err
	}
	return out.Seq, nil
}

// Cancel stops the session's running turn (driver or owner). It fails with
// an error matching session.ErrConflict when no turn is running.
func (c *Client) Cancel(ctx context.Context, id session.ID) error {
	p, err := sessionPath(id, "/cancel")
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, p, nil, nil)
}

// Approve answers the pending approval approvalID of the running turn
// (driver or owner).
func (c *Client) Approve(ctx context.Context, id session.ID, approvalID string, allow bool) error {
	if approvalID == "" {
		return session.Errorf(session.CodeBadRequest, "approval id is empty")
	}
	p, err := sessionPath(id, "/approvals/"+url.PathEscape(approvalID))
	if err != nil {
		return err
	}
	body := api.Approval{Allow: &allow}
	return c.do(ctx, http.MethodPost, p, body, nil)
}

// ApproveOption answers an agent's approval request with one of the options
// it offered (the id of an approval_requested event's options, such as
// allow_always): "always" answers are kept by the agent as its own rule.
func (c *Client) ApproveOption(ctx context.Context, id session.ID, approvalID, optionID string) error {
	if approvalID == "" || optionID == "" {
		return session.Errorf(session.CodeBadRequest, "approval id and option id must not be empty")
	}
	p, err := sessionPath(id, "/approvals/"+url.PathEscape(approvalID))
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, p, api.Approval{OptionID: optionID}, nil)
}

// SetMember gives user a role on the session, or removes them with
// session.RoleNone (owner only).
func (c *Client) SetMember(ctx context.Context, id session.ID, user string, role session.Role) error {
	if err := session.ValidUser(user); err != nil {
		return err
	}
	p, err := sessionPath(id, "/members/"+url.PathEscape(user))
	if err != nil {
		return err
	}
	body := api.MemberRequest{Role: &role}
	return c.do(ctx, http.MethodPut, p, body, nil)
}

// Events returns up to limit events with seq > after (limit 0 lets the
// server choose). A page may hold fewer events than asked for even when more
// exist: page until an empty page or one whose last event is at LastSeq.
func (c *Client) Events(ctx context.Context, id session.ID, after session.Seq, limit int) (EventsPage, error) {
	p, err := sessionPath(id, "/events")
	if err != nil {
		return EventsPage{}, err
	}
	q := url.Values{"after": {strconv.FormatInt(after, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var body session.EventsPage
	if err := c.do(ctx, http.MethodGet, p+"?"+q.Encode(), nil, &body); err != nil {
		return EventsPage{}, err
	}
	page := EventsPage{
		Events:  make([]session.Event, len(body.Events)),
		Raw:     body.Events,
		LastSeq: body.LastSeq,
		Epoch:   body.Epoch,
	}
	for i, raw := range body.Events {
		if err := json.Unmarshal(raw, &page.Events[i]); err != nil {
			return EventsPage{}, fmt.Errorf("decode event %d of page: %w", i, err)
		}
	}
	return page, nil
}

// NewClientID returns a random client_id for a prompt.
func NewClientID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand never fails on supported platforms.
	return "c_" + hex.EncodeToString(b)
}

// sessionPath returns /v1/sessions/{id}{suffix} after checking id, so a
// malformed id is a bad_request before anything is sent.
func sessionPath(id session.ID, suffix string) (string, error) {
	if err := id.Validate(); err != nil {
		return "", err
	}
	return "/v1/sessions/" + string(id) + suffix, nil
}

// checkPrompt rejects prompts the server would reject, before sending them.
func checkPrompt(text, clientID string) error {
	if len(text) > session.MaxTextBytes {
		return session.Errorf(session.CodePayloadTooLarge, "prompt is %d bytes; the limit is %d", len(text), session.MaxTextBytes)
	}
	if len(clientID) > session.MaxClientIDBytes {
		return session.Errorf(session.CodeBadRequest, "client_id is longer than %d bytes", session.MaxClientIDBytes)
	}
	return nil
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// header returns the headers of a request: the User-Agent and, when auth is
// true, the bearer token.
func (c *Client) header(ctx context.Context, auth bool) (http.Header, error) {
	h := http.Header{}
	if auth {
		tok := c.Token
		if c.Tokens != nil {
			var err error
			if tok, err = c.Tokens.Token(ctx); err != nil {
				return nil, fmt.Errorf("get bearer token: %w", err)
			}
		}
		if tok != "" {
			h.Set("Authorization", "Bearer "+tok)
		}
	}
	ua := c.UserAgent
	if ua == "" {
		ua = DefaultUserAgent
	}
	h.Set("User-Agent", ua)
	return h, nil
}

// do sends a REST request with body encoded as JSON (when not nil) and
// decodes a 2xx response into out (when not nil). A non-2xx response becomes
// an *session.Error carrying the server's code and message.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	return c.send(ctx, method, path, true, body, out)
}

// send is do with the choice of sending the bearer token (auth) or not.
func (c *Client) send(ctx context.Context, method, path string, auth bool, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s %s body: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, rd)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, path, err)
	}
	if req.Header, err = c.header(ctx, auth); err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, redactQuery(path), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, redactQuery(path), err)
	}
	return nil
}

func redactQuery(path string) string {
	p, _, _ := strings.Cut(path, "?")
	return p
}

// decodeError turns a non-2xx response into an *session.Error: the body's
// {"error":{code,message}} when it has one, else a code derived from the
// status (a proxy's HTML error page, say).
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var body session.ErrorBody
	if json.Unmarshal(b, &body) == nil && body.Error != nil && body.Error.Code != "" {
		e := *body.Error
		if e.Message == "" {
			e.Message = string(e.Code)
		}
		return &e
	}
	msg := "server answered " + resp.Status
	if s := strings.TrimSpace(string(b)); s != "" && len(s) < 200 && !strings.Contains(s, "<") {
		msg += ": " + s
	}
	return &session.Error{Code: codeOfStatus(resp.StatusCode), Message: msg}
}

// codeOfStatus maps an HTTP status to the contract's code for it.
func codeOfStatus(status int) session.Code {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType:
		return session.CodeBadRequest
	case http.StatusUnauthorized:
		return session.CodeUnauthenticated
	case http.StatusForbidden:
		return session.CodeForbidden
	case http.StatusNotFound, http.StatusGone:
		return session.CodeNotFound
	case http.StatusConflict:
		return session.CodeConflict
	case http.StatusTooManyRequests:
		return session.CodeTooManyRequests
	case http.StatusRequestEntityTooLarge:
		return session.CodePayloadTooLarge
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return session.CodeUnavailable
	case http.StatusInsufficientStorage:
		return session.CodeInsufficientStorage
	}
	return session.CodeInternal
}

// Terminal reports whether err from this package is one that retrying cannot
// fix: bad_request, unauthenticated, forbidden, not_found, conflict,
// payload_too_large, or a changed epoch. Network errors, unavailable,
// too_many_requests and internal errors are not terminal.
func Terminal(err error) bool {
	if errors.Is(err, ErrEpochChanged) || errors.Is(err, errProtocol) {
		return true
	}
	var e *session.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case session.CodeTooManyRequests, session.CodeUnavailable, session.CodeInternal:
		return false
	}
	return true
}
