package server

import (
	"path/filepath"

	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute/agents"
)

// newNodeAgents opens the node's agent catalog (compute/agents): the
// agents installed in cfg.AgentsDir (default <data dir>/agents) by `atrium
// agents install`, with the session agent homes in <data dir>/agent-homes,
// launched in cfg.AgentMode (NodeAgents).
func newNodeAgents(cfg Config) (actor.Agents, error) {
	dir := cfg.AgentsDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, agents.DirName)
	}
	mode, err := agents.ParseMode(cfg.AgentMode)
	if err != nil {
		return nil, err
	}
	cat, err := agents.New(agents.Config{
		Dir:    dir,
		Homes:  filepath.Join(cfg.DataDir, agents.HomesName),
		Agents: cfg.Agents,
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return NodeAgents(cat, mode), nil
}
