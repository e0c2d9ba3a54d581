package client

import (
	"context"
	"net/http"

	"github.com/atriumhq/atrium/session"
)

// Agents returns the agents installed on the cluster's nodes (GET
// /v1/agents): the names a session can be created with
// (CreateSession's agent).
func (c *Client) Agents(ctx context.Context) ([]session.AgentInfo, error) {
	var l session.AgentList
	if err := c.do(ctx, http.MethodGet, "/v1/agents", nil, &l); err != nil {
		return nil, err
	}
	return l.Agents, nil
}
