package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/config"
)

// runAgents runs `atrium agents ARGS…`.
func runAgents(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errs bytes.Buffer
	err = run(context.Background(), append([]string{"agents"}, args...), strings.NewReader(""), &out, &errs,
		func(string) string { return "" })
	return out.String(), errs.String(), err
}

func TestAgentsCmd(t *testing.T) {
	data := t.TempDir()

	out, _, err := runAgents(t, "ls", "--data", data, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []agentRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 4 {
		t.Fatalf("ls --json on an empty data dir: %q, %v", out, err)
	}
	for _, r := range rows {
		if r.Installed {
			t.Errorf("%s listed as installed", r.Name)
		}
	}

	// An installed version (made by hand here; compute/agents tests the
	// npm install) is listed with its path and size.
	bin := filepath.Join(data, "agents", "claude", "0.23.1", "node_modules", ".bin", "claude-agent-acp")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, _, err = runAgents(t, "ls", "--data", data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "claude    0.23.1 *") || !strings.Contains(out, "not installed: atrium agents install codex") {
		t.Errorf("ls:\n%s", out)
	}

	_, _, err = runAgents(t, "install", "nosuch", "--data", data)
	if err == nil || !strings.Contains(err.Error(), "known agents are claude, codex, gemini, opencode") {
		t.Errorf("install of an unknown agent: %v", err)
	}
	_, _, err = runAgents(t, "install", "--data", data)
	if err == nil || !strings.Contains(err.Error(), "name the agents to install") {
		t.Errorf("install with no name: %v", err)
	}
	_, _, err = runAgents(t, "install", "claude", "codex", "--version", "1.0.0", "--data", data)
	if err == nil || !strings.Contains(err.Error(), "--version applies to one agent") {
		t.Errorf("install of two agents at one version: %v", err)
	}
	// Installing the version present only selects it.
	out, errOut, err := runAgents(t, "install", "claude", "--data", data)
	if err != nil || out != "claude 0.23.1\n" || !strings.Contains(errOut, "already installed") {
		t.Errorf("install of an installed version: %q, %q, %v", out, errOut, err)
	}
}

func TestAgentsCmd_ConfigAgents(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "atrium.yaml")
	yaml := "data_dir: " + filepath.Join(dir, "data") + `
agents:
  - name: mine
    package: "@me/my-agent"
    version: 1.2.3
    bin: node_modules/.bin/my-agent
    args: [--acp]
    model: {api: openai, key_env: [MY_KEY]}
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runAgents(t, "ls", "--config", cfg)
	if err != nil || !strings.Contains(out, "mine      -        1.2.3") {
		t.Errorf("ls with a configured agent: %q, %v", out, err)
	}
	bad := strings.Replace(yaml, "api: openai", "api: cohere", 1)
	if err := os.WriteFile(cfg, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runAgents(t, "ls", "--config", cfg); err == nil || !strings.Contains(err.Error(), "model.api") {
		t.Errorf("ls with a bad configured agent: %v", err)
	}
}

func TestConfig_AgentMode(t *testing.T) {
	for mode, ok := range map[string]bool{"": true, "ask": true, "auto-edit": true, "auto": true, "yolo": false} {
		p := filepath.Join(t.TempDir(), "atrium.yaml")
		if err := os.WriteFile(p, []byte("agent_mode: \""+mode+"\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := config.Load(p, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		err = f.Validate(true)
		if got := err == nil || !strings.Contains(err.Error(), "agent_mode"); got != ok {
			t.Errorf("agent_mode %q: %v", mode, err)
		}
		if ok {
			if cfg, err := serverConfig(f, io.Discard, func(string) string { return "" }); err != nil || cfg.AgentMode != mode {
				t.Errorf("agent_mode %q reaches the server as %q, %v", mode, cfg.AgentMode, err)
			}
		}
	}
}
