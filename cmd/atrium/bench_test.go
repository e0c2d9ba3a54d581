package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestBench_CLI runs `atrium bench` as a user would, small, through the
// built binary: the fan-out and memory scenarios re-execute it as their
// receiver process (`atrium bench watchers`), so this checks that wiring.
func TestBench_CLI(t *testing.T) {
	t.Parallel()
	bin := atriumBinary(t)
	cmd := exec.Command(bin, "bench", "--scenarios", "fanout,memory,resume", "--watchers", "10", "--duration", "300ms",
		"--ramp-steps", "1", "--sessions", "5", "--resume-events", "50", "--data", t.TempDir(), "--json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("atrium bench: %v\nstderr:\n%s", err, stderr.String())
	}
	var rep struct {
		Results []struct {
			Scenario, Measure, Error string
			Value                    float64
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, stdout.String())
	}
	seen := map[string]bool{}
	for _, r := range rep.Results {
		if r.Error != "" {
			t.Errorf("%s %s: %s", r.Scenario, r.Measure, r.Error)
		}
		seen[r.Scenario] = true
	}
	for _, s := range []string{"fanout", "memory", "resume"} {
		if !seen[s] {
			t.Errorf("no %s rows in %s", s, stdout.String())
		}
	}
	if !strings.Contains(stderr.String(), "fanout ws: opened 10 WebSockets") {
		t.Errorf("no progress lines on stderr:\n%s", stderr.String())
	}
	// The RSS a few watchers add may round to nothing; that the child
	// process opened them all is what proves the wiring.
	if !strings.Contains(stderr.String(), "memory: 10 idle watchers open in a child process") {
		t.Errorf("the memory scenario's watcher process did not open its WebSockets:\n%s", stderr.String())
	}
}

func TestBench_BadScenario(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"bench", "--scenarios", "fanout,nope"}, strings.NewReader(""), &stdout, &stderr, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), `unknown scenario "nope"`) || !strings.Contains(err.Error(), "fanout,append,wake,activation,memory,resume") {
		t.Fatalf("err = %v, want the unknown scenario named and the choices listed", err)
	}
}
