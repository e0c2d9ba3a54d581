package server

import (
	"path/filepath"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/session"
)

// agentCatalog is the node's catalog of ACP agents (compute/agents) as the
// actor uses it (actor.Agents): agents installed in the data directory by
// `atrium agents install`, launched with the node's permission mode.
type agentCatalog struct {
	cat  *agents.Catalog
	mode agents.Mode
}

var _ actor.Agents = agentCatalog{}

// newAgentCatalog opens the catalog of cfg: agents installed in
// cfg.AgentsDir (default <data dir>/agents), the session homes in
// <data dir>/agent-homes.
func newAgentCatalog(cfg Config) (agentCatalog, error) {
	dir := cfg.AgentsDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, agents.DirName)
	}
	mode, err := agents.ParseMode(cfg.AgentMode)
	if err != nil {
		return agentCatalog{}, err
	}
	cat, err := agents.New(agents.Config{
		Dir:    dir,
		Homes:  filepath.Join(cfg.DataDir, agents.HomesName),
		Agents: cfg.Agents,
		Logger: cfg.Logger,
	})
	if err != nil {
		return agentCatalog{}, err
	}
	return agentCatalog{cat: cat, mode: mode}, nil
}

// Check returns nil when agent name is installed on this node.
func (a agentCatalog) Check(name string) error {
	_, err := a.cat.Lookup(name)
	return err
}

// Launch prepares agent name for session sess.
func (a agentCatalog) Launch(name string, sess session.ID, ep compute.ModelEndpoints) (actor.AgentLaunch, error) {
	l, err := a.cat.Launch(name, sess, ep, a.mode)
	if err != nil {
		return actor.AgentLaunch{}, err
	}
	return actor.AgentLaunch{
		Argv: l.Argv, Env: l.Env, Mounts: l.Mounts,
		LoadSession: l.Load, Authenticate: l.Authenticate, SessionMode: l.SessionMode,
	}, nil
}
