// Package modeltest is a scripted language-model server for tests: it plays
// the vendors' HTTP APIs as they document them, streaming included, on a
// loopback port, and answers each request with the next reply of a script
// the test writes.
//
// APIs served (paths are matched by suffix, so a base URL with a prefix
// works too):
//
//   - Anthropic Messages: POST /v1/messages (SSE when "stream":true:
//     message_start, content_block_start, content_block_delta with
//     text_delta / input_json_delta / thinking_delta + signature_delta,
//     content_block_stop, message_delta with usage, message_stop), POST
//     /v1/messages/count_tokens, and GET /v1/models in Anthropic's shape when
//     the request carries anthropic-version or x-api-key.
//   - OpenAI Chat Completions: POST /v1/chat/completions (chunks ending in
//     data: [DONE]; tool_calls deltas; usage in a last chunk with empty
//     choices when stream_options.include_usage).
//   - OpenAI Responses: POST /v1/responses (response.created,
//     response.in_progress, response.output_item.added,
//     response.content_part.added, response.output_text.delta,
//     response.function_call_arguments.delta, ….done,
//     response.output_item.done, response.completed with usage).
//   - Gemini: POST /v1beta/models/{model}:generateContent,
//     :streamGenerateContent (?alt=sse for SSE, a JSON array without it),
//     :countTokens, and GET /v1beta/models.
//
// A test scripts the answers:
//
//	m := modeltest.New(t)
//	m.Push(modeltest.Tool("Write", map[string]any{"file_path": "/workspace/a", "content": "hi"}),
//		modeltest.Text("done"))
//	// point the agent (or the gateway) at m.URL …
//	reqs := m.Requests() // what reached the server: headers, bodies
//
// Each request that Match accepts (all by default) takes the next reply of
// the queue; when the queue is empty, or for requests Match refuses (an
// agent's side requests such as title generation: see HasTools), the
// default reply (Text("ok") unless SetDefault changed it) answers. Replies
// are rendered in the shape of the API the request came to, so one script
// serves every agent.
package modeltest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// API names the vendor API a request came to.
type API string

// The APIs the server plays.
const (
	Anthropic       API = "anthropic"        // Messages
	OpenAIChat      API = "openai-chat"      // Chat Completions
	OpenAIResponses API = "openai-responses" // Responses
	Gemini          API = "gemini"           // generateContent
)

// Reply is one scripted answer. Its parts are sent in order: Thinking, then
// the text (Text, or Chunks one delta each), then each tool call.
type Reply struct {
	// Thinking is reasoning text: an Anthropic thinking block, a Gemini
	// thought part; other APIs leave it out.
	Thinking string
	// Text is the answer's text, sent as one delta.
	Text string
	// Chunks, when set, is the answer's text as separate deltas (streamed
	// one event each, flushed one by one); Text is then ignored.
	Chunks []string
	// Tools are tool calls the model makes after its text.
	Tools []ToolCall
	// Usage overrides the usage reported; by default input tokens are the
	// request body's length / 4 and output tokens the reply's length / 4,
	// at least 1 each.
	Usage *Usage
	// Status, when not 0 or 200, answers with that HTTP status and the
	// API's own error shape carrying ErrorMessage.
	Status       int
	ErrorMessage string
	// Wait, when set, holds the answer until it is closed (or the request
	// is abandoned): a turn that is still thinking.
	Wait <-chan struct{}
}

// ToolCall is a function call the model makes.
type ToolCall struct {
	Name string
	// Input is the call's arguments, a JSON object.
	Input json.RawMessage
}

// Usage is the token usage reported with a reply.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
	CachedTokens int64
}

// Text is a reply with text only.
func Text(s string) Reply { return Reply{Text: s} }

// Tool is a reply making one tool call; input is marshalled to JSON and
// must be an object.
func Tool(name string, input any) Reply {
	b, err := json.Marshal(input)
	if err != nil {
		panic(fmt.Sprintf("modeltest: tool input: %v", err))
	}
	return Reply{Tools: []ToolCall{{Name: name, Input: b}}}
}

// Request is a request the server received.
type Request struct {
	API      API
	Method   string
	Path     string
	RawQuery string
	Header   http.Header
	Body     []byte
	// Model is the model asked for (from the body, or Gemini's path).
	Model string
	// Stream reports whether a streamed answer was asked for.
	Stream bool
	// HasTools reports whether the request declares tools.
	HasTools bool
	// Scripted reports whether the request took a reply from the queue.
	Scripted bool
}

// HasTools is a Match function taking queue replies only for requests that
// declare tools: an agent's main loop, not its side requests.
func HasTools(r *Request) bool { return r.HasTools }

// Server is the scripted model server.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT, without /v1.
	URL string
	srv *httptest.Server

	mu       sync.Mutex
	queue    []Reply               // guarded by mu
	def      Reply                 // guarded by mu
	match    func(r *Request) bool // guarded by mu
	requests []Request             // guarded by mu
	ids      int                   // guarded by mu
	models   []string              // guarded by mu
}

// New starts a server on loopback; it closes when the test ends.
func New(tb testing.TB) *Server {
	tb.Helper()
	s := NewServer()
	tb.Cleanup(s.Close)
	return s
}

// NewServer starts a server on loopback, for use outside a test (a
// benchmark program); Close stops it.
func NewServer() *Server {
	s := &Server{def: Text("ok"), models: []string{"claude-sonnet-4-5", "gpt-5", "gemini-2.5-pro"}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close stops the server, ending any answer in progress.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Push appends replies to the script.
func (s *Server) Push(replies ...Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, replies...)
}

// SetDefault sets the reply given when the queue is empty or Match refuses
// a request.
func (s *Server) SetDefault(r Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.def = r
}

// Match sets which requests take replies from the queue (nil: all).
func (s *Server) Match(f func(r *Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.match = f
}

// SetModels sets the model ids the models endpoints list.
func (s *Server) SetModels(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models = ids
}

// Pending is the number of scripted replies not yet given.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Requests returns copies of the requests received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Reset empties the script and the recorded requests.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue, s.requests = nil, nil
}

// reqBody is what the server reads from request bodies.
type reqBody struct {
	Model         string          `json:"model"`
	Stream        bool            `json:"stream"`
	Tools         json.RawMessage `json:"tools"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	req := Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: body}
	var rb reqBody
	if len(body) > 0 {
		if err := json.Unmarshal(body, &rb); err != nil && r.Method == http.MethodPost {
			s.record(&req, false)
			writeError(w, apiOf(r.URL.Path), http.StatusBadRequest, "modeltest: request body is not JSON: "+err.Error())
			return
		}
	}
	req.Model, req.Stream = rb.Model, rb.Stream
	req.HasTools = len(rb.Tools) > 0 && !bytes.Equal(rb.Tools, []byte("null")) && !bytes.Equal(rb.Tools, []byte("[]"))
	p := r.URL.Path
	switch {
	case r.Method == http.MethodGet && strings.HasSuffix(p, "/v1/models"):
		s.record(&req, false)
		s.listModels(w, r)
	case r.Method == http.MethodGet && strings.HasSuffix(p, "/v1beta/models"):
		req.API = Gemini
		s.record(&req, false)
		s.listGeminiModels(w)
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/v1/messages/count_tokens"):
		req.API = Anthropic
		s.record(&req, false)
		writeJSON(w, map[string]any{"input_tokens": max(1, len(body)/4)})
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/v1/messages"):
		req.API = Anthropic
		s.answer(w, r, &req, func(rep Reply, u Usage) { s.anthropic(w, &req, rep, u) })
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/v1/chat/completions"):
		req.API = OpenAIChat
		s.answer(w, r, &req, func(rep Reply, u Usage) { s.chat(w, &req, rep, u, rb.StreamOptions.IncludeUsage) })
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/v1/responses"):
		req.API = OpenAIResponses
		s.answer(w, r, &req, func(rep Reply, u Usage) { s.responses(w, &req, rep, u) })
	case r.Method == http.MethodPost && strings.Contains(p, "/models/") && strings.Contains(p, ":"):
		req.API = Gemini
		model, method, _ := strings.Cut(p[strings.LastIndex(p, "/models/")+len("/models/"):], ":")
		req.Model = model
		switch method {
		case "countTokens":
			s.record(&req, false)
			writeJSON(w, map[string]any{"totalTokens": max(1, len(body)/4)})
		case "generateContent", "streamGenerateContent":
			req.Stream = method == "streamGenerateContent"
			sse := r.URL.Query().Get("alt") == "sse"
			s.answer(w, r, &req, func(rep Reply, u Usage) { s.gemini(w, &req, rep, u, sse) })
		default:
			s.record(&req, false)
			writeError(w, Gemini, http.StatusNotFound, "modeltest: unknown method "+method)
		}
	default:
		s.record(&req, false)
		writeError(w, apiOf(p), http.StatusNotFound, "modeltest: no API at "+r.Method+" "+p)
	}
}

// apiOf guesses the API family of a path, for error shapes.
func apiOf(p string) API {
	switch {
	case strings.Contains(p, "/messages"):
		return Anthropic
	case strings.Contains(p, "/v1beta/"):
		return Gemini
	default:
		return OpenAIChat
	}
}

// record stores req, taking a reply from the queue when scripted.
func (s *Server) record(req *Request, scripted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req.Scripted = scripted
	s.requests = append(s.requests, *req)
}

// next records req and picks its reply.
func (s *Server) next(req *Request) Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := s.def
	if len(s.queue) > 0 && (s.match == nil || s.match(req)) {
		rep, s.queue = s.queue[0], s.queue[1:]
		req.Scripted = true
	}
	s.requests = append(s.requests, *req)
	return rep
}

// id returns a fresh id with prefix.
func (s *Server) id(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids++
	return fmt.Sprintf("%s%024d", prefix, s.ids)
}

func (s *Server) answer(w http.ResponseWriter, r *http.Request, req *Request, render func(Reply, Usage)) {
	rep := s.next(req)
	if rep.Wait != nil {
		select {
		case <-rep.Wait:
		case <-r.Context().Done():
			return
		}
	}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		msg := rep.ErrorMessage
		if msg == "" {
			msg = http.StatusText(rep.Status)
		}
		writeError(w, req.API, rep.Status, msg)
		return
	}
	u := Usage{InputTokens: int64(max(1, len(req.Body)/4)), OutputTokens: int64(max(1, replyLen(rep)/4))}
	if rep.Usage != nil {
		u = *rep.Usage
	}
	render(rep, u)
}

func replyLen(rep Reply) int {
	n := len(rep.Thinking) + len(rep.Text)
	if rep.Chunks != nil {
		n = len(rep.Thinking)
		for _, c := range rep.Chunks {
			n += len(c)
		}
	}
	for _, t := range rep.Tools {
		n += len(t.Name) + len(t.Input)
	}
	return n
}

// chunks is the reply's text as deltas.
func chunks(rep Reply) []string {
	if rep.Chunks != nil {
		return rep.Chunks
	}
	if rep.Text == "" {
		return nil
	}
	return []string{rep.Text}
}

func input(t ToolCall) json.RawMessage {
	if len(t.Input) == 0 {
		return json.RawMessage("{}")
	}
	return t.Input
}

// sse writes server-sent events, flushing each.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func startSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	return &sse{w: w, f: f}
}

// event writes one event; name "" writes a data-only event.
func (e *sse) event(name string, data any) {
	var b []byte
	switch d := data.(type) {
	case string:
		b = []byte(d)
	default:
		var err error
		if b, err = json.Marshal(d); err != nil {
			panic(err)
		}
	}
	if name != "" {
		fmt.Fprintf(e.w, "event: %s\n", name)
	}
	fmt.Fprintf(e.w, "data: %s\n\n", b)
	if e.f != nil {
		e.f.Flush()
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// writeError answers with status in api's documented error shape.
func writeError(w http.ResponseWriter, api API, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(ErrorBody(api, status, msg))
}

// ErrorBody is the JSON error body api documents for an HTTP status.
func ErrorBody(api API, status int, msg string) any {
	switch api {
	case Anthropic:
		return map[string]any{"type": "error", "error": map[string]any{"type": anthropicErrorType(status), "message": msg}}
	case Gemini:
		return map[string]any{"error": map[string]any{"code": status, "message": msg, "status": geminiStatus(status)}}
	default:
		typ, code := openAIErrorType(status)
		return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}}
	}
}

func anthropicErrorType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	default:
		return "api_error"
	}
}

func openAIErrorType(status int) (typ string, code any) {
	switch status {
	case 400, 404, 413:
		return "invalid_request_error", nil
	case 401:
		return "invalid_request_error", "invalid_api_key"
	case 429:
		return "requests", "rate_limit_exceeded"
	default:
		return "server_error", nil
	}
}

func geminiStatus(status int) string {
	switch status {
	case 400, 413:
		return "INVALID_ARGUMENT"
	case 401:
		return "UNAUTHENTICATED"
	case 403:
		return "PERMISSION_DENIED"
	case 404:
		return "NOT_FOUND"
	case 429:
		return "RESOURCE_EXHAUSTED"
	case 503:
		return "UNAVAILABLE"
	default:
		return "INTERNAL"
	}
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	ids := append([]string(nil), s.models...)
	s.mu.Unlock()
	if r.Header.Get("anthropic-version") != "" || r.Header.Get("x-api-key") != "" {
		data := []map[string]any{}
		for _, id := range ids {
			data = append(data, map[string]any{"type": "model", "id": id, "display_name": id, "created_at": "2025-01-01T00:00:00Z"})
		}
		first, last := "", ""
		if len(ids) > 0 {
			first, last = ids[0], ids[len(ids)-1]
		}
		writeJSON(w, map[string]any{"data": data, "has_more": false, "first_id": first, "last_id": last})
		return
	}
	data := []map[string]any{}
	for _, id := range ids {
		data = append(data, map[string]any{"id": id, "object": "model", "created": 1735689600, "owned_by": "modeltest"})
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func (s *Server) listGeminiModels(w http.ResponseWriter) {
	s.mu.Lock()
	ids := append([]string(nil), s.models...)
	s.mu.Unlock()
	models := []map[string]any{}
	for _, id := range ids {
		models = append(models, map[string]any{
			"name": "models/" + id, "displayName": id, "inputTokenLimit": 1048576, "outputTokenLimit": 65536,
			"supportedGenerationMethods": []string{"generateContent", "countTokens"},
		})
	}
	writeJSON(w, map[string]any{"models": models})
}

// anthropic answers a Messages request.
func (s *Server) anthropic(w http.ResponseWriter, req *Request, rep Reply, u Usage) {
	model := req.Model
	msgID := s.id("msg_")
	stop := "end_turn"
	if len(rep.Tools) > 0 {
		stop = "tool_use"
	}
	toolIDs := make([]string, len(rep.Tools))
	for i := range rep.Tools {
		toolIDs[i] = s.id("toolu_")
	}
	usage := map[string]any{"input_tokens": u.InputTokens, "output_tokens": u.OutputTokens,
		"cache_creation_input_tokens": 0, "cache_read_input_tokens": u.CachedTokens}
	if !req.Stream {
		content := []any{}
		if rep.Thinking != "" {
			content = append(content, map[string]any{"type": "thinking", "thinking": rep.Thinking, "signature": "modeltest"})
		}
		if t := strings.Join(chunks(rep), ""); t != "" {
			content = append(content, map[string]any{"type": "text", "text": t})
		}
		for i, t := range rep.Tools {
			content = append(content, map[string]any{"type": "tool_use", "id": toolIDs[i], "name": t.Name, "input": input(t)})
		}
		writeJSON(w, map[string]any{"id": msgID, "type": "message", "role": "assistant", "model": model,
			"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": usage})
		return
	}
	e := startSSE(w)
	e.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": msgID, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": u.InputTokens, "output_tokens": 1,
			"cache_creation_input_tokens": 0, "cache_read_input_tokens": u.CachedTokens},
	}})
	index := 0
	block := func(start map[string]any, deltas []map[string]any) {
		e.event("content_block_start", map[string]any{"type": "content_block_start", "index": index, "content_block": start})
		for _, d := range deltas {
			e.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": index, "delta": d})
		}
		e.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	if rep.Thinking != "" {
		block(map[string]any{"type": "thinking", "thinking": ""}, []map[string]any{
			{"type": "thinking_delta", "thinking": rep.Thinking},
			{"type": "signature_delta", "signature": "modeltest"},
		})
	}
	if cs := chunks(rep); len(cs) > 0 {
		e.event("ping", map[string]any{"type": "ping"})
		deltas := make([]map[string]any, len(cs))
		for i, c := range cs {
			deltas[i] = map[string]any{"type": "text_delta", "text": c}
		}
		block(map[string]any{"type": "text", "text": ""}, deltas)
	}
	for i, t := range rep.Tools {
		block(map[string]any{"type": "tool_use", "id": toolIDs[i], "name": t.Name, "input": map[string]any{}},
			[]map[string]any{{"type": "input_json_delta", "partial_json": string(input(t))}})
	}
	e.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": u.OutputTokens}})
	e.event("message_stop", map[string]any{"type": "message_stop"})
}

// chat answers a Chat Completions request.
func (s *Server) chat(w http.ResponseWriter, req *Request, rep Reply, u Usage, includeUsage bool) {
	id := s.id("chatcmpl-")
	created := time.Now().Unix()
	finish := "stop"
	if len(rep.Tools) > 0 {
		finish = "tool_calls"
	}
	callIDs := make([]string, len(rep.Tools))
	for i := range rep.Tools {
		callIDs[i] = s.id("call_")
	}
	usage := map[string]any{"prompt_tokens": u.InputTokens, "completion_tokens": u.OutputTokens,
		"total_tokens":              u.InputTokens + u.OutputTokens,
		"prompt_tokens_details":     map[string]any{"cached_tokens": u.CachedTokens},
		"completion_tokens_details": map[string]any{"reasoning_tokens": 0}}
	if !req.Stream {
		msg := map[string]any{"role": "assistant", "content": nil, "refusal": nil}
		if t := strings.Join(chunks(rep), ""); t != "" {
			msg["content"] = t
		}
		if len(rep.Tools) > 0 {
			calls := []any{}
			for i, t := range rep.Tools {
				calls = append(calls, map[string]any{"id": callIDs[i], "type": "function",
					"function": map[string]any{"name": t.Name, "arguments": string(input(t))}})
			}
			msg["tool_calls"] = calls
		}
		writeJSON(w, map[string]any{"id": id, "object": "chat.completion", "created": created, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": finish}},
			"usage":   usage})
		return
	}
	e := startSSE(w)
	chunk := func(delta map[string]any, finish any) {
		e.event("", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model,
			"system_fingerprint": nil,
			"choices":            []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}})
	}
	chunk(map[string]any{"role": "assistant", "content": ""}, nil)
	for _, c := range chunks(rep) {
		chunk(map[string]any{"content": c}, nil)
	}
	for i, t := range rep.Tools {
		chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": callIDs[i], "type": "function",
			"function": map[string]any{"name": t.Name, "arguments": ""}}}}, nil)
		chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i,
			"function": map[string]any{"arguments": string(input(t))}}}}, nil)
	}
	chunk(map[string]any{}, finish)
	if includeUsage {
		e.event("", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model,
			"system_fingerprint": nil, "choices": []any{}, "usage": usage})
	}
	e.event("", "[DONE]")
}

// responses answers a Responses request.
func (s *Server) responses(w http.ResponseWriter, req *Request, rep Reply, u Usage) {
	respID := s.id("resp_")
	created := time.Now().Unix()
	var output []any
	type item struct {
		id     string
		done   map[string]any
		deltas []string
		call   bool
	}
	var items []item
	if cs := chunks(rep); len(cs) > 0 {
		id := s.id("msg_")
		text := strings.Join(cs, "")
		done := map[string]any{"id": id, "type": "message", "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
		items = append(items, item{id: id, done: done, deltas: cs})
	}
	for _, t := range rep.Tools {
		id := s.id("fc_")
		done := map[string]any{"id": id, "type": "function_call", "status": "completed", "call_id": s.id("call_"),
			"name": t.Name, "arguments": string(input(t))}
		items = append(items, item{id: id, done: done, deltas: []string{string(input(t))}, call: true})
	}
	for _, it := range items {
		output = append(output, it.done)
	}
	if output == nil {
		output = []any{}
	}
	usage := map[string]any{"input_tokens": u.InputTokens,
		"input_tokens_details": map[string]any{"cached_tokens": u.CachedTokens},
		"output_tokens":        u.OutputTokens, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens": u.InputTokens + u.OutputTokens}
	response := func(status string, out []any, usage any) map[string]any {
		return map[string]any{"id": respID, "object": "response", "created_at": created, "status": status,
			"error": nil, "incomplete_details": nil, "model": req.Model, "output": out,
			"parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}, "usage": usage}
	}
	if !req.Stream {
		writeJSON(w, response("completed", output, usage))
		return
	}
	e := startSSE(w)
	seq := 0
	ev := func(typ string, fields map[string]any) {
		fields["type"] = typ
		fields["sequence_number"] = seq
		seq++
		e.event(typ, fields)
	}
	ev("response.created", map[string]any{"response": response("in_progress", []any{}, nil)})
	ev("response.in_progress", map[string]any{"response": response("in_progress", []any{}, nil)})
	for i, it := range items {
		if it.call {
			added := map[string]any{}
			for k, v := range it.done {
				added[k] = v
			}
			added["status"], added["arguments"] = "in_progress", ""
			ev("response.output_item.added", map[string]any{"output_index": i, "item": added})
			for _, d := range it.deltas {
				ev("response.function_call_arguments.delta", map[string]any{"item_id": it.id, "output_index": i, "delta": d})
			}
			ev("response.function_call_arguments.done", map[string]any{"item_id": it.id, "output_index": i,
				"arguments": it.done["arguments"]})
		} else {
			ev("response.output_item.added", map[string]any{"output_index": i, "item": map[string]any{
				"id": it.id, "type": "message", "status": "in_progress", "role": "assistant", "content": []any{}}})
			ev("response.content_part.added", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0,
				"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
			text := strings.Join(it.deltas, "")
			for _, d := range it.deltas {
				ev("response.output_text.delta", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0,
					"delta": d, "logprobs": []any{}})
			}
			ev("response.output_text.done", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0,
				"text": text, "logprobs": []any{}})
			ev("response.content_part.done", map[string]any{"item_id": it.id, "output_index": i, "content_index": 0,
				"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}})
		}
		ev("response.output_item.done", map[string]any{"output_index": i, "item": it.done})
	}
	ev("response.completed", map[string]any{"response": response("completed", output, usage)})
}

// gemini answers generateContent / streamGenerateContent.
func (s *Server) gemini(w http.ResponseWriter, req *Request, rep Reply, u Usage, sse bool) {
	respID := s.id("")
	finish := "STOP"
	usage := func(out int64) map[string]any {
		return map[string]any{"promptTokenCount": u.InputTokens, "candidatesTokenCount": out,
			"totalTokenCount": u.InputTokens + out, "cachedContentTokenCount": u.CachedTokens}
	}
	resp := func(parts []any, finish string, out int64) map[string]any {
		cand := map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "index": 0}
		if finish != "" {
			cand["finishReason"] = finish
		}
		return map[string]any{"candidates": []any{cand}, "usageMetadata": usage(out),
			"modelVersion": req.Model, "responseId": respID}
	}
	var thought, calls []any
	if rep.Thinking != "" {
		thought = append(thought, map[string]any{"text": rep.Thinking, "thought": true})
	}
	for _, t := range rep.Tools {
		calls = append(calls, map[string]any{"functionCall": map[string]any{"name": t.Name, "args": input(t)}})
	}
	if !req.Stream {
		parts := append([]any{}, thought...)
		if t := strings.Join(chunks(rep), ""); t != "" {
			parts = append(parts, map[string]any{"text": t})
		}
		parts = append(parts, calls...)
		writeJSON(w, resp(parts, finish, u.OutputTokens))
		return
	}
	// Each streamed chunk carries usage so far; the last carries the
	// finish reason and the total.
	var msgs []map[string]any
	if thought != nil {
		msgs = append(msgs, resp(thought, "", 0))
	}
	for _, c := range chunks(rep) {
		msgs = append(msgs, resp([]any{map[string]any{"text": c}}, "", 0))
	}
	if calls != nil {
		msgs = append(msgs, resp(calls, "", 0))
	}
	if len(msgs) == 0 {
		msgs = append(msgs, resp([]any{map[string]any{"text": ""}}, "", 0))
	}
	last := msgs[len(msgs)-1]
	last["candidates"].([]any)[0].(map[string]any)["finishReason"] = finish
	last["usageMetadata"] = usage(u.OutputTokens)
	if !sse {
		// Without alt=sse the stream is one JSON array, written element by
		// element.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		f, _ := w.(http.Flusher)
		for i, m := range msgs {
			sep := ",\n"
			if i == 0 {
				sep = "["
			}
			b, _ := json.Marshal(m)
			fmt.Fprintf(w, "%s%s", sep, b)
			if f != nil {
				f.Flush()
			}
		}
		io.WriteString(w, "]")
		return
	}
	e := startSSE(w)
	for _, m := range msgs {
		e.event("", m)
	}
}
