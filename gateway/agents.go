package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/atriumhq/atrium/session"
)

// agentsGather is how long GET /v1/agents waits for more nodes after the
// first answer when it does not know how many nodes there are (or fewer
// answered than it saw leases of).
const agentsGather = 300 * time.Millisecond

// listAgents serves GET /v1/agents: the agents installed on the nodes
// (session.AgentList), for a client's choice of agent when it creates a
// session. Every node answers session.Subjects.Agents; the answer is the
// union of what the nodes that answered in time have installed.
func (s *Server) listAgents(w http.ResponseWriter, r *http.Request, _ session.Principal) {
	list, err := s.gatherAgents(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// gatherAgents asks every node for its installed agents: it waits up to
// the request timeout for the first answer, then until as many nodes as
// it saw leases of answered, at most agentsGather more.
func (s *Server) gatherAgents(ctx context.Context) (session.AgentList, error) {
	inbox := s.nc.NewRespInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return session.AgentList{}, session.Errorf(session.CodeUnavailable, "ask the nodes for their agents: %v", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.nc.PublishRequest(s.subj.Agents(), inbox, nil); err != nil {
		return session.AgentList{}, session.Errorf(session.CodeUnavailable, "ask the nodes for their agents: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	want := s.nodes.liveCount()
	seen := map[session.AgentInfo]bool{}
	answers := 0
	for answers == 0 || answers < want {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if answers > 0 {
				break // the nodes that answered in time
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return session.AgentList{}, session.Errorf(session.CodeUnavailable,
					"no node answered with its agents within %s: is a node running?", s.reqTimeout)
			}
			return session.AgentList{}, err
		}
		if msg.Header.Get("Status") == "503" { // no responders: no node
			return session.AgentList{}, session.Errorf(session.CodeUnavailable,
				"no node is running to say which agents are installed: start one (atrium serve --roles node)")
		}
		var l session.AgentList
		if err := json.Unmarshal(msg.Data, &l); err != nil {
			s.log.Warn("malformed agent list from a node", "err", err)
			continue
		}
		for _, a := range l.Agents {
			seen[a] = true
		}
		if answers++; answers == 1 {
			var c context.CancelFunc
			ctx, c = context.WithTimeout(ctx, agentsGather)
			defer c()
		}
	}
	out := session.AgentList{Agents: make([]session.AgentInfo, 0, len(seen))}
	for a := range seen {
		out.Agents = append(out.Agents, a)
	}
	slices.SortFunc(out.Agents, func(a, b session.AgentInfo) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Version, b.Version))
	})
	return out, nil
}

// liveCount is the number of nodes whose lease this gateway last saw
// written (0 when it saw none yet).
func (n *nodeLeases) liveCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.live)
}
