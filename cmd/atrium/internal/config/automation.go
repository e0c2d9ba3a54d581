package config

import (
	"fmt"
	"time"

	"github.com/atriumhq/atrium/gateway"
	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/schedule"
)

// Automation configures schedules and the retries of their runs
// (docs/automation.md, "Schedules" and "Retries and dead letters"). Every
// gateway runs a scheduler; one at a time fires the ticks.
//
//	automation:
//	  disabled: false      # true: no schedules and no /v1/dlq on this gateway
//	  run_timeout: 1h      # bounds one scheduled run, turn included
//	  attempts: 5          # tries of a run failing for a transient reason
//	  retry_base: 1s       # backoff: random delay up to retry_base·2ⁿ …
//	  retry_max: 1m        # … capped at retry_max
//	  lease_ttl: 15s       # the scheduler leader's lease: failover time
type Automation struct {
	Disabled   bool          `yaml:"disabled"`
	RunTimeout time.Duration `yaml:"run_timeout"`
	Attempts   int           `yaml:"attempts"`
	RetryBase  time.Duration `yaml:"retry_base"`
	RetryMax   time.Duration `yaml:"retry_max"`
	LeaseTTL   time.Duration `yaml:"lease_ttl"`
}

// MinSchedulerLeaseTTL is the shortest automation.lease_ttl: the leader
// renews every third of it.
const MinSchedulerLeaseTTL = 3 * time.Second

// check returns the problems of the automation section.
func (a Automation) check() []error {
	var errs []error
	if a.RunTimeout < 0 || a.Attempts < 0 || a.RetryBase < 0 || a.RetryMax < 0 || a.LeaseTTL < 0 {
		errs = append(errs, fmt.Errorf("automation: run_timeout, attempts, retry_base, retry_max and lease_ttl must not be negative"))
	}
	if a.LeaseTTL > 0 && a.LeaseTTL < MinSchedulerLeaseTTL {
		errs = append(errs, fmt.Errorf("automation.lease_ttl: %v: want at least %v (the leader renews every third of it)", a.LeaseTTL, MinSchedulerLeaseTTL))
	}
	if a.RetryBase > 0 && a.RetryMax > 0 && a.RetryMax < a.RetryBase {
		errs = append(errs, fmt.Errorf("automation.retry_max: %v is shorter than retry_base %v", a.RetryMax, a.RetryBase))
	}
	return errs
}

// Gateway returns the gateway's automation configuration; zero values are
// the defaults of packages schedule and dlq.
func (a Automation) Gateway() gateway.Automation {
	return gateway.Automation{
		Disabled: a.Disabled,
		Schedule: schedule.Config{
			RunTimeout: a.RunTimeout,
			LeaseTTL:   a.LeaseTTL,
			Retry:      dlq.Backoff{Base: a.RetryBase, Max: a.RetryMax, Attempts: a.Attempts},
		},
	}
}
