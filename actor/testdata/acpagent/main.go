// Command acpagent is a scripted ACP agent for the actor's tests: it speaks
// ACP (JSON-RPC 2.0 over stdio) like a real agent and does what the last
// line of each prompt says, keeping its sessions in $FAKE_ACP_STATE so a
// later process can session/load them. $FAKE_ACP_LOAD=1 advertises
// loadSession.
//
// Prompt commands (the last line of the prompt text):
//
//	chunks N  an answer in N message chunks
//	tool      a message, a tool call with a diff, its completion, a message
//	bulk N    N tool calls, each after a message: a diff or output, six
//	          updates with output, its completion and a plan (ten events each)
//	gemini    a tool call reported only through tool_call_update
//	plan      a plan
//	ask       a permission request; the answer says the option chosen
//	sleep     waits for session/cancel
//	crash     writes to stderr and exits 3 in the middle of the turn
//	recall    says the earlier prompts it knows and the transcript it got
//	mode      says the session mode set with session/set_mode
//	mcp       says the MCP servers of session/new or session/load: name(type)
//	forget    forgets its sessions (an agent home that was lost)
//	garbage   writes a line that is not JSON and a 10 MB message, then answers
//	anything else is echoed
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

type msg struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   any             `json:"error,omitempty"`
}

var (
	outMu     sync.Mutex
	out       = bufio.NewWriter(os.Stdout)
	sessionID string
	state     = os.Getenv("FAKE_ACP_STATE")

	mode      = "default"
	mcp       string // the MCP servers of session/new or session/load: "name(type) …"
	mu        sync.Mutex
	waiting   = map[string]chan json.RawMessage{} // permission requests by id
	cancelled = make(chan struct{}, 1)
)

func send(m msg) {
	m.JSONRPC = "2.0"
	b, _ := json.Marshal(m)
	outMu.Lock()
	defer outMu.Unlock()
	out.Write(append(b, '\n'))
	out.Flush()
}

func answer(id json.RawMessage, result any) {
	b, _ := json.Marshal(result)
	send(msg{ID: id, Result: b})
}

func update(u map[string]any) {
	b, _ := json.Marshal(map[string]any{"sessionId": sessionID, "update": u})
	send(msg{Method: "session/update", Params: b})
}

func chunk(kind, text string) {
	update(map[string]any{"sessionUpdate": kind, "content": map[string]any{"type": "text", "text": text}})
}

func prompts(id string) []string {
	b, err := os.ReadFile(filepath.Join(state, id))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func record(id, prompt string) {
	f, err := os.OpenFile(filepath.Join(state, id), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "record:", err)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, strings.ReplaceAll(prompt, "\n", " / "))
}

func main() {
	fmt.Fprintln(os.Stderr, "acpagent starting")
	os.MkdirAll(state, 0o755)
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		var m msg
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		switch {
		case m.Method == "" && len(m.ID) > 0: // an answer to a permission request
			mu.Lock()
			ch := waiting[string(m.ID)]
			mu.Unlock()
			if ch != nil {
				ch <- m.Result
			}
		case m.Method == "initialize":
			answer(m.ID, map[string]any{"protocolVersion": 1,
				"agentCapabilities": map[string]any{"loadSession": os.Getenv("FAKE_ACP_LOAD") == "1", "mcpCapabilities": map[string]any{"http": true}}})
		case m.Method == "session/new" || m.Method == "session/load":
			var p struct {
				SessionID  string                                      `json:"sessionId"`
				MCPServers []struct{ Name, Type, Command, URL string } `json:"mcpServers"`
			}
			json.Unmarshal(m.Params, &p)
			var names []string
			for _, s := range p.MCPServers {
				typ := s.Type
				if typ == "" {
					typ = "stdio:" + s.Command
				}
				names = append(names, s.Name+"("+typ+")")
			}
			mcp = strings.Join(names, " ")
			if m.Method == "session/new" {
				sessionID = "fake-" + strconv.FormatInt(time.Now().UnixNano(), 36)
				os.WriteFile(filepath.Join(state, sessionID), nil, 0o644)
				answer(m.ID, map[string]any{"sessionId": sessionID})
				continue
			}
			if _, err := os.Stat(filepath.Join(state, p.SessionID)); err != nil {
				send(msg{ID: m.ID, Error: map[string]any{"code": -32002, "message": "session not found"}})
				continue
			}
			sessionID = p.SessionID
			for _, pr := range prompts(sessionID) {
				chunk("user_message_chunk", pr)
				chunk("agent_message_chunk", "replayed answer to "+pr)
			}
			answer(m.ID, nil)
			chunk("agent_message_chunk", "late replay") // Gemini CLI keeps replaying
		case m.Method == "session/set_mode":
			var p struct {
				ModeID string `json:"modeId"`
			}
			json.Unmarshal(m.Params, &p)
			mode = p.ModeID
			answer(m.ID, map[string]any{})
		case m.Method == "session/cancel":
			select {
			case cancelled <- struct{}{}:
			default:
			}
		case m.Method == "session/prompt":
			var p struct {
				Prompt []struct{ Text string } `json:"prompt"`
			}
			json.Unmarshal(m.Params, &p)
			go prompt(m.ID, p.Prompt[0].Text)
		}
	}
}

func prompt(id json.RawMessage, text string) {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	cmd := lines[len(lines)-1]
	earlier := prompts(sessionID)
	record(sessionID, cmd)
	stop := "end_turn"
	switch f := strings.Fields(cmd); {
	case len(f) == 2 && f[0] == "chunks":
		n, _ := strconv.Atoi(f[1])
		for i := range n {
			chunk("agent_message_chunk", fmt.Sprintf("w%d ", i))
		}
	case cmd == "tool":
		chunk("agent_message_chunk", "Editing a.txt.")
		update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": "call-1", "title": "Edit a.txt", "kind": "edit", "status": "pending",
			"content": []any{map[string]any{"type": "diff", "path": "/workspace/a.txt", "oldText": "old\n", "newText": "new\n"}}})
		os.WriteFile("/workspace/a.txt", []byte("new\n"), 0o644)
		update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "call-1", "status": "completed"})
		chunk("agent_message_chunk", "Done.")
	case len(f) == 2 && f[0] == "bulk":
		n, _ := strconv.Atoi(f[1])
		old := strings.Repeat("line\n", 40)
		for i := range n {
			chunk("agent_message_chunk", fmt.Sprintf("## Step %d\n\nNext: `call-%d`.", i, i))
			id := fmt.Sprintf("call-%d", i)
			content := []any{map[string]any{"type": "diff", "path": fmt.Sprintf("/workspace/f%d.go", i%50), "oldText": old, "newText": old + "added\n"}}
			if i%2 == 1 {
				content = []any{map[string]any{"type": "content", "content": map[string]any{"type": "text", "text": strings.Repeat("out\n", 60)}}}
			}
			update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": id, "title": "Step " + id, "kind": "edit", "status": "in_progress", "content": content})
			for k := range 6 {
				update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "in_progress",
					"content": []any{map[string]any{"type": "content", "content": map[string]any{"type": "text", "text": fmt.Sprintf("out %d\n", k)}}}})
			}
			update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "completed"})
			update(map[string]any{"sessionUpdate": "plan", "entries": []any{map[string]any{"content": id, "status": "completed", "priority": "high"}}})
		}
		chunk("agent_message_chunk", "Done.")
	case cmd == "gemini":
		update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "g-1", "title": "ls", "kind": "execute", "status": "in_progress"})
		update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "g-1", "status": "completed"})
	case cmd == "forget":
		os.RemoveAll(state)
		chunk("agent_message_chunk", "forgotten")
	case cmd == "garbage":
		outMu.Lock()
		out.WriteString("this is not JSON-RPC\n")
		out.WriteString(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"x","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"`)
		out.WriteString(strings.Repeat("x", 10<<20))
		out.WriteString("\"}}}}\n")
		out.Flush()
		outMu.Unlock()
		chunk("agent_message_chunk", "still here")
	case cmd == "mode":
		chunk("agent_message_chunk", "mode: "+mode)
	case cmd == "mcp":
		chunk("agent_message_chunk", "mcp: "+mcp)
	case cmd == "plan":
		update(map[string]any{"sessionUpdate": "plan", "entries": []any{map[string]any{"content": "step", "status": "pending", "priority": "high"}}})
	case cmd == "ask":
		ch := make(chan json.RawMessage, 1)
		rid := strconv.Quote("perm-" + strconv.FormatInt(time.Now().UnixNano(), 36))
		mu.Lock()
		waiting[rid] = ch
		mu.Unlock()
		params, _ := json.Marshal(map[string]any{"sessionId": sessionID,
			"toolCall": map[string]any{"toolCallId": "call-rm", "title": "rm -rf build", "kind": "execute"},
			"options": []any{
				map[string]any{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
				map[string]any{"optionId": "always", "name": "Always allow", "kind": "allow_always"},
				map[string]any{"optionId": "reject", "name": "Reject", "kind": "reject_once"},
			}})
		send(msg{ID: json.RawMessage(rid), Method: "session/request_permission", Params: params})
		res := <-ch
		var r struct {
			Outcome struct{ Outcome, OptionID string } `json:"outcome"`
		}
		json.Unmarshal(res, &r)
		if r.Outcome.Outcome == "cancelled" {
			chunk("agent_message_chunk", "permission cancelled")
			stop = "cancelled"
		} else {
			chunk("agent_message_chunk", "chose "+r.Outcome.OptionID)
		}
	case cmd == "sleep":
		chunk("agent_message_chunk", "sleeping")
		select {
		case <-cancelled:
			stop = "cancelled"
		case <-time.After(time.Minute):
		}
	case cmd == "crash":
		chunk("agent_message_chunk", "about to crash")
		fmt.Fprintln(os.Stderr, "fatal: the fake agent crashed on purpose")
		os.Exit(3)
	case cmd == "recall":
		var t []string
		for _, l := range lines[:len(lines)-1] {
			if strings.HasPrefix(l, "User ") {
				t = append(t, l)
			}
		}
		chunk("agent_message_chunk", fmt.Sprintf("known: %s; transcript: %s", strings.Join(earlier, ","), strings.Join(t, " | ")))
	default:
		chunk("agent_message_chunk", "echo: "+cmd)
	}
	answer(id, map[string]any{"stopReason": stop})
}
