// Package agents is the catalog of the coding agents Atrium drives over the
// Agent Client Protocol (DESIGN §6 "Agents"): what each agent is (an npm
// package at a pinned version, the executable in it, its arguments and
// environment, how it reaches its model and how its permission modes are
// set), installing agents into the data directory with npm, and turning an
// installed agent into what a sandbox runs: argv, environment and the host
// directories mounted into the sandbox (the agent's program read-only, the
// session's agent home read-write).
//
// The built-in agents (Builtins) encode what the real-agent tests prove
// each one needs; operators add any other ACP agent with a Spec in the
// configuration. The package runs npm and writes files under its
// directories; it never starts an agent itself.
package agents

import (
	"fmt"
	"maps"
	"path"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"github.com/atriumhq/atrium/session"
)

// API is the family of model API an agent speaks. The node's model gateway
// serves each under its own base URL (compute.ModelEndpoints).
type API string

// The model API families.
const (
	// APIAnthropic is Anthropic's Messages API. Its base URL has no
	// "/v1": Anthropic's SDKs append it.
	APIAnthropic API = "anthropic"
	// APIOpenAI is OpenAI's Responses and Chat Completions APIs. Its base
	// URL ends in "/v1".
	APIOpenAI API = "openai"
	// APIGemini is Google's Gemini API. Its base URL has no version.
	APIGemini API = "gemini"
)

// Mode is a session's permission mode: how much the agent may do without
// asking a driver (DESIGN §6). Each agent maps it to its own settings.
type Mode string

// The permission modes.
const (
	// ModeAsk asks before edits and commands, as the agents do by default.
	ModeAsk Mode = "ask"
	// ModeAutoEdit lets the agent edit files in /workspace without
	// asking, and asks before other commands.
	ModeAutoEdit Mode = "auto-edit"
	// ModeAuto never asks: Atrium's sandbox is the only boundary.
	ModeAuto Mode = "auto"
)

// DefaultMode is the permission mode of a session that sets none.
const DefaultMode = ModeAsk

// Modes lists the permission modes, from the most to the least cautious.
var Modes = []Mode{ModeAsk, ModeAutoEdit, ModeAuto}

// ParseMode returns the mode named s; "" is DefaultMode.
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return DefaultMode, nil
	}
	m := Mode(s)
	if !slices.Contains(Modes, m) {
		return "", session.Errorf(session.CodeBadRequest, "unknown permission mode %q: want ask, auto-edit or auto", s)
	}
	return m, nil
}

// Placeholders are replaced in a Spec's Bin, Args, Env and Files when the
// agent is launched.
const (
	// PHBaseURL is the base URL of the agent's model API family, in the
	// form that family's SDKs expect (see API).
	PHBaseURL = "{{base_url}}"
	// PHToken is the session's scoped model token, the agent's "API key".
	// It may appear in Env only: arguments show in process listings, and
	// files in the agent home are saved with the session.
	PHToken = "{{token}}"
	// PHHome is the agent home inside the sandbox (HomePath).
	PHHome = "{{home}}"
	// PHDir is where the agent's program is mounted in the sandbox
	// (ProgramPath(name)).
	PHDir = "{{dir}}"
	// PHModel is Spec.Model.Name.
	PHModel = "{{model}}"
	// PHArch is npm's name of this machine's architecture (x64, arm64),
	// for agents whose executable is in a per-platform package.
	PHArch = "{{arch}}"
	// PHWorkspace is the agent's working directory, /workspace.
	PHWorkspace = "{{workspace}}"
)

// Paths inside a sandbox.
const (
	// HomePath is where the session's agent home is mounted: HOME of the
	// agent, outside /workspace, so repository tasks never commit the
	// agent's state and it is kept across sandbox sleeps.
	HomePath = "/home/atrium"
	// ProgramsPath holds the installed agent programs, read-only, one
	// directory per agent (ProgramPath).
	ProgramsPath = "/opt/atrium/agents"
	// WorkspacePath is the agent's working directory.
	WorkspacePath = "/workspace"
)

// ProgramPath is where agent name's installed program is mounted in a
// sandbox.
func ProgramPath(name string) string { return ProgramsPath + "/" + name }

// Spec describes one agent. YAML and JSON keys are the snake_case field
// names: the configuration's `agents:` list holds Specs.
type Spec struct {
	// Name names the agent in sessions ({"agent":NAME}) and commands.
	Name string `yaml:"name" json:"name"`
	// Package and Version are the npm package and its pinned version,
	// installed by `atrium agents install NAME`.
	Package string `yaml:"package" json:"package"`
	Version string `yaml:"version" json:"version"`
	// Bin is the agent's executable, relative to the install directory
	// (e.g. "node_modules/.bin/claude-agent-acp"). It may hold PHArch.
	Bin string `yaml:"bin" json:"bin"`
	// Args are the executable's arguments, Env its environment (KEY=VALUE)
	// on top of the sandbox's; both may hold placeholders.
	Args []string `yaml:"args,omitempty" json:"args,omitempty"`
	Env  []string `yaml:"env,omitempty" json:"env,omitempty"`
	// Files are written into the agent home (paths relative to it) before
	// every launch, with placeholders replaced: configuration files of
	// agents that read their settings from HOME.
	Files map[string]string `yaml:"files,omitempty" json:"files,omitempty"`
	// Model is how the agent reaches its model.
	Model Model `yaml:"model" json:"model"`
	// Authenticate is the ACP authentication method the client calls
	// after initialize (authenticate {methodId}); "" when the agent
	// needs none.
	Authenticate string `yaml:"authenticate,omitempty" json:"authenticate,omitempty"`
	// PermissionModes maps Atrium's permission modes to the agent's own
	// settings. A mode the map lacks cannot be used with the agent; an
	// agent without the map runs the same in every mode.
	PermissionModes map[Mode]Settings `yaml:"permission_modes,omitempty" json:"permission_modes,omitempty"`
	// Load says that the agent supports session/load (ACP's loadSession
	// capability), so a new process continues an earlier conversation.
	Load bool `yaml:"load,omitempty" json:"load,omitempty"`
	// WritesAfterAnswer says that the agent writes its transcript into
	// its home after it answers a prompt (Claude Code does): the node
	// waits a little for that write before it saves the home at the
	// turn's end, so that another node taking over after a kill -9 loads
	// the conversation with the turn's answer.
	WritesAfterAnswer bool `yaml:"writes_after_answer,omitempty" json:"writes_after_answer,omitempty"`
	// Description is one line shown by `atrium agents ls`.
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
}

// Model says how an agent reaches its model through the node's model
// gateway.
type Model struct {
	// API is the family the agent speaks.
	API API `yaml:"api" json:"api"`
	// BaseURLEnv lists the environment variables that receive the
	// family's base URL (the agent may also take it from Args, Env or
	// Files through PHBaseURL).
	BaseURLEnv []string `yaml:"base_url_env,omitempty" json:"base_url_env,omitempty"`
	// KeyEnv lists the environment variables that receive the session's
	// model token as the agent's API key.
	KeyEnv []string `yaml:"key_env,omitempty" json:"key_env,omitempty"`
	// Name is the model the agent is told to use (PHModel); "" leaves the
	// agent's default.
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
}

// Settings are what one permission mode adds to an agent's launch.
type Settings struct {
	Args  []string          `yaml:"args,omitempty" json:"args,omitempty"`
	Env   []string          `yaml:"env,omitempty" json:"env,omitempty"`
	Files map[string]string `yaml:"files,omitempty" json:"files,omitempty"`
	// SessionMode is an ACP session mode the client selects
	// (session/set_mode) after session/new or session/load; "" for none.
	SessionMode string `yaml:"session_mode,omitempty" json:"session_mode,omitempty"`
}

// namePattern is what agent names look like: they name directories and
// appear in commands.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// versionPattern accepts npm versions and tags without shell or path
// metacharacters.
var versionPattern = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`)

// packagePattern accepts npm package names, scoped or not.
var packagePattern = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$`)

// envKeyPattern is an environment variable's name.
var envKeyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate says what is wrong with s, naming the field.
func (s Spec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("agent %q: %s", s.Name, fmt.Sprintf(format, args...))
	}
	if !namePattern.MatchString(s.Name) {
		return fmt.Errorf("agent name %q: want 1 to 64 lower-case letters, digits, '-' or '_'", s.Name)
	}
	if !packagePattern.MatchString(s.Package) {
		return bad("package %q is not an npm package name", s.Package)
	}
	if err := ValidVersion(s.Version); err != nil {
		return bad("%v", err)
	}
	if s.Bin == "" || path.IsAbs(s.Bin) || slices.Contains(strings.Split(s.Bin, "/"), "..") {
		return bad("bin %q must be a path inside the install directory", s.Bin)
	}
	switch s.Model.API {
	case APIAnthropic, APIOpenAI, APIGemini:
	default:
		return bad("model.api %q: want anthropic, openai or gemini", s.Model.API)
	}
	for _, k := range slices.Concat(s.Model.BaseURLEnv, s.Model.KeyEnv) {
		if !envKeyPattern.MatchString(k) {
			return bad("%q is not an environment variable name", k)
		}
	}
	check := func(where string, args, env []string, files map[string]string) error {
		for _, a := range args {
			if strings.Contains(a, PHToken) {
				return bad("%s: the model token may be passed in env only", where)
			}
		}
		for _, e := range env {
			k, _, ok := strings.Cut(e, "=")
			if !ok || !envKeyPattern.MatchString(k) {
				return bad("%s: env entry %q is not KEY=VALUE", where, k)
			}
		}
		for p, content := range files {
			if p == "" || path.IsAbs(p) || slices.Contains(strings.Split(p, "/"), "..") {
				return bad("%s: file %q must be a path inside the agent home", where, p)
			}
			if strings.Contains(content, PHToken) {
				return bad("%s: the model token may be passed in env only", where)
			}
		}
		return nil
	}
	if err := check("spec", s.Args, s.Env, s.Files); err != nil {
		return err
	}
	for m, set := range s.PermissionModes {
		if !slices.Contains(Modes, m) {
			return bad("unknown permission mode %q: want ask, auto-edit or auto", m)
		}
		if err := check("permission_modes."+string(m), set.Args, set.Env, set.Files); err != nil {
			return err
		}
	}
	return nil
}

// ValidVersion checks an npm version or tag given by a user.
func ValidVersion(v string) error {
	if !versionPattern.MatchString(v) {
		return fmt.Errorf("version %q: want an npm version such as 1.2.3", v)
	}
	return nil
}

// Clone returns a deep copy of s.
func (s Spec) Clone() Spec {
	s.Args = slices.Clone(s.Args)
	s.Env = slices.Clone(s.Env)
	s.Files = maps.Clone(s.Files)
	s.Model.BaseURLEnv = slices.Clone(s.Model.BaseURLEnv)
	s.Model.KeyEnv = slices.Clone(s.Model.KeyEnv)
	if s.PermissionModes != nil {
		pm := make(map[Mode]Settings, len(s.PermissionModes))
		for m, set := range s.PermissionModes {
			set.Args = slices.Clone(set.Args)
			set.Env = slices.Clone(set.Env)
			set.Files = maps.Clone(set.Files)
			pm[m] = set
		}
		s.PermissionModes = pm
	}
	return s
}

// npmArch is npm's name of this machine's architecture.
func npmArch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x64"
	case "386":
		return "ia32"
	}
	return runtime.GOARCH
}
