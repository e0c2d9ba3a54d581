package main

import (
	"context"
	"strings"
	"testing"
)

// TestTask_CLIUsage checks the task commands' help and usage errors, which
// need no server.
func TestTask_CLIUsage(t *testing.T) {
	c := newCLI(t, "http://127.0.0.1:1")
	help := c.ok("task", "run", "--help")
	for _, want := range []string{"--repo", "--base", "--detach", "atrium task run --repo https://github.com/acme/widgets", "atrium dlq retry"} {
		if !strings.Contains(help, want) {
			t.Errorf("task run --help lacks %q:\n%s", want, help)
		}
	}
	_, _, err := c.run(context.Background(), nil, "task", "run", "make fmt")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--repo is required") {
		t.Errorf("run without --repo: %v (exit %d)", err, exitCode(err))
	}
	_, _, err = c.run(context.Background(), nil, "task", "run", "--repo", "https://github.com/a/b", " ")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "prompt is empty") {
		t.Errorf("empty prompt: %v", err)
	}
	_, _, err = c.run(context.Background(), nil, "task", "show")
	if exitCode(err) != 2 {
		t.Errorf("show without ID: %v", err)
	}
}
