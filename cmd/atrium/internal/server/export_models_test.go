package server

import (
	"context"
	"time"

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

// ModelLedger is a model budget ledger in s's NATS KV, as the gateway gets.
func ModelLedger(s *Server) (interface {
	Spent(ctx context.Context, key string) (int64, float64, error)
	Add(ctx context.Context, key string, tokens int64, cost float64, end time.Time) error
}, error) {
	return newKVLedger(s.nc, 1)
}
