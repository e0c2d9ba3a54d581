// Package acp is Atrium's client of the Agent Client Protocol (ACP,
// agentclientprotocol.com): JSON-RPC 2.0, one message per line, over an agent
// process's stdin and stdout (DESIGN §6 "Agents"). It works over any
// io.Writer and io.Reader, so the same code drives an agent in a local
// bubblewrap sandbox and one behind a remote sandbox agent's exec stream.
//
// A Client runs the session-level flow (initialize, authenticate,
// session/new or session/load, session/prompt, session/cancel) and maps what
// the agent reports during a prompt to Atrium's agent events (DESIGN §7):
// message chunks become live DeltaFrames and one durable agent_message per
// message, tool calls and their updates become tool_call and
// tool_call_update (the first update about an unknown id counts as the
// call), plans become plan events. Permission requests go to the prompt's
// Sink, which answers with one of the agent's options.
//
// The client is its own small JSON-RPC implementation rather than
// github.com/coder/acp-go-sdk's connection, which falls short here in four
// ways: it queues at most 1024 notifications and closes the connection when
// its handler falls behind (a client that must wait for commits needs
// backpressure instead); it logs an unparsable line verbatim (agent output
// may hold prompts and secrets); a line over its 10 MiB buffer ends the
// connection; and its strict union decoding drops a whole update that an
// agent shaped slightly off the schema. The wire shapes follow the SDK's
// schema types.
package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/atriumhq/atrium/session"
)

// Defaults of Config.
const (
	// DefaultInitTimeout bounds the initialize request: an agent that
	// never answers it fails within this time.
	DefaultInitTimeout = 30 * time.Second
	// DefaultMaxMessageBytes is the longest line read from the agent;
	// a longer one is dropped (and reported), the connection survives.
	DefaultMaxMessageBytes = 8 << 20
)

// ProtocolVersion is the ACP version the client speaks.
const ProtocolVersion = 1

// Config configures a Client.
type Config struct {
	// InitTimeout bounds Initialize; DefaultInitTimeout if zero.
	InitTimeout time.Duration
	// MaxMessageBytes bounds one incoming line; DefaultMaxMessageBytes
	// if zero.
	MaxMessageBytes int
	// Logger receives diagnostics, never message contents;
	// slog.Default() if nil.
	Logger *slog.Logger
}

// ErrClosed is returned by calls on a client whose agent's output ended
// (the process exited or its stream broke). Client.Err says why.
var ErrClosed = errors.New("acp: the agent's connection is closed")

// RPCError is a JSON-RPC error object an agent answered with.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string {
	if len(e.Data) > 0 && len(e.Data) < 512 {
		return fmt.Sprintf("agent error %d: %s (%s)", e.Code, e.Message, e.Data)
	}
	return fmt.Sprintf("agent error %d: %s", e.Code, e.Message)
}

// JSON-RPC error codes the client answers with.
const (
	codeMethodNotFound = -32601
	codeInvalidParams  = -32602
)

// message is any JSON-RPC 2.0 message.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

type response struct {
	result json.RawMessage
	err    error
}

// Client is one ACP connection to one agent process. Create it with Start;
// it reads the agent's output on its own goroutine until the output ends.
type Client struct {
	cfg Config
	log *slog.Logger
	r   io.Reader

	writeMu sync.Mutex // serializes writes to w
	w       io.Writer  // guarded by writeMu

	done chan struct{} // closed when the read loop ends
	wg   sync.WaitGroup

	mu       sync.Mutex
	nextID   int64                   // guarded by mu
	pending  map[int64]chan response // guarded by mu
	closeErr error                   // guarded by mu: why the read loop ended
	prompt   *promptState            // guarded by mu: the prompt in progress, nil between prompts
	promptID int64                   // guarded by mu: the JSON-RPC id of prompt's request
	ignored  int                     // guarded by mu: updates received outside a prompt (replays)
	lastIgn  time.Time               // guarded by mu: when the last of them arrived
	sessID   string                  // guarded by mu: the ACP session

	// Owned by the read loop.
	tooLong int
	bad     int // lines that were not JSON-RPC
}

// Start starts reading the agent's output r; requests are written to w.
func Start(w io.Writer, r io.Reader, cfg Config) *Client {
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = DefaultInitTimeout
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, log: cfg.Logger, w: w, r: r, done: make(chan struct{}), pending: map[int64]chan response{}}
	c.wg.Go(c.readLoop)
	return c
}

// Done is closed when the agent's output has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err says why the connection ended; nil while it is open.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// Wait waits for the client's goroutines: the read loop ends when the
// agent's output ends (the caller kills the process first), and permission
// requests in flight end with it.
func (c *Client) Wait() { c.wg.Wait() }

// SessionID returns the ACP session opened by NewSession or LoadSession.
func (c *Client) SessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessID
}

// AgentInfo is what initialize told about the agent.
type AgentInfo struct {
	ProtocolVersion int          `json:"protocolVersion"`
	Capabilities    Capabilities `json:"agentCapabilities"`
	AuthMethods     []AuthMethod `json:"authMethods"`
	Agent           *struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"agentInfo,omitempty"`
}

// Capabilities are the agent capabilities the client uses.
type Capabilities struct {
	LoadSession bool `json:"loadSession"`
	// MCP says which MCP transports besides stdio the agent supports.
	MCP struct {
		HTTP bool `json:"http"`
		SSE  bool `json:"sse"`
	} `json:"mcpCapabilities"`
}

// Supports reports whether the agent can connect to an MCP server of
// type typ ("" or "stdio": every agent).
func (c Capabilities) Supports(typ string) bool {
	switch typ {
	case "", "stdio":
		return true
	case "http":
		return c.MCP.HTTP
	case "sse":
		return c.MCP.SSE
	}
	return false
}

// AuthMethod is one way an agent can authenticate.
type AuthMethod struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// MCPServer is an MCP server the agent should connect to, in ACP's shapes:
// stdio (Type "" or "stdio": {name, command, args, env}) or http / sse
// ({type, name, url, headers}).
type MCPServer struct {
	Name    string
	Type    string
	Command string
	Args    []string
	Env     []EnvVar
	URL     string
	Headers []EnvVar
}

// EnvVar is one environment variable or HTTP header of an MCPServer.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// MarshalJSON encodes m in the shape of its type, with every list present
// (ACP requires args, env and headers).
func (m MCPServer) MarshalJSON() ([]byte, error) {
	list := func(l []EnvVar) []EnvVar {
		if l == nil {
			return []EnvVar{}
		}
		return l
	}
	if m.Type == "" || m.Type == "stdio" {
		args := m.Args
		if args == nil {
			args = []string{}
		}
		return json.Marshal(struct {
			Name    string   `json:"name"`
			Command string   `json:"command"`
			Args    []string `json:"args"`
			Env     []EnvVar `json:"env"`
		}{m.Name, m.Command, args, list(m.Env)})
	}
	return json.Marshal(struct {
		Type    string   `json:"type"`
		Name    string   `json:"name"`
		URL     string   `json:"url"`
		Headers []EnvVar `json:"headers"`
	}{m.Type, m.Name, m.URL, list(m.Headers)})
}

// Initialize negotiates the protocol. The client advertises no file system
// and no terminal capability. It fails after Config.InitTimeout.
func (c *Client) Initialize(ctx context.Context) (AgentInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.InitTimeout)
	defer cancel()
	params := map[string]any{
		"protocolVersion": ProtocolVersion,
		"clientCapabilities": map[string]any{
			"fs":       map[string]bool{"readTextFile": false, "writeTextFile": false},
			"terminal": false,
		},
		"clientInfo": map[string]string{"name": "atrium", "version": "1"},
	}
	var info AgentInfo
	err := c.call(ctx, "initialize", params, &info)
	if errors.Is(err, context.DeadlineExceeded) {
		return info, fmt.Errorf("initialize: the agent did not answer within %v", c.cfg.InitTimeout)
	}
	if err != nil {
		return info, fmt.Errorf("initialize: %w", err)
	}
	return info, nil
}

// Authenticate authenticates with one of the agent's methods.
func (c *Client) Authenticate(ctx context.Context, methodID string) error {
	if err := c.call(ctx, "authenticate", map[string]string{"methodId": methodID}, nil); err != nil {
		return fmt.Errorf("authenticate: %w", err)
	}
	return nil
}

// NewSession opens a new ACP session working in cwd.
func (c *Client) NewSession(ctx context.Context, cwd string, mcp []MCPServer) (string, error) {
	if mcp == nil {
		mcp = []MCPServer{}
	}
	var res struct {
		SessionID string `json:"sessionId"`
	}
	if err := c.call(ctx, "session/new", map[string]any{"cwd": cwd, "mcpServers": mcp}, &res); err != nil {
		return "", fmt.Errorf("session/new: %w", err)
	}
	if res.SessionID == "" {
		return "", errors.New("session/new: the agent answered no sessionId")
	}
	c.mu.Lock()
	c.sessID = res.SessionID
	c.mu.Unlock()
	return res.SessionID, nil
}

// Replay settling: after a load, the client waits until the agent has sent
// no update for replayQuiet (at most replayMax) before it returns, so the
// replay that some agents continue after answering the load (Gemini CLI
// 0.61) is not taken for the first prompt's answer.
const (
	replayQuiet = 150 * time.Millisecond
	replayMax   = 5 * time.Second
)

// LoadSession opens the ACP session id from before. The agent replays the
// conversation as updates; the client records none of them (nor anything
// else the agent sends before the next Prompt), and returns once the
// replay has gone quiet.
func (c *Client) LoadSession(ctx context.Context, id, cwd string, mcp []MCPServer) error {
	if mcp == nil {
		mcp = []MCPServer{}
	}
	if err := c.call(ctx, "session/load", map[string]any{"sessionId": id, "cwd": cwd, "mcpServers": mcp}, nil); err != nil {
		return fmt.Errorf("session/load: %w", err)
	}
	c.mu.Lock()
	c.sessID = id
	c.mu.Unlock()
	c.settle(ctx)
	return nil
}

// settle waits until no update has arrived for replayQuiet, replayMax at
// most, ctx or the connection ending first.
func (c *Client) settle(ctx context.Context) {
	limit := time.NewTimer(replayMax)
	defer limit.Stop()
	for {
		c.mu.Lock()
		quietFor := time.Since(c.lastIgn)
		c.mu.Unlock()
		if quietFor >= replayQuiet {
			return
		}
		t := time.NewTimer(replayQuiet - quietFor)
		select {
		case <-t.C:
		case <-limit.C:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		case <-c.done:
			t.Stop()
			return
		}
	}
}

// SetMode selects one of the agent's session modes (session/set_mode), such
// as the permission mode a session runs in.
func (c *Client) SetMode(ctx context.Context, modeID string) error {
	c.mu.Lock()
	sessID := c.sessID
	c.mu.Unlock()
	if err := c.call(ctx, "session/set_mode", map[string]string{"sessionId": sessID, "modeId": modeID}, nil); err != nil {
		return fmt.Errorf("session/set_mode %s: %w", modeID, err)
	}
	return nil
}

// Stop reasons of a prompt (ACP StopReason).
const (
	StopEndTurn         = "end_turn"
	StopMaxTokens       = "max_tokens"
	StopMaxTurnRequests = "max_turn_requests"
	StopRefusal         = "refusal"
	StopCancelled       = "cancelled"
)

// Outcome maps a stop reason to how an Atrium turn ended, with the reason
// when it failed.
func Outcome(stopReason string) (session.TurnStatus, string) {
	switch stopReason {
	case StopEndTurn:
		return session.TurnOK, ""
	case StopCancelled:
		return session.TurnCancelled, ""
	case StopMaxTokens:
		return session.TurnFailed, "the agent stopped: the model reached its maximum number of tokens"
	case StopMaxTurnRequests:
		return session.TurnFailed, "the agent stopped: it reached its maximum number of model requests in one turn"
	case StopRefusal:
		return session.TurnFailed, "the agent refused to continue"
	}
	return session.TurnFailed, fmt.Sprintf("the agent stopped with an unknown reason %q", stopReason)
}

// Prompt sends one prompt (text) and waits for the agent's stop reason.
// What the agent reports meanwhile goes to sink, with turn in every event.
// ctx ending abandons the wait (the caller kills the agent); Cancel asks the
// agent to stop, and Prompt then returns its answer (normally "cancelled").
func (c *Client) Prompt(ctx context.Context, turn int64, text string, sink Sink) (string, error) {
	c.mu.Lock()
	if c.prompt != nil {
		c.mu.Unlock()
		return "", errors.New("session/prompt: a prompt is already running")
	}
	if c.closeErr != nil {
		err := c.closeErr
		c.mu.Unlock()
		return "", err
	}
	pctx, cancel := context.WithCancel(ctx)
	p := &promptState{turn: turn, sink: sink, ctx: pctx, cancel: cancel, tools: map[string]bool{}}
	c.prompt = p
	sessID := c.sessID
	id, ch := c.registerLocked()
	c.promptID = id
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.prompt == p {
			c.prompt = nil
		}
		c.mu.Unlock()
		cancel()
	}()
	params := map[string]any{
		"sessionId": sessID,
		"prompt":    []map[string]string{{"type": "text", "text": text}},
	}
	var res struct {
		StopReason string `json:"stopReason"`
	}
	if err := c.send(ctx, id, ch, "session/prompt", params, &res); err != nil {
		return "", fmt.Errorf("session/prompt: %w", err)
	}
	return res.StopReason, nil
}

// Cancel sends session/cancel for the prompt in progress and answers its
// open permission requests "cancelled" (as ACP requires).
func (c *Client) Cancel() error {
	c.mu.Lock()
	p, sessID := c.prompt, c.sessID
	c.mu.Unlock()
	if p != nil {
		p.cancelPermissions()
	}
	return c.notify("session/cancel", map[string]string{"sessionId": sessID})
}

// --- JSON-RPC ----------------------------------------------------------------

func (c *Client) registerLocked() (int64, chan response) {
	c.nextID++
	ch := make(chan response, 1)
	c.pending[c.nextID] = ch
	return c.nextID, ch
}

func (c *Client) call(ctx context.Context, method string, params, result any) error {
	c.mu.Lock()
	if c.closeErr != nil {
		err := c.closeErr
		c.mu.Unlock()
		return err
	}
	id, ch := c.registerLocked()
	c.mu.Unlock()
	return c.send(ctx, id, ch, method, params, result)
}

// send writes request id and waits for its response.
func (c *Client) send(ctx context.Context, id int64, ch chan response, method string, params, result any) error {
	b, err := json.Marshal(params)
	if err != nil {
		c.forget(id)
		return err
	}
	if err := c.write(message{ID: json.RawMessage(strconv.FormatInt(id, 10)), Method: method, Params: b}); err != nil {
		c.forget(id)
		return err
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		if result != nil && len(r.result) > 0 && !bytes.Equal(r.result, []byte("null")) {
			if err := json.Unmarshal(r.result, result); err != nil {
				return fmt.Errorf("decode the agent's answer: %w", err)
			}
		}
		return nil
	case <-ctx.Done():
		c.forget(id)
		return ctx.Err()
	}
}

func (c *Client) forget(id int64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func (c *Client) notify(method string, params any) error {
	b, err := json.Marshal(params)
	if err != nil {
		return err
	}
	return c.write(message{Method: method, Params: b})
}

// write writes one message as a line. A write to an agent that does not
// read blocks until the caller kills it.
func (c *Client) write(m message) error {
	m.JSONRPC = "2.0"
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if _, err := c.w.Write(b); err != nil {
		if e := c.Err(); e != nil {
			return e
		}
		return fmt.Errorf("write to the agent: %w", err)
	}
	return nil
}

// readLoop reads the agent's output line by line until it ends.
func (c *Client) readLoop() {
	br := bufio.NewReaderSize(c.r, 64<<10)
	var cause error
	for {
		line, err := c.readLine(br)
		if len(line) > 0 {
			c.handleLine(line)
		}
		if err != nil {
			cause = err
			break
		}
	}
	if errors.Is(cause, io.EOF) {
		cause = fmt.Errorf("%w: the agent's output ended", ErrClosed)
	} else {
		cause = fmt.Errorf("%w: read the agent's output: %v", ErrClosed, cause)
	}
	c.mu.Lock()
	c.closeErr = cause
	pending := c.pending
	c.pending = map[int64]chan response{}
	p := c.prompt
	c.mu.Unlock()
	if p != nil {
		p.flush()
		p.cancelPermissions()
	}
	for _, ch := range pending {
		ch <- response{err: cause}
	}
	close(c.done)
}

// readLine returns the next line without its newline, dropping (and
// reporting) a line longer than MaxMessageBytes.
func (c *Client) readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	over := 0
	for {
		chunk, err := br.ReadSlice('\n')
		if over == 0 && len(buf)+len(chunk) <= c.cfg.MaxMessageBytes+1 {
			buf = append(buf, chunk...)
		} else {
			over += len(buf) + len(chunk)
			buf = buf[:0]
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if over > 0 {
			c.tooLong++
			c.log.Warn("agent message over the size limit dropped", "bytes", over, "limit", c.cfg.MaxMessageBytes)
			c.problem(fmt.Sprintf("the agent sent a message of %d bytes, over the limit of %d; it was dropped", over, c.cfg.MaxMessageBytes))
			if err != nil {
				return nil, err
			}
			over = 0
			continue
		}
		return bytes.TrimSpace(buf), err
	}
}

// problem reports something wrong with the agent's output to the prompt's
// sink, if a prompt runs.
func (c *Client) problem(msg string) {
	c.mu.Lock()
	p := c.prompt
	c.mu.Unlock()
	if p != nil {
		p.problem(msg)
	}
}

func (c *Client) handleLine(line []byte) {
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		// An agent that logs to stdout writes many: the log says the
		// first few and then every thousandth.
		if c.bad++; c.bad <= 5 || c.bad%1000 == 0 {
			c.log.Warn("agent output line is not JSON-RPC", "bytes", len(line), "lines", c.bad, "err", shortErr(err))
		}
		c.problem(fmt.Sprintf("the agent wrote a line of %d bytes that is not JSON-RPC; it was ignored", len(line)))
		return
	}
	switch {
	case m.Method != "" && len(m.ID) > 0:
		c.handleRequest(m)
	case m.Method != "":
		c.handleNotification(m)
	case len(m.ID) > 0:
		c.handleResponse(m)
	default:
		c.log.Warn("agent message has neither method nor id", "bytes", len(line))
	}
}

func (c *Client) handleResponse(m message) {
	id, err := strconv.ParseInt(string(m.ID), 10, 64)
	if err != nil {
		c.log.Warn("agent answered an id the client never sent", "bytes", len(m.ID))
		return
	}
	c.mu.Lock()
	ch := c.pending[id]
	delete(c.pending, id)
	var p *promptState
	if id == c.promptID && c.prompt != nil {
		// Every update before the answer has been handled (one reader):
		// the prompt's open message ends here; later updates belong to
		// nobody.
		p = c.prompt
		c.prompt = nil
	}
	c.mu.Unlock()
	if p != nil {
		p.flush()
		p.cancelPermissions()
	}
	if ch == nil {
		return
	}
	if m.Error != nil {
		ch <- response{err: m.Error}
		return
	}
	ch <- response{result: m.Result}
}

func (c *Client) handleNotification(m message) {
	if m.Method != "session/update" {
		c.log.Debug("agent notification ignored", "method", m.Method)
		return
	}
	var params struct {
		SessionID string          `json:"sessionId"`
		Update    json.RawMessage `json:"update"`
	}
	if err := json.Unmarshal(m.Params, &params); err != nil {
		c.log.Warn("session/update params not understood", "err", shortErr(err))
		return
	}
	c.mu.Lock()
	p := c.prompt
	if p == nil {
		c.ignored++
		c.lastIgn = time.Now()
	}
	c.mu.Unlock()
	if p == nil {
		// Before the first prompt (a load's replay, which some agents
		// continue after answering) or after a prompt ended.
		return
	}
	p.update(params.Update, c.log)
}

func (c *Client) handleRequest(m message) {
	switch m.Method {
	case "session/request_permission":
		c.mu.Lock()
		p := c.prompt
		c.mu.Unlock()
		var req permissionParams
		if err := json.Unmarshal(m.Params, &req); err != nil {
			c.reply(m.ID, nil, &RPCError{Code: codeInvalidParams, Message: "invalid params: " + shortErr(err)})
			return
		}
		if p == nil {
			c.reply(m.ID, map[string]any{"outcome": map[string]string{"outcome": "cancelled"}}, nil)
			return
		}
		c.wg.Go(func() {
			optionID, ok := p.permission(req)
			if !ok {
				c.replyNow(m.ID, map[string]any{"outcome": map[string]string{"outcome": "cancelled"}}, nil)
				return
			}
			c.replyNow(m.ID, map[string]any{"outcome": map[string]string{"outcome": "selected", "optionId": optionID}}, nil)
		})
	default:
		// fs/* and terminal/* are not advertised.
		c.reply(m.ID, nil, &RPCError{Code: codeMethodNotFound, Message: "method not found: " + m.Method})
	}
}

// reply answers a request of the agent on its own goroutine: the read loop
// never waits on a write to an agent that is busy writing.
func (c *Client) reply(id json.RawMessage, result any, rerr *RPCError) {
	c.wg.Go(func() { c.replyNow(id, result, rerr) })
}

func (c *Client) replyNow(id json.RawMessage, result any, rerr *RPCError) {
	m := message{ID: id, Error: rerr}
	if rerr == nil {
		b, err := json.Marshal(result)
		if err != nil {
			return
		}
		m.Result = b
	}
	if err := c.write(m); err != nil {
		c.log.Debug("answer the agent", "err", err)
	}
}

// shortErr bounds an error's text: a JSON error can quote input.
func shortErr(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
