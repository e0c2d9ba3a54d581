package server

import (
	"context"

	"github.com/atriumhq/atrium/gateway/audit"
)

// ModelAudit lists the model_call entries of tenant's audit log.
func ModelAudit(ctx context.Context, s *Server, tenant string) ([]audit.Entry, error) {
	l, err := audit.New(audit.Config{NATS: s.nc})
	if err != nil {
		return nil, err
	}
	list, _, err := l.List(ctx, tenant, audit.Filter{Action: actModelCall})
	return list, err
}
