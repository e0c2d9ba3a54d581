package agents

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// fakeInstall makes dir look like an installed version of s: its
// executable exists.
func fakeInstall(tb testing.TB, dir string, s Spec, version string) string {
	tb.Helper()
	d := filepath.Join(dir, s.Name, version)
	bin := filepath.Join(d, filepath.FromSlash(strings.ReplaceAll(s.Bin, PHArch, npmArch())))
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		tb.Fatal(err)
	}
	return d
}

func newCatalog(tb testing.TB, cfg Config) *Catalog {
	tb.Helper()
	if cfg.Dir == "" {
		cfg.Dir = tb.TempDir()
	}
	if cfg.Homes == "" {
		cfg.Homes = tb.TempDir()
	}
	c, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func TestBuiltins_Valid(t *testing.T) {
	names := map[string]bool{}
	for _, s := range Builtins() {
		if err := s.Validate(); err != nil {
			t.Errorf("built-in %s: %v", s.Name, err)
		}
		for _, m := range Modes {
			if _, ok := s.PermissionModes[m]; !ok {
				t.Errorf("built-in %s lacks permission mode %s", s.Name, m)
			}
		}
		names[s.Name] = true
	}
	for _, n := range []string{"claude", "codex", "gemini", "opencode"} {
		if !names[n] {
			t.Errorf("no built-in %s", n)
		}
	}
}

func TestCatalog_Lookup(t *testing.T) {
	c := newCatalog(t, Config{})
	_, err := c.Lookup("claude")
	if !errors.Is(err, session.ErrBadRequest) || !strings.Contains(err.Error(), "atrium agents install claude") {
		t.Errorf("Lookup of an agent not installed: %v; want a bad request naming the install command", err)
	}
	_, err = c.Lookup("nosuch")
	if !errors.Is(err, session.ErrBadRequest) || !strings.Contains(err.Error(), "claude, codex, gemini, opencode") {
		t.Errorf("Lookup of an unknown agent: %v; want the known agents listed", err)
	}

	s, _ := c.Spec("claude")
	fakeInstall(t, c.cfg.Dir, s, s.Version)
	in, err := c.Lookup("claude")
	if err != nil || in.Version != s.Version || !in.Pinned {
		t.Fatalf("Lookup of the pinned version: %+v, %v", in, err)
	}
	// A version installed later, marked current, wins.
	fakeInstall(t, c.cfg.Dir, s, "9.9.9")
	if err := setCurrent(filepath.Join(c.cfg.Dir, "claude"), "9.9.9"); err != nil {
		t.Fatal(err)
	}
	if in, err := c.Lookup("claude"); err != nil || in.Version != "9.9.9" || in.Pinned {
		t.Errorf("Lookup with a current version: %+v, %v", in, err)
	}
	list, err := c.List()
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %+v, %v", list, err)
	}
	if list[0].Version != s.Version || list[0].Current || !list[1].Current {
		t.Errorf("List marks current/pinned wrongly: %+v", list)
	}
}

func TestCatalog_Launch(t *testing.T) {
	ep := compute.ModelEndpoints{
		Anthropic: "http://127.0.0.1:4180/anthropic",
		OpenAI:    "http://127.0.0.1:4180/openai/v1",
		Gemini:    "http://127.0.0.1:4180/gemini",
		Token:     "tok-secret",
	}
	c := newCatalog(t, Config{})
	for _, s := range Builtins() {
		fakeInstall(t, c.cfg.Dir, s, s.Version)
	}
	id := session.ID("s1")
	t.Run("claude", func(t *testing.T) {
		l, err := c.Launch("claude", id, ep, ModeAutoEdit)
		if err != nil {
			t.Fatal(err)
		}
		if l.Argv[0] != "/opt/atrium/agents/claude/node_modules/.bin/claude-agent-acp" {
			t.Errorf("argv %q", l.Argv)
		}
		for _, want := range []string{"HOME=/home/atrium", "ANTHROPIC_BASE_URL=" + ep.Anthropic, "ANTHROPIC_API_KEY=tok-secret", "IS_SANDBOX=1"} {
			if !slices.Contains(l.Env, want) {
				t.Errorf("env lacks %s: %q", want, l.Env)
			}
		}
		b, err := os.ReadFile(filepath.Join(c.Home(id), ".claude", "settings.json"))
		if err != nil || !strings.Contains(string(b), `"acceptEdits"`) {
			t.Errorf("settings %q, %v", b, err)
		}
		if len(l.Mounts) != 2 || !l.Mounts[0].ReadOnly || l.Mounts[0].Sandbox != "/opt/atrium/agents/claude" ||
			l.Mounts[1].ReadOnly || l.Mounts[1].Host != c.Home(id) || l.Mounts[1].Sandbox != "/home/atrium" {
			t.Errorf("mounts %+v", l.Mounts)
		}
		if !l.Load {
			t.Error("claude supports session/load")
		}
	})
	t.Run("codex", func(t *testing.T) {
		l, err := c.Launch("codex", id, ep, ModeAuto)
		if err != nil {
			t.Fatal(err)
		}
		args := strings.Join(l.Argv, " ")
		for _, want := range []string{`model_providers.atrium.base_url="` + ep.OpenAI + `"`, `approval_policy="never"`, `sandbox_mode="danger-full-access"`} {
			if !strings.Contains(args, want) {
				t.Errorf("argv lacks %s: %s", want, args)
			}
		}
		if strings.Contains(args, "tok-secret") {
			t.Error("the token is in argv")
		}
		if !slices.Contains(l.Env, "OPENAI_API_KEY=tok-secret") {
			t.Errorf("env %q", l.Env)
		}
	})
	t.Run("gemini", func(t *testing.T) {
		l, err := c.Launch("gemini", id, ep, "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(l.Env, "GOOGLE_GEMINI_BASE_URL="+ep.Gemini) || !slices.Contains(l.Env, "GEMINI_API_KEY=tok-secret") ||
			l.Authenticate != "gemini-api-key" || !slices.Contains(l.Argv, "default") {
			t.Errorf("launch %+v", l)
		}
	})
	t.Run("remove home", func(t *testing.T) {
		if _, err := os.Stat(c.Home(id)); err != nil {
			t.Fatalf("no home after launches: %v", err)
		}
		if err := c.RemoveHome(id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(c.Home(id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("home still there: %v", err)
		}
		if err := c.RemoveHome("../x"); !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("RemoveHome of a bad id: %v", err)
		}
	})
	t.Run("no endpoint", func(t *testing.T) {
		_, err := c.Launch("codex", id, compute.ModelEndpoints{Anthropic: ep.Anthropic}, "")
		if !errors.Is(err, session.ErrBadRequest) || !strings.Contains(err.Error(), "openai") {
			t.Errorf("Launch without the agent's model family: %v", err)
		}
	})
	t.Run("bad mode", func(t *testing.T) {
		if _, err := c.Launch("claude", id, ep, "yolo"); !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("Launch with an unknown mode: %v", err)
		}
	})
}

func TestConfig_Agents(t *testing.T) {
	custom := Spec{
		Name: "mine", Package: "@me/my-agent", Version: "1.0.0", Bin: "node_modules/.bin/my-agent",
		Args: []string{"--acp", "--base", PHBaseURL}, Model: Model{API: APIOpenAI, KeyEnv: []string{"MY_KEY"}},
	}
	c := newCatalog(t, Config{Agents: []Spec{custom}})
	if !slices.Contains(c.Names(), "mine") {
		t.Fatalf("names %q", c.Names())
	}
	fakeInstall(t, c.cfg.Dir, custom, "1.0.0")
	l, err := c.Launch("mine", "s2", compute.ModelEndpoints{OpenAI: "http://gw/v1", Token: "t"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(l.Argv[1:], " ") != "--acp --base http://gw/v1" || !slices.Contains(l.Env, "MY_KEY=t") {
		t.Errorf("launch %+v", l)
	}

	for name, s := range map[string]Spec{
		"token in args": func() Spec { s := custom.Clone(); s.Args = []string{PHToken}; return s }(),
		"bad api":       func() Spec { s := custom.Clone(); s.Model.API = "x"; return s }(),
		"escaping bin":  func() Spec { s := custom.Clone(); s.Bin = "../../bin/sh"; return s }(),
		"bad name":      func() Spec { s := custom.Clone(); s.Name = "My Agent"; return s }(),
		"bad version":   func() Spec { s := custom.Clone(); s.Version = "1.0; rm -rf /"; return s }(),
	} {
		if _, err := New(Config{Dir: t.TempDir(), Agents: []Spec{s}}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCatalog_InstallErrors(t *testing.T) {
	t.Run("no npm", func(t *testing.T) {
		c := newCatalog(t, Config{NPM: "/nonexistent/npm"})
		_, err := c.Install(context.Background(), "claude", "", nil)
		if !errors.Is(err, ErrNoNPM) {
			t.Errorf("Install without npm: %v", err)
		}
	})
	t.Run("unknown agent", func(t *testing.T) {
		c := newCatalog(t, Config{})
		if _, err := c.Install(context.Background(), "nosuch", "", nil); !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("Install of an unknown agent: %v", err)
		}
	})
	t.Run("bad version", func(t *testing.T) {
		c := newCatalog(t, Config{})
		if _, err := c.Install(context.Background(), "claude", "../x", nil); !errors.Is(err, session.ErrBadRequest) {
			t.Errorf("Install of a bad version: %v", err)
		}
	})
}

// TestCIDeps_PinnedAgents checks that .ci/deps installs every built-in
// agent at its pinned version into the cache the real-agent tests use.
func TestCIDeps_PinnedAgents(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", ".ci", "deps"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Builtins() {
		if want := `"` + s.Name + " " + s.Package + " " + s.Version + `"`; !strings.Contains(string(b), want) {
			t.Errorf(".ci/deps does not install %s: want the line %s", s.Name, want)
		}
	}
}

func TestSize_HardLinksOnce(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "c"), make([]byte, 10), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := Size(dir); err != nil || n != 1010 {
		t.Errorf("Size = %d, %v; want 1010", n, err)
	}
}
