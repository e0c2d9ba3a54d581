package server

import "github.com/atriumhq/atrium/gateway"

// automation returns the gateway's schedules and dead-letter configuration:
// Config.Automation, with its buckets replicated like the others.
func (c *Config) automation() gateway.Automation {
	a := c.Automation
	if a.Replicas == 0 {
		a.Replicas = c.NATS.Replicas
	}
	return a
}
