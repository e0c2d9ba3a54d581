package main

import (
	"testing"

	"github.com/atriumhq/atrium/session"
)

func TestUsageTotalsColumn(t *testing.T) {
	if got := usageTotals(nil); got != "-" {
		t.Errorf("no usage = %q, want -", got)
	}
	got := usageTotals(&session.UsageTotals{InputTokens: 1200, OutputTokens: 34, CachedTokens: 5, CostUSD: 0.01876})
	if want := "1200 in, 34 out, $0.0188"; got != want {
		t.Errorf("usage = %q, want %q", got, want)
	}
}
