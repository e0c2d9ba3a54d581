package config

import (
	"strings"
	"testing"
	"time"
)

func TestAutomation_Check(t *testing.T) {
	for name, tc := range map[string]struct {
		a    Automation
		want string // part of the error; "" for none
	}{
		"zero":           {Automation{}, ""},
		"tuned":          {Automation{RunTimeout: 2 * time.Hour, Attempts: 3, RetryBase: time.Second, RetryMax: time.Minute, LeaseTTL: 30 * time.Second}, ""},
		"negative":       {Automation{Attempts: -1}, "must not be negative"},
		"short lease":    {Automation{LeaseTTL: time.Second}, "automation.lease_ttl"},
		"max below base": {Automation{RetryBase: time.Minute, RetryMax: time.Second}, "automation.retry_max"},
	} {
		t.Run(name, func(t *testing.T) {
			errs := tc.a.check()
			switch {
			case tc.want == "" && len(errs) > 0:
				t.Errorf("check = %v, want none", errs)
			case tc.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want)):
				t.Errorf("check = %v, want one saying %q", errs, tc.want)
			}
		})
	}
	g := Automation{Disabled: true, RunTimeout: time.Hour, Attempts: 3, RetryBase: 2 * time.Second, RetryMax: time.Minute, LeaseTTL: 20 * time.Second}.Gateway()
	if !g.Disabled || g.Schedule.RunTimeout != time.Hour || g.Schedule.LeaseTTL != 20*time.Second ||
		g.Schedule.Retry.Attempts != 3 || g.Schedule.Retry.Base != 2*time.Second || g.Schedule.Retry.Max != time.Minute {
		t.Errorf("Gateway() = %+v", g)
	}
}
