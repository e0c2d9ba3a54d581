package server

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/dlq"
)

// wireTasks completes the gateway's task configuration: links in pull
// requests point at the public URL, and dead letters go to the DLQ bucket
// (the one `atrium dlq` lists) unless a queue was given.
func (s *Server) wireTasks(ctx context.Context, t *gateway.Tasks, publicURL string) error {
	if t == nil {
		return nil
	}
	if t.Service.PublicURL == "" {
		t.Service.PublicURL = publicURL
	}
	if t.Service.DLQ != nil {
		return nil
	}
	js, err := jetstream.New(s.nc)
	if err != nil {
		return fmt.Errorf("tasks: jetstream: %w", err)
	}
	q, err := dlq.Open(ctx, dlq.Config{JetStream: js, Logger: s.cfg.Logger.With("component", "dlq")})
	if err != nil {
		return fmt.Errorf("tasks: %w", err)
	}
	t.Service.DLQ = q
	return nil
}
