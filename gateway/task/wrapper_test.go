package task

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atriumhq/atrium/session"
)

// needGit fails the test when git is missing: the wrapper needs it.
func needGit(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is not installed: repository tasks need it (apt-get install git)")
	}
}

// gitIn runs git in dir and returns its trimmed output.
func gitIn(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// bareRepo makes a bare repository with one commit on main.
func bareRepo(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	bare := filepath.Join(dir, "repo.git")
	gitIn(t, dir, "init", "--quiet", "--bare", "--initial-branch=main", bare)
	work := filepath.Join(dir, "seed")
	gitIn(t, dir, "clone", "--quiet", bare, work)
	os.WriteFile(filepath.Join(work, "README"), []byte("hello\n"), 0o644)
	gitIn(t, work, "add", "-A")
	gitIn(t, work, "commit", "--quiet", "-m", "seed")
	gitIn(t, work, "push", "--quiet", "origin", "HEAD:main")
	return bare
}

// TestWrapper runs the wrapper script directly (no sandbox) against a
// file:// repository: the prompt is decoded from the contract's stdin line,
// changes are committed by the given author and pushed to the branch, and a
// second task with no changes says so.
func TestWrapper(t *testing.T) {
	needGit(t)
	bare := bareRepo(t)
	run := func(prompt string) (string, string) {
		t.Helper()
		ws := t.TempDir()
		h := wrapperHarness("file://"+bare, "main", "atrium/task_t1", "Alice", "alice@example.com", "Do it", session.Harness{})
		in, _ := json.Marshal(session.HarnessInput{Session: "s1", Turn: 1, Prompt: prompt, By: "alice"})
		cmd := exec.Command(h.Command[0], h.Command[1:]...)
		cmd.Dir = ws
		cmd.Env = append(os.Environ(), SecretToken+"=sekret")
		cmd.Stdin = strings.NewReader(string(in) + "\n")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("wrapper: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	tricky := "printf '%s\\n' \"<a & b> \\\"q\\\" é ✓\" > out.txt\ntest -z \"$TASK_GIT_TOKEN\" && echo no-token-inside >> out.txt"
	stdout, _ := run(tricky)
	last := stdout[strings.LastIndex(strings.TrimSpace(stdout), "\n")+1:]
	var res struct {
		Type    string `json:"type"`
		Changes bool   `json:"changes"`
		Branch  string `json:"branch"`
		Commit  string `json:"commit"`
	}
	if err := json.Unmarshal([]byte(last), &res); err != nil || res.Type != ResultType || !res.Changes || res.Branch != "atrium/task_t1" {
		t.Fatalf("result line %q (%v), stdout:\n%s", last, err, stdout)
	}
	if got := gitIn(t, bare, "rev-parse", "atrium/task_t1"); got != res.Commit {
		t.Errorf("branch is at %s, result says %s", got, res.Commit)
	}
	if got := gitIn(t, bare, "show", "atrium/task_t1:out.txt"); got != "<a & b> \"q\" é ✓\nno-token-inside" {
		t.Errorf("out.txt = %q", got)
	}
	if got := gitIn(t, bare, "log", "-1", "--format=%an <%ae>|%s", "atrium/task_t1"); got != "Alice <alice@example.com>|Do it" {
		t.Errorf("commit = %q", got)
	}

	stdout, _ = run("true")
	if !strings.Contains(stdout, "Nothing to do") || !strings.Contains(stdout, `{"type":"task_result","changes":false}`) {
		t.Errorf("no-change run printed:\n%s", stdout)
	}
}
