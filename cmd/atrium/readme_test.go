package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tourCommand is one shell command of the README's tour.
type tourCommand struct {
	line int    // in README.md
	text string // as written
}

// readmeTour returns the commands of the ```sh blocks under README.md's
// "## Tour" heading, in order (comment-only and blank lines left out).
func readmeTour(t testing.TB) []tourCommand {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		cmds         []tourCommand
		inTour, inSh bool
		n            int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inTour = strings.HasPrefix(line, "## Tour")
		case inTour && !inSh && strings.TrimSpace(line) == "```sh":
			inSh = true
		case inSh && strings.TrimSpace(line) == "```":
			inSh = false
		case inSh:
			if s := strings.TrimSpace(line); s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			if k := len(cmds) - 1; k >= 0 && strings.HasSuffix(cmds[k].text, "\\") {
				cmds[k].text += "\n" + line // a continued line
				continue
			}
			cmds = append(cmds, tourCommand{line: n, text: line})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(cmds) < 10 {
		t.Fatalf("README.md has %d tour commands under a \"## Tour\" heading; did the heading or its ```sh blocks move?", len(cmds))
	}
	return cmds
}

// tourScript turns the tour into one bash script that stops at the first
// command that does not do what the README says: exit 0, or, for a
// command whose comment says "refused:" or "fails:", exit non-zero. A
// command whose comment says it runs "until Ctrl-C" is stopped after a few
// seconds, as a person would. The README's address (127.0.0.1:7080,
// localhost:7080) becomes hostport, the test server's.
func tourScript(cmds []tourCommand, hostport string) string {
	var b strings.Builder
	b.WriteString("set -u\n")
	for _, c := range cmds {
		text := strings.NewReplacer("127.0.0.1:7080", hostport, "localhost:7080", hostport).Replace(c.text)
		comment := ""
		if i := strings.LastIndex(c.text, "  # "); i >= 0 {
			comment = c.text[i:]
		}
		quoted := strings.ReplaceAll(c.text, "'", `'\''`)
		fmt.Fprintf(&b, "echo '>>> README.md:%d' >&2\n", c.line)
		switch {
		case strings.Contains(comment, "until Ctrl-C"):
			fmt.Fprintf(&b, "timeout 5 %s\nrc=$?\n", text)
			fmt.Fprintf(&b, "if [ $rc -ne 124 ]; then echo 'README.md:%d ended (exit '$rc') instead of running until Ctrl-C: %s' >&2; exit 1; fi\n", c.line, quoted)
		case strings.Contains(comment, "refused:") || strings.Contains(comment, "fails:"):
			fmt.Fprintf(&b, "%s\nrc=$?\n", text)
			fmt.Fprintf(&b, "if [ $rc -eq 0 ]; then echo 'README.md:%d succeeded, but the README says it fails: %s' >&2; exit 1; fi\n", c.line, quoted)
		default:
			fmt.Fprintf(&b, "%s\nrc=$?\n", text)
			fmt.Fprintf(&b, "if [ $rc -ne 0 ]; then echo 'README.md:%d failed (exit '$rc'): %s' >&2; exit 1; fi\n", c.line, quoted)
		}
	}
	b.WriteString("echo '>>> tour done' >&2\n")
	return b.String()
}

// TestREADME_TourAsWritten runs the shell commands of README.md's tour, as
// written, with bash in a directory whose bin/atrium is the binary under
// test, against a real `atrium dev` (bubblewrap sandboxes): the README
// cannot drift from the code. Standard input is empty, so `attach` shows
// the history and detaches as a person's Ctrl-D would.
func TestREADME_TourAsWritten(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Fatal("bubblewrap is not installed: the tour runs its prompts in sandboxes (make test installs it)")
	}
	for _, tool := range []string{"bash", "curl", "timeout", "grep", "cut", "head", "tail"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README's tour uses %s, which is not installed", tool)
		}
	}
	cmds := readmeTour(t)
	p := startDev(t, t.TempDir())
	// The browser's sign-in suggests the user the CLI acts as, and the
	// banner's link signs in as that user.
	resp, err := http.Get(p.url + "/auth/config")
	if err != nil {
		t.Fatal(err)
	}
	var ac struct {
		DevUser string `json:"dev_user"`
	}
	err = json.NewDecoder(resp.Body).Decode(&ac)
	resp.Body.Close()
	if cli := devUser(os.Getenv); err != nil || ac.DevUser != cli {
		t.Fatalf("/auth/config dev_user %q (%v), want the CLI's dev user %q", ac.DevUser, err, cli)
	}
	link := p.url + "/auth/dev?" + url.Values{"user": {ac.DevUser}}.Encode()
	if !strings.Contains(p.stdout.String(), link) {
		t.Fatalf("the banner has no sign-in link %s:\n%s", link, p.stdout)
	}
	u, err := url.Parse(p.url)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if err := os.MkdirAll(filepath.Join(work, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(atriumBinary(t), filepath.Join(work, "bin", "atrium")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	script := tourScript(cmds, u.Host)
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = work
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work, "USER=alice", "ATRIUM_SERVER=" + p.url, "LANG=C.UTF-8"}
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if err != nil {
		t.Fatalf("the README's tour: %v\nstderr:\n%s\nstdout:\n%s\nscript:\n%s", err, stderr.String(), stdout.String(), script)
	}
	out, errs := stdout.String(), stderr.String()
	for _, want := range []string{"hello from ", "notes.txt", "tick 3", `got: {\"type\":\"approval\",\"id\":\"a1\",\"allow\":true}`, "event: turn_finished"} {
		if !strings.Contains(out, want) {
			t.Errorf("the tour's output lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"turn 3 failed (exit code 3)", "attached to ", "viewer"} {
		if !strings.Contains(errs, want) {
			t.Errorf("the tour's messages lack %q:\n%s", want, errs)
		}
	}
}
