package server

import (
	"github.com/atriumhq/atrium/actor"
	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/agents"
	"github.com/atriumhq/atrium/compute/modelgw"
	"github.com/atriumhq/atrium/session"
)

// The node's model gateway gives agent processes their model tokens
// (actor.Config.Models).
var _ actor.Models = (*modelgw.Gateway)(nil)

// NodeAgents adapts the agent catalog to what the node's agent runtime
// consumes (actor.Config.Agents): agents launch in mode, the node's
// permission mode for agent sessions ("" is agents.DefaultMode).
func NodeAgents(c *agents.Catalog, mode agents.Mode) actor.Agents {
	return catalogAgents{c: c, mode: mode}
}

type catalogAgents struct {
	c    *agents.Catalog
	mode agents.Mode
}

// Check fails, naming the install command, when name is not installed.
func (a catalogAgents) Check(name string) error {
	_, err := a.c.Lookup(name)
	return err
}

func (a catalogAgents) Launch(name string, sess session.ID, ep compute.ModelEndpoints, mode string) (actor.AgentLaunch, error) {
	m := a.mode
	if mode != "" { // the session's own (session.Harness.PermissionMode)
		var err error
		if m, err = agents.ParseMode(mode); err != nil {
			return actor.AgentLaunch{}, err
		}
	}
	l, err := a.c.Launch(name, sess, ep, m)
	if err != nil {
		return actor.AgentLaunch{}, err
	}
	return actor.AgentLaunch{
		Argv: l.Argv, Env: l.Env, Mounts: l.Mounts,
		LoadSession: l.Load, Authenticate: l.Authenticate, SessionMode: l.SessionMode,
		WritesAfterAnswer: l.WritesAfterAnswer,
		Home:              a.c.Home(sess),
	}, nil
}
