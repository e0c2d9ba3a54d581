package session

import (
	"encoding/json"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// Settings are a session's own settings (PATCH /v1/sessions/{id}
// "settings"), as the Session object shows them back (an extension:
// "settings", omitted when the session has none of its own). Zero fields
// are the node's. The values of MCP servers' env and headers are never
// shown: they are replaced by RedactedValue.
type Settings struct {
	// Harness is a harness session's own harness: a template other than
	// the default ("shell") or a command, with its stdin form; nil for the
	// default and for an agent session (see Agent). Only the owner sees it
	// (Session.WithRole).
	Harness *Harness `json:"harness,omitempty"`
	// Agent is the session's agent (DESIGN §6); "" for a harness session.
	Agent          string `json:"agent,omitempty"`
	PermissionMode string `json:"permission_mode,omitempty"`
	// TurnTimeout is a duration ("10m").
	TurnTimeout string `json:"turn_timeout,omitempty"`
	// MemoryBytes and Pids limit the session's sandbox, at most the
	// node's limits (sandbox.memory_bytes, sandbox.pids).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int   `json:"pids,omitempty"`
	// DiskBytes is the size of the session's workspace, at most the
	// node's sandbox.workspace_disk_bytes.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// MCPServers are passed to the session's agent in session/new and
	// session/load.
	MCPServers []MCPServer `json:"mcp_servers,omitempty"`
	// Setup is a shell command run in /workspace before a turn when the
	// sandbox is new or files were written since it last succeeded.
	Setup string `json:"setup,omitempty"`
	// InvokeConcurrency caps the session's invokes running at once,
	// within the gateways' quotas.invokes_per_session.
	InvokeConcurrency int `json:"invoke_concurrency,omitempty"`
}

// IsZero reports whether s holds no setting.
func (s *Settings) IsZero() bool {
	return s == nil || s.Harness == nil && s.Agent == "" && s.PermissionMode == "" && s.TurnTimeout == "" && s.MemoryBytes == 0 && s.Pids == 0 && s.DiskBytes == 0 &&
		len(s.MCPServers) == 0 && s.Setup == "" && s.InvokeConcurrency == 0
}

// MCPServer is an MCP server an agent connects to, in ACP's shapes: stdio
// (Type "" or "stdio": Command, Args, Env, run inside the sandbox) or
// "http" / "sse" (URL, Headers; only for agents that advertise it).
type MCPServer struct {
	Name    string      `json:"name"`
	Type    string      `json:"type,omitempty"`
	Command string      `json:"command,omitempty"`
	Args    []string    `json:"args,omitempty"`
	Env     []NameValue `json:"env,omitempty"`
	URL     string      `json:"url,omitempty"`
	Headers []NameValue `json:"headers,omitempty"`
}

// NameValue is one environment variable or HTTP header of an MCPServer.
type NameValue struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// MCP server types.
const (
	MCPStdio = "stdio"
	MCPHTTP  = "http"
	MCPSSE   = "sse"
)

// Bounds of settings.
const (
	// MaxMCPServers bounds a session's MCP servers.
	MaxMCPServers = 16
	// MaxMCPServersBytes bounds their JSON encoding.
	MaxMCPServersBytes = 64 << 10
	// MaxSetupBytes bounds a setup command.
	MaxSetupBytes = 4 << 10
	// MinDiskBytes is the smallest settings.disk_bytes: an ext4 workspace
	// image smaller than this has little room for files.
	MinDiskBytes = 16 << 20
	// RedactedValue replaces the values of MCP servers' env and headers in
	// what is shown back.
	RedactedValue = "(hidden)"
)

// ServerType returns the server's type, MCPStdio when it names none.
func (m MCPServer) ServerType() string {
	if m.Type == "" {
		return MCPStdio
	}
	return m.Type
}

// ValidateMCPServers checks a session's MCP servers: at most MaxMCPServers,
// unique names, and the fields of each one's type (a stdio server has a
// command and no URL; an http or sse server an http(s) URL and no command).
func ValidateMCPServers(servers []MCPServer) error {
	if len(servers) > MaxMCPServers {
		return Errorf(CodeBadRequest, "settings: mcp_servers: %d servers, at most %d", len(servers), MaxMCPServers)
	}
	if b, _ := json.Marshal(servers); len(b) > MaxMCPServersBytes {
		return Errorf(CodeBadRequest, "settings: mcp_servers: %d bytes, at most %d", len(b), MaxMCPServersBytes)
	}
	seen := map[string]bool{}
	for i, m := range servers {
		bad := func(format string, args ...any) error {
			return Errorf(CodeBadRequest, "settings: mcp_servers[%d] (%q): "+format, append([]any{i, m.Name}, args...)...)
		}
		if !validMCPName(m.Name) {
			return bad("name must be 1 to 64 letters, digits, '-', '_' or '.'")
		}
		if seen[m.Name] {
			return bad("the name is used twice")
		}
		seen[m.Name] = true
		switch m.ServerType() {
		case MCPStdio:
			if strings.TrimSpace(m.Command) == "" || m.URL != "" || len(m.Headers) > 0 {
				return bad("a stdio server has a command (run in the sandbox) and no url or headers")
			}
			for _, e := range m.Env {
				if e.Name == "" || strings.ContainsAny(e.Name, "=\x00") {
					return bad("env name %q is not a variable name", e.Name)
				}
			}
		case MCPHTTP, MCPSSE:
			u, err := url.Parse(m.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return bad("an %s server needs an http:// or https:// url, not %q", m.Type, m.URL)
			}
			if m.Command != "" || len(m.Args) > 0 || len(m.Env) > 0 {
				return bad("an %s server has a url and headers, not a command, args or env", m.Type)
			}
			for _, h := range m.Headers {
				if h.Name == "" || strings.ContainsAny(h.Name, ": \r\n") {
					return bad("header name %q is not a header name", h.Name)
				}
			}
		default:
			return bad(`type must be "stdio", "http" or "sse", not %q`, m.Type)
		}
		for _, s := range append(append([]string{m.Command, m.URL}, m.Args...), nvStrings(m.Env, m.Headers)...) {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				return bad("a value is not valid UTF-8 text")
			}
		}
	}
	return nil
}

func nvStrings(lists ...[]NameValue) []string {
	var out []string
	for _, l := range lists {
		for _, nv := range l {
			out = append(out, nv.Name, nv.Value)
		}
	}
	return out
}

func validMCPName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// ValidateSetup checks a setup command ("" removes it).
func ValidateSetup(cmd string) error {
	switch {
	case len(cmd) > MaxSetupBytes:
		return Errorf(CodeBadRequest, "settings: setup is %d bytes, at most %d", len(cmd), MaxSetupBytes)
	case !utf8.ValidString(cmd) || strings.ContainsRune(cmd, 0):
		return Errorf(CodeBadRequest, "settings: setup is not valid UTF-8 text")
	}
	return nil
}

// SettingsOf returns the settings meta holds, as the Session object shows
// them (MCP servers' env and header values hidden); nil when it has none.
func SettingsOf(meta *Meta) *Settings {
	s := &Settings{
		Agent: meta.Harness.Agent, PermissionMode: meta.Harness.PermissionMode, MemoryBytes: meta.MemoryBytes, Pids: meta.Pids, DiskBytes: meta.DiskBytes, Setup: meta.Setup,
		InvokeConcurrency: meta.InvokeConcurrency,
	}
	if h := meta.Harness; h.Agent == "" && (len(h.Command) > 0 || h.Template != "" && h.Template != DefaultTemplate) {
		s.Harness = &Harness{Template: h.Template, Command: append([]string(nil), h.Command...), Stdin: h.Stdin}
	}
	if meta.TurnTimeout > 0 {
		s.TurnTimeout = time.Duration(meta.TurnTimeout).String()
	}
	for _, m := range meta.MCPServers {
		m.Args = append([]string(nil), m.Args...)
		m.Env = redact(m.Env)
		m.Headers = redact(m.Headers)
		s.MCPServers = append(s.MCPServers, m)
	}
	if s.IsZero() {
		return nil
	}
	return s
}

func redact(l []NameValue) []NameValue {
	if l == nil {
		return nil
	}
	out := make([]NameValue, len(l))
	for i, nv := range l {
		out[i] = NameValue{Name: nv.Name, Value: RedactedValue}
	}
	return out
}
