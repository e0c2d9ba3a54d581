package task

// Agent tasks: a task whose session runs an ACP agent (`atrium task run
// --agent claude`). An agent session has no harness to wrap, so the git work
// happens here, beside the forge calls, and the workspace moves through the
// session's files archive (DESIGN §7 "More REST"):
//
//   - seed: before the first turn, the repository is cloned into a
//     temporary directory, the task's branch is checked out from the base,
//     and the whole tree (with .git, so the agent can use git) is unpacked
//     into the session's /workspace;
//   - the agent works in one turn;
//   - collect: the workspace is downloaded as an archive and laid over a
//     fresh clone of the base; what differs is committed (as the task's
//     user) and pushed to the task's branch.
//
// Nothing of the workspace's .git is trusted: collect runs git only in its
// own clone, and takes the agent's files, never its git config, hooks or
// commits. Agent state lives in the agent's home outside /workspace, so it
// is never committed. The forge token stays in this process: it reaches git
// through a credential helper reading the environment, never an argv, a URL
// or a file, and never enters the sandbox.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/atriumhq/atrium/gateway/dlq"
	"github.com/atriumhq/atrium/gateway/tarball"
	"github.com/atriumhq/atrium/session"
)

// DefaultGitTimeout bounds one git command of an agent task (a clone, a
// push).
const DefaultGitTimeout = 10 * time.Minute

// gitHelper is the credential helper of an agent task's git commands: it
// answers with the environment's TASK_GIT_USERNAME and TASK_GIT_TOKEN.
const gitHelper = `!f() { test "$1" = get || exit 0; echo "username=${TASK_GIT_USERNAME:-x-access-token}"; echo "password=${TASK_GIT_TOKEN:-}"; }; f`

// gitRepo is a clone of a task's repository in a temporary directory.
type gitRepo struct {
	dir  string
	env  []string // git's environment: no user or system config, the credential
	name string   // commit author
	mail string
}

// clone clones t's repository at its base into a new temporary directory
// and checks out t's branch from the base. Errors reaching the repository
// are transient; a missing base branch is not.
func (s *Service) clone(ctx context.Context, t *Task, f *Forge) (*gitRepo, error) {
	dir, err := os.MkdirTemp("", "atrium-task-")
	if err != nil {
		return nil, dlq.Transient(fmt.Errorf("make a directory for the clone: %w", err))
	}
	user := f.GitUsername
	if user == "" {
		user = "x-access-token"
	}
	g := &gitRepo{dir: dir, name: t.User, mail: t.Email}
	if g.mail == "" {
		g.mail = t.User
	}
	g.env = append(gitBaseEnv(), "TASK_GIT_USERNAME="+user, "TASK_GIT_TOKEN="+f.Token)
	if _, err := g.run(ctx, "-c", "credential.helper=", "-c", "credential.helper="+gitHelper,
		"clone", "--quiet", "--no-checkout", "--", t.Repo, "."); err != nil {
		g.remove()
		return nil, dlq.Transient(fmt.Errorf("clone %s: %w", t.Repo, err))
	}
	if _, err := g.run(ctx, "rev-parse", "--verify", "-q", "refs/remotes/origin/"+t.Base); err != nil {
		g.remove()
		return nil, fmt.Errorf("%s has no branch %s: give an existing base branch", t.Repo, t.Base)
	}
	if _, err := g.run(ctx, "checkout", "--quiet", "-B", t.Branch, "origin/"+t.Base); err != nil {
		g.remove()
		return nil, fmt.Errorf("check out %s from %s: %w", t.Branch, t.Base, err)
	}
	return g, nil
}

// gitBaseEnv is the environment of git commands run here: the process's
// PATH and HOME, without the operator's git configuration, prompts or
// proxies from the session.
func gitBaseEnv() []string {
	env := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=/bin/false", "LC_ALL=C"}
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// run runs git in g's directory and returns its trimmed stdout; an error
// carries the tail of its stderr (which never holds the token: it is not
// in any argument or URL).
func (g *gitRepo) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultGitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", append([]string{"-c", "user.name=" + g.name, "-c", "user.email=" + g.mail,
		"-c", "core.hooksPath=/dev/null"}, args...)...)
	cmd.Dir, cmd.Env = g.dir, g.env
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		tail := strings.TrimSpace(stderr.String())
		if len(tail) > 512 {
			tail = "…" + tail[len(tail)-512:]
		}
		if tail != "" {
			return "", fmt.Errorf("git %s: %w: %s", args[len(args)-1], err, tail)
		}
		return "", fmt.Errorf("git %s: %w", args[len(args)-1], err)
	}
	return strings.TrimSpace(out.String()), nil
}

func (g *gitRepo) remove() { _ = os.RemoveAll(g.dir) }

// seed puts t's repository, on t's branch, into its session's workspace.
func (s *Service) seed(ctx context.Context, t *Task, f *Forge) error {
	g, err := s.clone(ctx, t, f)
	if err != nil {
		return err
	}
	defer g.remove()
	// The agent commits as the task's user if it commits at all; collect
	// takes its files, not its commits.
	if _, err := g.run(ctx, "config", "user.name", g.name); err != nil {
		return err
	}
	if _, err := g.run(ctx, "config", "user.email", g.mail); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { // owned: seed waits for done.
		err := writeTarGz(pw, g.dir)
		pw.CloseWithError(err)
		done <- err
	}()
	err = s.cfg.Sessions.PutArchive(ctx, t.Principal, t.Session, "", pr)
	pr.CloseWithError(errors.New("task: upload ended"))
	if werr := <-done; werr != nil && err == nil {
		err = dlq.Transient(fmt.Errorf("pack the clone: %w", werr))
	}
	if err != nil {
		return fmt.Errorf("put the repository into session %s: %w", t.Session, err)
	}
	return nil
}

// collect commits what the agent left in t's workspace on t's branch and
// pushes it. The result has Changes false when the workspace's files equal
// the base's.
func (s *Service) collect(ctx context.Context, t *Task, f *Forge) (result, error) {
	g, err := s.clone(ctx, t, f)
	if err != nil {
		return result{}, err
	}
	defer g.remove()
	// The download goes to a file first, so a stream that breaks off
	// changes nothing in the clone.
	tmp, err := os.CreateTemp("", "atrium-task-workspace-*.tar.gz")
	if err != nil {
		return result{}, dlq.Transient(fmt.Errorf("make a file for the workspace: %w", err))
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := s.cfg.Sessions.GetArchive(ctx, t.Principal, t.Session, "", tmp); err != nil {
		return result{}, fmt.Errorf("download the workspace of session %s: %w", t.Session, err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return result{}, err
	}
	if err := clearTree(g.dir); err != nil {
		return result{}, dlq.Transient(fmt.Errorf("empty the clone: %w", err))
	}
	if err := extractTarGz(tmp, g.dir); err != nil {
		return result{}, fmt.Errorf("unpack the workspace of session %s: %w", t.Session, err)
	}
	if _, err := g.run(ctx, "add", "-A"); err != nil {
		return result{}, err
	}
	if _, err := g.run(ctx, "diff", "--cached", "--quiet"); err == nil {
		return result{Changes: false}, nil
	}
	if _, err := g.run(ctx, "commit", "--quiet", "--no-verify", "-m", t.Title); err != nil {
		return result{}, err
	}
	if _, err := g.run(ctx, "-c", "credential.helper=", "-c", "credential.helper="+gitHelper,
		"push", "--quiet", "--force", "origin", "HEAD:refs/heads/"+t.Branch); err != nil {
		return result{}, dlq.Transient(fmt.Errorf("push %s: %w", t.Branch, err))
	}
	commit, err := g.run(ctx, "rev-parse", "HEAD")
	if err != nil {
		return result{}, err
	}
	return result{Changes: true, Branch: t.Branch, Commit: commit}, nil
}

// clearTree removes everything in dir but .git.
func clearTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == ".git" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// writeTarGz writes dir's folders, regular files and symbolic links as a
// tar.gz, names relative to dir.
func writeTarGz(w io.Writer, dir string) error { return tarball.Write(w, dir) }

// extractTarGz unpacks a workspace archive into dir, leaving out anything
// with a .git component (the workspace's repository, and nested ones whose
// config or hooks git would otherwise read here), with the modes git keeps.
// No entry (a "..", an absolute name, a symbolic link in the path) can reach
// outside dir.
func extractTarGz(r io.Reader, dir string) error {
	return tarball.Extract(r, dir, tarball.ExtractOptions{Skip: hasGitComponent, PlainModes: true})
}

// hasGitComponent reports whether a slash-separated path has a component
// git reserves (".git", in any case).
func hasGitComponent(name string) bool {
	for c := range strings.SplitSeq(name, "/") {
		if strings.EqualFold(c, ".git") {
			return true
		}
	}
	return false
}

// agentResult is the outcome of an agent task's turn: an agent reports no
// task_result; an ok turn is the signal to collect.
func agentOutcome(t *Task, d session.TurnFinishedData, sandboxDown string) error {
	switch {
	case d.Status == session.TurnOK:
		return nil
	case d.Status == session.TurnTimeout:
		return dlq.Transient(fmt.Errorf("turn %d of session %s timed out", d.Turn, t.Session))
	case sandboxDown != "":
		return dlq.Transient(fmt.Errorf("the sandbox of session %s failed: %s", t.Session, sandboxDown))
	case d.Status == session.TurnCancelled:
		return fmt.Errorf("turn %d of session %s was cancelled", d.Turn, t.Session)
	}
	return turnFailed(t, fmt.Errorf("the agent's turn %d of session %s failed: see the session's events", d.Turn, t.Session))
}
