package agents

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// Defaults of Config.
const (
	// DefaultNPM is the npm executable, looked up in PATH.
	DefaultNPM = "npm"
	// DirName and HomesName are the directories of a data directory
	// holding the installed agents and the per-session agent homes.
	DirName   = "agents"
	HomesName = "agent-homes"
)

// currentLink names, in an agent's directory, the link to the version that
// launches use: the one installed last.
const currentLink = "current"

// Config configures a Catalog.
type Config struct {
	// Dir holds the installed agents: Dir/<name>/<version>/ is an npm
	// prefix. Required (`<data dir>/agents`).
	Dir string
	// Homes holds the per-session agent homes: Homes/<session>/ is
	// mounted at HomePath. Required for Launch (`<data dir>/agent-homes`).
	Homes string
	// Agents are agents from the configuration, added to the built-ins;
	// one with a built-in's name replaces it.
	Agents []Spec
	// NPM is the npm executable; default DefaultNPM.
	NPM string
	// Logger receives the catalog's logs; default slog.Default().
	Logger *slog.Logger
}

// Catalog knows the agents, installs them and prepares their launches. Its
// methods are safe for concurrent use, and so are installs of the same
// version by several processes: the first to finish is kept.
type Catalog struct {
	cfg   Config
	log   *slog.Logger
	specs map[string]Spec
}

// New returns the catalog of the built-in agents and cfg.Agents.
func New(cfg Config) (*Catalog, error) {
	if cfg.Dir == "" {
		return nil, errors.New("agents: Config.Dir is required")
	}
	if cfg.NPM == "" {
		cfg.NPM = DefaultNPM
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Catalog{cfg: cfg, log: cfg.Logger, specs: make(map[string]Spec)}
	for _, s := range Builtins() {
		c.specs[s.Name] = s
	}
	seen := make(map[string]bool)
	for _, s := range cfg.Agents {
		if err := s.Validate(); err != nil {
			return nil, fmt.Errorf("agents: %w", err)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("agents: agent %q is configured twice", s.Name)
		}
		seen[s.Name] = true
		c.specs[s.Name] = s.Clone()
	}
	return c, nil
}

// Names returns the names of the known agents, sorted.
func (c *Catalog) Names() []string {
	names := make([]string, 0, len(c.specs))
	for n := range c.specs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Spec returns the agent named name, or an error listing the known ones.
func (c *Catalog) Spec(name string) (Spec, error) {
	s, ok := c.specs[name]
	if !ok {
		return Spec{}, session.Errorf(session.CodeBadRequest, "unknown agent %q: known agents are %s",
			name, strings.Join(c.Names(), ", "))
	}
	return s.Clone(), nil
}

// Installed is one installed version of an agent.
type Installed struct {
	Spec Spec `json:"-"`
	// Name and Version are the agent's and the installed version's.
	Name    string `json:"name"`
	Version string `json:"version"`
	// Dir is the install directory on the host.
	Dir string `json:"path"`
	// Current says that launches use this version.
	Current bool `json:"current"`
	// Pinned says that this is the version Atrium's tests run.
	Pinned bool `json:"pinned"`
}

// Lookup returns the version of agent name that launches use: the one
// installed last, or else the pinned one. It fails with an error matching
// session.ErrBadRequest, naming `atrium agents install NAME`, when the
// agent is unknown or not installed.
func (c *Catalog) Lookup(name string) (Installed, error) {
	s, err := c.Spec(name)
	if err != nil {
		return Installed{}, err
	}
	dir := filepath.Join(c.cfg.Dir, name)
	version := ""
	if target, err := os.Readlink(filepath.Join(dir, currentLink)); err == nil && ValidVersion(target) == nil {
		if c.complete(s, filepath.Join(dir, target)) {
			version = target
		}
	}
	if version == "" && c.complete(s, filepath.Join(dir, s.Version)) {
		version = s.Version
	}
	if version == "" {
		return Installed{}, session.Errorf(session.CodeBadRequest,
			"agent %q is not installed on this node: run `atrium agents install %s`", name, name)
	}
	return Installed{
		Spec: s, Name: name, Version: version, Dir: filepath.Join(dir, version),
		Current: true, Pinned: version == s.Version,
	}, nil
}

// complete reports whether dir holds an installed program of s.
func (c *Catalog) complete(s Spec, dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, c.bin(s)))
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// bin is s.Bin with its placeholders replaced.
func (c *Catalog) bin(s Spec) string {
	return filepath.FromSlash(strings.ReplaceAll(s.Bin, PHArch, npmArch()))
}

// List returns every installed version of every known agent, by name then
// version.
func (c *Catalog) List() ([]Installed, error) {
	var out []Installed
	for _, name := range c.Names() {
		s := c.specs[name]
		entries, err := os.ReadDir(filepath.Join(c.cfg.Dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list agents: %w", err)
		}
		cur, _ := c.Lookup(name)
		for _, e := range entries {
			v := e.Name()
			if !e.IsDir() || ValidVersion(v) != nil || strings.HasPrefix(v, ".") {
				continue
			}
			dir := filepath.Join(c.cfg.Dir, name, v)
			if !c.complete(s, dir) {
				continue
			}
			out = append(out, Installed{
				Spec: s.Clone(), Name: name, Version: v, Dir: dir,
				Current: cur.Version == v, Pinned: v == s.Version,
			})
		}
	}
	return out, nil
}

// Launch is what a sandbox runs for an agent: the agent's process (cwd
// /workspace, stdio carrying ACP) and the mounts it needs.
type Launch struct {
	Argv []string
	// Env holds the model token: never log it.
	Env []string
	// Mounts are the agent's program (read-only) and the session's agent
	// home (read-write).
	Mounts []compute.Mount
	// Load says that the agent supports session/load.
	Load bool
	// WritesAfterAnswer is the spec's: the agent writes its transcript
	// after it answers.
	WritesAfterAnswer bool
	// Authenticate is the ACP method to call after initialize; "" none.
	Authenticate string
	// SessionMode is the ACP session mode to select after session/new or
	// session/load; "" none.
	SessionMode string
	// Version is the agent version launched.
	Version string
}

// Launch prepares agent name for session sess with permission mode mode
// ("" is DefaultMode): it makes the session's agent home (Config.Homes/<sess>),
// writes the agent's settings files into it, and returns the agent's argv,
// environment and mounts, with the model endpoints and token in the places
// the agent reads them. It fails with session.ErrBadRequest when the agent
// is not installed, has no endpoint for its model family, or does not
// support the mode.
func (c *Catalog) Launch(name string, sess session.ID, ep compute.ModelEndpoints, mode Mode) (Launch, error) {
	if err := sess.Validate(); err != nil {
		return Launch{}, err
	}
	if c.cfg.Homes == "" {
		return Launch{}, errors.New("agents: Config.Homes is required to launch agents")
	}
	if mode == "" {
		mode = DefaultMode
	}
	inst, err := c.Lookup(name)
	if err != nil {
		return Launch{}, err
	}
	s := inst.Spec
	set, ok := s.PermissionModes[mode]
	if !ok && len(s.PermissionModes) > 0 {
		return Launch{}, session.Errorf(session.CodeBadRequest, "agent %q has no permission mode %q", name, mode)
	}
	var base string
	switch s.Model.API {
	case APIAnthropic:
		base = ep.Anthropic
	case APIOpenAI:
		base = ep.OpenAI
	case APIGemini:
		base = ep.Gemini
	}
	if base == "" {
		return Launch{}, session.Errorf(session.CodeBadRequest,
			"agent %q speaks the %s API, and this node's model gateway has no %s provider: configure one", name, s.Model.API, s.Model.API)
	}
	r := strings.NewReplacer(
		PHBaseURL, base, PHHome, HomePath, PHDir, ProgramPath(name),
		PHModel, s.Model.Name, PHArch, npmArch(), PHWorkspace, WorkspacePath)
	rt := strings.NewReplacer(
		PHBaseURL, base, PHHome, HomePath, PHDir, ProgramPath(name),
		PHModel, s.Model.Name, PHArch, npmArch(), PHWorkspace, WorkspacePath, PHToken, ep.Token)

	home := filepath.Join(c.cfg.Homes, string(sess))
	if err := os.MkdirAll(home, 0o755); err != nil {
		return Launch{}, fmt.Errorf("make agent home: %w", err)
	}
	files := make(map[string]string, len(s.Files)+len(set.Files))
	for p, content := range s.Files {
		files[p] = content
	}
	for p, content := range set.Files {
		files[p] = content
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		if err := writeHomeFile(home, p, r.Replace(files[p])); err != nil {
			return Launch{}, err
		}
	}

	argv := []string{ProgramPath(name) + "/" + strings.ReplaceAll(s.Bin, PHArch, npmArch())}
	for _, a := range slices.Concat(s.Args, set.Args) {
		argv = append(argv, r.Replace(a))
	}
	env := []string{"HOME=" + HomePath}
	for _, k := range s.Model.BaseURLEnv {
		env = append(env, k+"="+base)
	}
	for _, k := range s.Model.KeyEnv {
		env = append(env, k+"="+ep.Token)
	}
	for _, e := range slices.Concat(s.Env, set.Env) {
		env = append(env, rt.Replace(e))
	}
	return Launch{
		Argv: argv,
		Env:  env,
		Mounts: []compute.Mount{
			{Host: inst.Dir, Sandbox: ProgramPath(name), ReadOnly: true},
			{Host: home, Sandbox: HomePath},
		},
		Load:              s.Load,
		WritesAfterAnswer: s.WritesAfterAnswer,
		Authenticate:      s.Authenticate,
		SessionMode:       set.SessionMode,
		Version:           inst.Version,
	}, nil
}

// Home returns the host directory of session sess's agent home.
func (c *Catalog) Home(sess session.ID) string {
	return filepath.Join(c.cfg.Homes, string(sess))
}

// RemoveHome deletes session sess's agent home, for a deleted session. No
// agent process of the session may run.
func (c *Catalog) RemoveHome(sess session.ID) error {
	if err := sess.Validate(); err != nil {
		return err
	}
	if c.cfg.Homes == "" {
		return nil
	}
	if err := os.RemoveAll(c.Home(sess)); err != nil {
		return fmt.Errorf("remove agent home: %w", err)
	}
	return nil
}

// writeHomeFile writes content at p in home, replacing what was there.
func writeHomeFile(home, p, content string) error {
	dst := filepath.Join(home, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("write agent settings %s: %w", p, err)
	}
	tmp := dst + ".atrium-tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return fmt.Errorf("write agent settings %s: %w", p, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("write agent settings %s: %w", p, err)
	}
	return nil
}
