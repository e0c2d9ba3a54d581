package server

import (
	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute/agents"
)

// newNodeAgents opens the node's agent catalog (compute/agents): the
// agents installed in cfg.AgentsDir (default <data dir>/agents) by `atrium
// agents install`, with the session agent homes in <data dir>/agent-homes,
// launched in cfg.AgentMode (NodeAgents).
func newNodeAgents(cfg Config) (actor.Agents, error) {
	mode, err := agents.ParseMode(cfg.AgentMode)
	if err != nil {
		return nil, err
	}
	cat, err := agentCatalog(cfg) // agentlist.go
	if err != nil {
		return nil, err
	}
	return NodeAgents(cat, mode), nil
}
