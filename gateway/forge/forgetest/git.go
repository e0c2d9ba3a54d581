package forgetest

import (
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Git is a real git server on loopback: git http-backend behind
// net/http/cgi, serving bare repositories in a temporary directory over
// smart HTTP, with HTTP basic authentication whose password must be the
// token (any user name, as forges accept tokens).
type Git struct {
	// URL is the server's base URL; a repository is at URL/OWNER/NAME.git.
	URL  string
	Root string

	tb testing.TB
}

// StartGit starts a git server that accepts token, and stops it when the
// test ends. It fails the test if git is not installed.
func StartGit(tb testing.TB, token string) *Git {
	tb.Helper()
	gitPath, err := exec.LookPath("git")
	if err != nil {
		tb.Fatal("git is not installed: repository task tests need it (apt-get install git)")
	}
	out, err := exec.Command(gitPath, "--exec-path").Output()
	if err != nil {
		tb.Fatalf("git --exec-path: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		tb.Fatalf("git-http-backend is missing (%v): install git's full package", err)
	}
	g := &Git{Root: tb.TempDir(), tb: tb}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + g.Root, "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pass, ok := r.BasicAuth()
		if !ok || pass != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		// REMOTE_USER lets http-backend accept pushes.
		h2 := *h
		h2.Env = append(append([]string(nil), h.Env...), "REMOTE_USER=task")
		h2.ServeHTTP(w, r)
	}))
	tb.Cleanup(srv.Close)
	g.URL = srv.URL
	return g
}

// Repo creates the bare repository OWNER/NAME with one commit (a README)
// on branch base and returns its URL.
func (g *Git) Repo(ownerName, base string) string {
	g.tb.Helper()
	bare := g.dir(ownerName)
	g.run(g.Root, "init", "--quiet", "--bare", "--initial-branch="+base, bare)
	seed := filepath.Join(g.tb.TempDir(), "seed")
	g.run(g.Root, "clone", "--quiet", bare, seed)
	if err := os.WriteFile(filepath.Join(seed, "README"), []byte("hello\n"), 0o644); err != nil {
		g.tb.Fatal(err)
	}
	g.run(seed, "add", "-A")
	g.run(seed, "commit", "--quiet", "-m", "seed")
	g.run(seed, "push", "--quiet", "origin", "HEAD:"+base)
	return g.URL + "/" + ownerName + ".git"
}

// Rev returns the commit ref points at in repository OWNER/NAME, or "" if
// there is no such ref.
func (g *Git) Rev(ownerName, ref string) string {
	g.tb.Helper()
	out, err := g.cmd(g.dir(ownerName), "rev-parse", "--verify", "-q", ref).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Git runs git in repository OWNER/NAME and returns its output.
func (g *Git) Git(ownerName string, args ...string) string {
	g.tb.Helper()
	return g.run(g.dir(ownerName), args...)
}

func (g *Git) dir(ownerName string) string { return filepath.Join(g.Root, ownerName+".git") }

func (g *Git) cmd(dir string, args ...string) *exec.Cmd {
	c := exec.Command("git", args...)
	c.Dir = dir
	c.Env = append(os.Environ(), "GIT_AUTHOR_NAME=seed", "GIT_AUTHOR_EMAIL=seed@example.com",
		"GIT_COMMITTER_NAME=seed", "GIT_COMMITTER_EMAIL=seed@example.com")
	return c
}

func (g *Git) run(dir string, args ...string) string {
	g.tb.Helper()
	out, err := g.cmd(dir, args...).CombinedOutput()
	if err != nil {
		g.tb.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}
