package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLI_Files walks the agent-mode flow of docs/automation.md with the CLI
// against the real stack: upload an agent's folder, run it with a JSON body
// on stdin, collect its output file, see what the turn changed, fork.
func TestCLI_Files(t *testing.T) {
	c := newCLI(t, startRealStack(t))
	id := strings.TrimSpace(c.ok("new", "--title", "agent mode", "--command", "bash agent/run.sh", "--stdin", "text"))

	local := t.TempDir()
	agent := filepath.Join(local, "agent")
	os.MkdirAll(filepath.Join(agent, "lib"), 0o755)
	os.WriteFile(filepath.Join(agent, "run.sh"), []byte("mkdir -p out\nread -r body\necho \"got $body\" > out/result.txt\ncat agent/lib/greeting.txt\n"), 0o755)
	os.WriteFile(filepath.Join(agent, "lib", "greeting.txt"), []byte("hello from the agent\n"), 0o644)

	os.WriteFile(filepath.Join(agent, "install.sh"), []byte("echo installed >> .installs\n"), 0o755)
	c.ok("cp", agent, id+":agent")
	// The install step runs once after files change, not on every invoke.
	c.ok("settings", id, "--set", "setup=bash agent/install.sh", "--set", "memory_bytes=1GiB", "--set", "pids=256")
	listing := c.ok("files", id, "agent", "-r")
	if !strings.Contains(listing, "agent/run.sh") || !strings.Contains(listing, "agent/lib/greeting.txt") || !strings.Contains(listing, "0755") {
		t.Fatalf("files -r:\n%s", listing)
	}
	if out := c.ok("invoke", id, `{"n":1}`); out != "hello from the agent\n" {
		t.Fatalf("invoke: %q", out)
	}
	// The body reaches the program on stdin (as the harness's first line,
	// or alone with --stdin text).
	if got := c.ok("cp", id+":out/result.txt", "-"); !strings.HasPrefix(got, "got {") || !strings.Contains(got, `"n`) {
		t.Fatalf("cp out: %q", got)
	}
	c.ok("invoke", id, `{"n":2}`)
	if got := c.ok("cp", id+":.installs", "-"); got != "installed\n" {
		t.Fatalf("setup ran %q over two invokes with no file written between them, want once", got)
	}
	diff := c.ok("diff", id, "--turn", "1")
	if !strings.Contains(diff, "A out/result.txt") || !strings.Contains(diff, "+got {") {
		t.Fatalf("diff:\n%s", diff)
	}

	// A file in from stdin, a folder out.
	if _, errs, err := c.run(cliContext(t), strings.NewReader("input\n"), "cp", "-", id+":in/data.txt"); err != nil {
		t.Fatalf("cp - : %v %s", err, errs)
	}
	// A file written since: the next invoke installs again first.
	c.ok("invoke", id, `{"n":3}`)
	if got := c.ok("cp", id+":.installs", "-"); got != "installed\ninstalled\n" {
		t.Fatalf("setup after a file was written: %q, want a second run", got)
	}
	dst := filepath.Join(local, "copy")
	c.ok("cp", id+":agent", dst)
	if b, err := os.ReadFile(filepath.Join(dst, "lib", "greeting.txt")); err != nil || string(b) != "hello from the agent\n" {
		t.Fatalf("folder out: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("folder out kept no mode: %v %v", fi, err)
	}

	// A fork has the workspace; the parent keeps its own.
	fork := strings.TrimSpace(c.ok("fork", id, "--title", "forked"))
	if got := c.ok("cp", fork+":in/data.txt", "-"); got != "input\n" {
		t.Fatalf("fork's file: %q", got)
	}

	// Bad input says what is wrong.
	_, _, err := c.run(cliContext(t), nil, "cp", id+":../etc/passwd", "-")
	if err == nil || !strings.Contains(err.Error(), "..") {
		t.Fatalf("cp of a path leaving the workspace: %v", err)
	}
	_, _, err = c.run(cliContext(t), nil, "cp", "a", "b")
	if exitCode(err) != 2 {
		t.Fatalf("cp without a session path: %v", err)
	}
}
