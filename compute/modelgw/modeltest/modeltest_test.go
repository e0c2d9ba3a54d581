package modeltest_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute/modelgw/modeltest"
)

func post(t *testing.T, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// events reads an SSE body into (event name, data) pairs.
func events(t *testing.T, r io.Reader) (names []string, datas []string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			names = append(names, name)
			datas = append(datas, strings.TrimPrefix(line, "data: "))
			name = ""
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names, datas
}

func TestServer_AnthropicStream(t *testing.T) {
	m := modeltest.New(t)
	m.Push(modeltest.Reply{Thinking: "hmm", Chunks: []string{"a", "b", "c"},
		Tools: []modeltest.ToolCall{{Name: "Write", Input: json.RawMessage(`{"file_path":"x"}`)}},
		Usage: &modeltest.Usage{InputTokens: 7, OutputTokens: 9}})
	resp := post(t, m.URL+"/v1/messages", `{"model":"claude-x","stream":true,"tools":[{"name":"Write"}]}`, "x-api-key", "k1")
	names, datas := events(t, resp.Body)
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta",
		"content_block_stop", "ping", "content_block_start", "content_block_delta", "content_block_delta",
		"content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("events:\n%v\nwant\n%v", names, want)
	}
	var text, args string
	var tool struct{ ID, Name, Type string }
	for _, d := range datas {
		var ev struct {
			Type         string `json:"type"`
			ContentBlock struct {
				Type, ID, Name string
			} `json:"content_block"`
			Delta struct {
				Type, Text  string
				PartialJSON string `json:"partial_json"`
			} `json:"delta"`
			Usage struct {
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatal(err)
		}
		switch {
		case ev.Type == "content_block_start" && ev.ContentBlock.Type == "tool_use":
			tool.ID, tool.Name, tool.Type = ev.ContentBlock.ID, ev.ContentBlock.Name, ev.ContentBlock.Type
		case ev.Delta.Type == "text_delta":
			text += ev.Delta.Text
		case ev.Delta.Type == "input_json_delta":
			args += ev.Delta.PartialJSON
		case ev.Type == "message_delta" && ev.Usage.OutputTokens != 9:
			t.Errorf("message_delta usage %d, want 9", ev.Usage.OutputTokens)
		}
	}
	if text != "abc" || tool.Name != "Write" || !strings.HasPrefix(tool.ID, "toolu_") || args != `{"file_path":"x"}` {
		t.Fatalf("text %q tool %+v args %q", text, tool, args)
	}
	reqs := m.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("x-api-key") != "k1" || !reqs[0].Scripted || !reqs[0].HasTools ||
		reqs[0].API != modeltest.Anthropic || reqs[0].Model != "claude-x" {
		t.Fatalf("requests %+v", reqs)
	}
}

func TestServer_Default(t *testing.T) {
	m := modeltest.New(t)
	m.Match(modeltest.HasTools)
	m.Push(modeltest.Text("scripted"))
	// A request without tools takes the default reply and leaves the script.
	resp := post(t, m.URL+"/v1/messages", `{"model":"claude-x"}`)
	var msg struct {
		Content []struct{ Type, Text string }
	}
	json.NewDecoder(resp.Body).Decode(&msg)
	if len(msg.Content) != 1 || msg.Content[0].Text != "ok" || m.Pending() != 1 {
		t.Fatalf("got %+v pending %d", msg, m.Pending())
	}
}

func TestServer_ChatStream(t *testing.T) {
	m := modeltest.New(t)
	m.Push(modeltest.Tool("shell", map[string]any{"command": []string{"ls"}}))
	resp := post(t, m.URL+"/v1/chat/completions",
		`{"model":"gpt-x","stream":true,"stream_options":{"include_usage":true}}`, "Authorization", "Bearer k")
	_, datas := events(t, resp.Body)
	if datas[len(datas)-1] != "[DONE]" {
		t.Fatalf("last %q", datas[len(datas)-1])
	}
	var name, args, finish string
	var usage int64
	for _, d := range datas[:len(datas)-1] {
		var c struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				}
				FinishReason *string `json:"finish_reason"`
			}
			Usage *struct {
				TotalTokens int64 `json:"total_tokens"`
			}
		}
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage != nil {
			usage = c.Usage.TotalTokens
		}
		for _, ch := range c.Choices {
			for _, tc := range ch.Delta.ToolCalls {
				name += tc.Function.Name
				args += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if name != "shell" || args != `{"command":["ls"]}` || finish != "tool_calls" || usage == 0 {
		t.Fatalf("name %q args %q finish %q usage %d", name, args, finish, usage)
	}
}

func TestServer_ResponsesStream(t *testing.T) {
	m := modeltest.New(t)
	m.Push(modeltest.Reply{Text: "hi", Tools: []modeltest.ToolCall{{Name: "shell", Input: json.RawMessage(`{"command":["ls"]}`)}},
		Usage: &modeltest.Usage{InputTokens: 3, OutputTokens: 4, CachedTokens: 1}})
	resp := post(t, m.URL+"/v1/responses", `{"model":"gpt-x","stream":true}`)
	names, datas := events(t, resp.Body)
	if names[0] != "response.created" || names[len(names)-1] != "response.completed" {
		t.Fatalf("events %v", names)
	}
	var done struct {
		Response struct {
			Output []struct{ Type, CallID, Name, Arguments string }
			Usage  struct {
				InputTokens        int64 `json:"input_tokens"`
				OutputTokens       int64 `json:"output_tokens"`
				InputTokensDetails struct {
					CachedTokens int64 `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			}
		}
	}
	if err := json.Unmarshal([]byte(datas[len(datas)-1]), &done); err != nil {
		t.Fatal(err)
	}
	out := done.Response.Output
	u := done.Response.Usage
	if len(out) != 2 || out[0].Type != "message" || out[1].Type != "function_call" || out[1].Name != "shell" ||
		out[1].Arguments != `{"command":["ls"]}` || u.InputTokens != 3 || u.OutputTokens != 4 || u.InputTokensDetails.CachedTokens != 1 {
		t.Fatalf("completed %+v", done)
	}
	var callID struct {
		Item struct {
			CallID string `json:"call_id"`
		}
	}
	for i, n := range names {
		if n == "response.output_item.done" {
			json.Unmarshal([]byte(datas[i]), &callID)
		}
	}
	if !strings.HasPrefix(callID.Item.CallID, "call_") {
		t.Fatalf("call_id %q", callID.Item.CallID)
	}
}

func TestServer_Gemini(t *testing.T) {
	m := modeltest.New(t)
	m.Push(modeltest.Tool("write_file", map[string]any{"file_path": "a"}), modeltest.Text("done"))
	resp := post(t, m.URL+"/v1beta/models/gemini-x:streamGenerateContent?alt=sse", `{"contents":[]}`, "x-goog-api-key", "g")
	_, datas := events(t, resp.Body)
	var last struct {
		Candidates []struct {
			Content struct {
				Parts []struct {
					FunctionCall struct {
						Name string
						Args map[string]any
					}
				}
			}
			FinishReason string
		}
		UsageMetadata struct{ PromptTokenCount, CandidatesTokenCount int64 }
	}
	json.Unmarshal([]byte(datas[len(datas)-1]), &last)
	if last.Candidates[0].FinishReason != "STOP" || last.Candidates[0].Content.Parts[0].FunctionCall.Name != "write_file" ||
		last.UsageMetadata.CandidatesTokenCount == 0 {
		t.Fatalf("last chunk %+v", last)
	}
	resp = post(t, m.URL+"/v1beta/models/gemini-x:generateContent", `{"contents":[]}`)
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"text":"done"`) {
		t.Fatalf("generateContent %s", b)
	}
	if r := m.Requests(); r[0].Model != "gemini-x" || r[0].Header.Get("x-goog-api-key") != "g" {
		t.Fatalf("requests %+v", r)
	}
}

func TestServer_Errors(t *testing.T) {
	m := modeltest.New(t)
	m.Push(modeltest.Reply{Status: 529, ErrorMessage: "busy"})
	resp := post(t, m.URL+"/v1/messages", `{"model":"claude-x","stream":true}`)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 529 || !strings.Contains(string(b), `"overloaded_error"`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	r, err := http.Get(m.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var list struct {
		Object string
		Data   []struct{ ID string }
	}
	json.NewDecoder(r.Body).Decode(&list)
	if list.Object != "list" || len(list.Data) == 0 {
		t.Fatalf("models %+v", list)
	}
}
