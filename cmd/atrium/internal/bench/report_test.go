package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestReport_WriteTable(t *testing.T) {
	rep := &Report{
		Date:    time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Machine: Machine{CPUs: 2, CPUModel: "Test CPU", OS: "Debian GNU/Linux 12 (bookworm)", GoVersion: "go1.26"},
		Results: []Result{
			{Scenario: "fanout", Measure: "commit→receive", Unit: "ms", Median: 1.5, P99: 30, Samples: 100, Value: 30, Target: "p99 < 25 ms", Met: met(false)},
			{Scenario: "append", Measure: "durable append", Unit: "events/s", Value: 23456.7, Target: "≥ 20,000 events/s", Met: met(true), Note: "acks"},
			{Scenario: "wake", Measure: "(scenario)", Error: "start server: boom"},
		},
		ElapsedMS: 1500,
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"SCENARIO", "1.50 ms", "30.0 ms", "NO", "23,457 events/s", "yes", "ERROR", "start server: boom", "append durable append: acks", "2025-01-02"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if !rep.Failed() {
		t.Error("Failed() = false with an error row")
	}
	lines := strings.Split(out, "\n")
	header := lines[2]
	row := lines[3]
	runeIndex := func(s, sub string) int { return len([]rune(s[:strings.Index(s, sub)])) }
	if runeIndex(header, "TARGET") != runeIndex(row, "p99 < 25 ms") {
		t.Errorf("columns not aligned:\n%s\n%s", header, row)
	}
}

func TestConfig_Fill(t *testing.T) {
	start := func(context.Context, ServerOptions) (Server, error) { return nil, nil }
	for name, tc := range map[string]struct {
		cfg     Config
		wantErr string
	}{
		"defaults":         {cfg: Config{Start: start}},
		"unknown scenario": {cfg: Config{Start: start, Scenarios: []string{"fanout", "nope"}}, wantErr: `unknown scenario "nope"`},
		"no start":         {cfg: Config{}, wantErr: "Start is required"},
		"negative":         {cfg: Config{Start: start, Watchers: -1}, wantErr: "positive"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.fill()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.cfg.Watchers != DefaultWatchers || len(tc.cfg.Scenarios) != len(Scenarios())-1 || tc.cfg.Duration != DefaultDuration {
					t.Fatalf("defaults not filled: %+v", tc.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("fill() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestPace(t *testing.T) {
	n := 0
	fired, dropped, err := pace(context.Background(), 1000, 50*time.Millisecond, func() bool { n++; return n%10 != 0 })
	if err != nil {
		t.Fatal(err)
	}
	if fired+dropped != 50 || dropped != 5 {
		t.Fatalf("fired %d dropped %d, want 45 and 5", fired, dropped)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := pace(ctx, 10, time.Second, func() bool { return true }); err == nil {
		t.Fatal("pace with a cancelled context returned nil")
	}
}

func TestFmtCount(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.8: "1,234,568", -1500: "-1,500"} {
		if got := fmtCount(in); got != want {
			t.Errorf("fmtCount(%v) = %q, want %q", in, got, want)
		}
	}
}
