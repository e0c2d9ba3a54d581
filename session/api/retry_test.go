package api

import (
	"testing"
	"time"
)

// TestRetryPolicy_Delays: defaults fill what a policy leaves out, and a
// first wait above the default cap raises the cap to it.
func TestRetryPolicy_Delays(t *testing.T) {
	for name, tc := range map[string]struct {
		p         RetryPolicy
		base, max time.Duration
	}{
		"defaults":        {RetryPolicy{Attempts: 2}, DefaultRetryBackoff, DefaultRetryMaxBackoff},
		"given":           {RetryPolicy{Attempts: 2, Backoff: "5s", MaxBackoff: "1m"}, 5 * time.Second, time.Minute},
		"long first wait": {RetryPolicy{Attempts: 2, Backoff: "1h"}, time.Hour, time.Hour},
		"cap only":        {RetryPolicy{Attempts: 2, MaxBackoff: "2h"}, DefaultRetryBackoff, 2 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			if err := tc.p.Validate(); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if base, max := tc.p.Delays(); base != tc.base || max != tc.max {
				t.Fatalf("delays %v, %v; want %v, %v", base, max, tc.base, tc.max)
			}
		})
	}
}
