package config

import (
	"fmt"
	"time"

	"github.com/atriumhq/atrium/gateway"
)

// Quotas configures the caps of invokes and the tenants' quotas
// (docs/automation.md, "Invoke"). Every gateway of a system should have the
// same ones: they are counted in NATS KV, shared by all.
//
//	quotas:
//	  invokes_per_session: 4     # 0: the default (4); -1: no cap
//	  invokes_per_tenant: 32     # 0: the default (32); -1: no cap
//	  sandboxes_per_tenant: 10   # 0: no quota
//	  turns_per_hour: 500        # per tenant; 0: no quota
type Quotas struct {
	// InvokesPerSession and InvokesPerTenant cap the invokes running at
	// once; 0 means the gateway's default, a negative value no cap.
	InvokesPerSession int `yaml:"invokes_per_session"`
	InvokesPerTenant  int `yaml:"invokes_per_tenant"`
	// SandboxesPerTenant caps a tenant's awake sandboxes, checked when a
	// prompt would wake one; 0 means no quota.
	SandboxesPerTenant int `yaml:"sandboxes_per_tenant"`
	// TurnsPerHour caps the prompts a tenant sends per hour; 0 means no
	// quota.
	TurnsPerHour int `yaml:"turns_per_hour"`
	// SlotTTL is how long a crashed gateway's invokes keep their slots;
	// 0 means the default (30s).
	SlotTTL time.Duration `yaml:"slot_ttl"`
}

// check returns the problems of the quotas section.
func (q Quotas) check() []error {
	var errs []error
	if q.SandboxesPerTenant < 0 {
		errs = append(errs, fmt.Errorf("quotas.sandboxes_per_tenant: %d: want a number of sandboxes, or 0 for no quota", q.SandboxesPerTenant))
	}
	if q.TurnsPerHour < 0 {
		errs = append(errs, fmt.Errorf("quotas.turns_per_hour: %d: want a number of turns, or 0 for no quota", q.TurnsPerHour))
	}
	if q.SlotTTL < 0 || q.SlotTTL > 0 && q.SlotTTL < 3*time.Second {
		errs = append(errs, fmt.Errorf("quotas.slot_ttl: %s: want at least 3s (slots are renewed every third of it), or 0 for the default", q.SlotTTL))
	}
	return errs
}

// Gateway returns the gateway's Quotas.
func (q Quotas) Gateway() gateway.Quotas {
	return gateway.Quotas{
		InvokesPerSession: q.InvokesPerSession, InvokesPerTenant: q.InvokesPerTenant,
		SandboxesPerTenant: q.SandboxesPerTenant, TurnsPerHour: q.TurnsPerHour, SlotTTL: q.SlotTTL,
	}
}
