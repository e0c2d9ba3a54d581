package config

import (
	"strings"
	"testing"
	"time"
)

func TestQuotas(t *testing.T) {
	var f File
	err := Parse([]byte("quotas:\n  invokes_per_session: 2\n  invokes_per_tenant: -1\n  turns_per_hour: 100\n  slot_ttl: 10s\n"), &f)
	if err != nil {
		t.Fatal(err)
	}
	g := f.Quotas.Gateway()
	if g.InvokesPerSession != 2 || g.InvokesPerTenant != -1 || g.TurnsPerHour != 100 || g.SlotTTL != 10*time.Second || g.SandboxesPerTenant != 0 {
		t.Fatalf("Gateway() = %+v", g)
	}
	if errs := f.Quotas.check(); len(errs) != 0 {
		t.Fatalf("valid quotas: %v", errs)
	}
	for name, tc := range map[string]struct {
		q    Quotas
		want string
	}{
		"sandboxes": {Quotas{SandboxesPerTenant: -1}, "quotas.sandboxes_per_tenant"},
		"turns":     {Quotas{TurnsPerHour: -5}, "quotas.turns_per_hour"},
		"slot ttl":  {Quotas{SlotTTL: time.Second}, "quotas.slot_ttl"},
	} {
		errs := tc.q.check()
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %s", name, errs, tc.want)
		}
	}
}
