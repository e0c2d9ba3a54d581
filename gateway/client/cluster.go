package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// ClusterStatus returns GET /v1/cluster (tenant admins): the cluster's
// processes, the sessions their nodes own and NATS's health, as JSON for
// the caller to decode (`atrium cluster status` decodes it).
func (c *Client) ClusterStatus(ctx context.Context) (json.RawMessage, error) {
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/v1/cluster", nil, &raw); err != nil {
		return nil, err
	}
	return raw, nil
}
