package server

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/session"
	"github.com/nats-io/nats.go"
)

// agentCatalog opens the node's agent catalog: the agents installed in
// cfg.AgentsDir (default <data dir>/agents) by `atrium agents install`, with
// the session agent homes in <data dir>/agent-homes.
func agentCatalog(cfg Config) (*agents.Catalog, error) {
	dir := cfg.AgentsDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, agents.DirName)
	}
	return agents.New(agents.Config{
		Dir:    dir,
		Homes:  filepath.Join(cfg.DataDir, agents.HomesName),
		Agents: cfg.Agents,
		Logger: cfg.Logger,
	})
}

// serveAgentList answers session.Subjects.Agents, which every node
// subscribes to (no queue group: a gateway collects every node's answer),
// with the agents installed on this node, each at the version its
// sessions launch. The subscription ends when NATS is closed.
func (s *Server) serveAgentList(cfg Config) error {
	cat, err := agentCatalog(cfg)
	if err != nil {
		return fmt.Errorf("agents: %w", err)
	}
	log := cfg.Logger.With("component", "node")
	_, err = s.nc.Subscribe(session.Subjects{}.Agents(), func(m *nats.Msg) {
		l, err := installedAgents(cat)
		if err != nil {
			log.Warn("list the installed agents", "err", err)
		}
		b, _ := json.Marshal(l)
		if err := m.Respond(b); err != nil {
			log.Debug("answer an agent list request", "err", err)
		}
	})
	if err != nil {
		return fmt.Errorf("agents: subscribe: %w", err)
	}
	return nil
}

// installedAgents lists the current version of every agent installed in
// cat (what `atrium agents ls` marks current).
func installedAgents(cat *agents.Catalog) (session.AgentList, error) {
	all, err := cat.List()
	l := session.AgentList{Agents: []session.AgentInfo{}}
	for _, a := range all {
		if a.Current {
			l.Agents = append(l.Agents, session.AgentInfo{Name: a.Name, Version: a.Version})
		}
	}
	return l, err
}
