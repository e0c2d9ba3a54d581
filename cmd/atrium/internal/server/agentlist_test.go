package server_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/cmd/atrium/internal/server"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/gateway/auth"
	gwclient "github.com/atriumhq/atrium/gateway/client"
	"github.com/atriumhq/atrium/session"
)

// fakeAgentInstall makes dir hold an installed version of built-in agent
// name: its program exists and is executable (what the catalog checks).
func fakeAgentInstall(t *testing.T, dir, name, version string) {
	t.Helper()
	cat, err := agents.New(agents.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cat.Spec(name)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name, version, filepath.FromSlash(spec.Bin))
	if strings.Contains(spec.Bin, "{") {
		t.Fatalf("agent %s has a placeholder in its bin %q: pick another agent for this test", name, spec.Bin)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// GET /v1/agents lists the agents installed on the node (through the Go
// client), follows installs made while the server runs, and needs a caller;
// the Go client creates sessions of them.
func TestAgents_ListInstalled(t *testing.T) {
	dir := t.TempDir()
	fakeAgentInstall(t, dir, "claude", "0.23.1")
	data := t.TempDir()
	st := startStack(t, func(c *server.Config) { c.DataDir = data; c.AgentsDir = dir; c.AuthMode = server.AuthTokens })
	key, err := auth.ReadBootstrapKey(data)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	boot, err := gwclient.New(st.url, auth.BootstrapToken(key, "alice", ""))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := boot.CreateToken(ctx, gwclient.TokenRequest{Name: "agents"})
	if err != nil {
		t.Fatal(err)
	}
	gc, err := gwclient.New(st.url, tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	got, err := gc.Agents(ctx)
	if err != nil {
		t.Fatalf("list agents: %v", err)
	}
	if want := []session.AgentInfo{{Name: "claude", Version: "0.23.1"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("agents = %+v, want %+v", got, want)
	}

	fakeAgentInstall(t, dir, "gemini", "0.61.0")
	got, err = gc.Agents(ctx)
	if err != nil {
		t.Fatalf("list agents after an install: %v", err)
	}
	if want := []session.AgentInfo{{Name: "claude", Version: "0.23.1"}, {Name: "gemini", Version: "0.61.0"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("agents after installing gemini = %+v, want %+v", got, want)
	}

	// The client creates agent sessions (it once dropped the agent and
	// made a shell session): an installed agent is accepted, one that is
	// not is refused by the node with the install command.
	if _, err := gc.CreateSession(ctx, gwclient.CreateRequest{Title: "claude", Harness: session.Harness{Agent: "claude"}}); err != nil {
		t.Fatalf("create a claude session: %v", err)
	}
	_, err = gc.CreateSession(ctx, gwclient.CreateRequest{Title: "codex", Harness: session.Harness{Agent: "codex"}})
	if e := session.AsError(err); err == nil || e.Code != session.CodeBadRequest || !strings.Contains(e.Message, "atrium agents install codex") {
		t.Fatalf("create a session of an agent that is not installed: %v, want bad_request naming the install", err)
	}

	req, _ := http.NewRequest(http.MethodGet, st.url+"/v1/agents", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/agents without a token: %s, want 401", resp.Status)
	}
}

// A session's own permission mode reaches the agent's launch (NodeAgents):
// it overrides the node's, "" keeps the node's, and a bad one is refused;
// the gateway takes it from POST /v1/sessions {"settings":{…}}.
func TestAgents_SessionPermissionMode(t *testing.T) {
	dir := t.TempDir()
	fakeAgentInstall(t, dir, "gemini", "0.61.0")
	cat, err := agents.New(agents.Config{Dir: dir, Homes: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	na := server.NodeAgents(cat, agents.ModeAsk)
	argv := func(mode string) string {
		t.Helper()
		l, err := na.Launch("gemini", "s1", compute.ModelEndpoints{Gemini: "http://" + compute.ModelAddr + "/gemini", Token: "t"}, mode)
		if err != nil {
			t.Fatalf("launch in mode %q: %v", mode, err)
		}
		return strings.Join(l.Argv, " ")
	}
	node, auto := argv(""), argv(session.PermissionAuto)
	if node != argv(session.PermissionAsk) || auto == node {
		t.Fatalf("argv: node's %q, auto %q: want the session's mode to change it", node, auto)
	}
	want, err := cat.Launch("gemini", "s1", compute.ModelEndpoints{Gemini: "http://" + compute.ModelAddr + "/gemini", Token: "t"}, agents.ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	if auto != strings.Join(want.Argv, " ") {
		t.Fatalf("argv in auto %q, want the catalog's %q", auto, want.Argv)
	}

	st := startStack(t, func(c *server.Config) { c.AgentsDir = dir })
	alice := st.as("alice")
	alice.must(http.StatusCreated, "POST", "/v1/sessions", map[string]any{"agent": "gemini", "settings": map[string]any{"permission_mode": "auto"}}, nil)
	alice.mustError(http.StatusBadRequest, session.CodeBadRequest, "POST", "/v1/sessions", map[string]any{"agent": "gemini", "settings": map[string]any{"permission_mode": "yolo"}})
	alice.mustError(http.StatusBadRequest, session.CodeBadRequest, "POST", "/v1/sessions", map[string]any{"settings": map[string]any{"permission_mode": "auto"}})
}
