// Package forgetest runs a fake code forge on loopback for tests: it serves
// the GitHub or Gitea endpoints that package forge uses, with their
// documented paths, headers and JSON shapes, checks the token, and records
// the pull requests it was asked to open.
package forgetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/atriumhq/atrium/gateway/forge"
)

// PR is a pull request the fake forge opened.
type PR struct {
	Repo   string // owner/name
	Number int
	URL    string
	forge.PullRequest
}

// Server is a fake forge. Its zero value is not usable: call Start.
type Server struct {
	// URL is the API URL to configure (forge.Config.APIURL).
	URL   string
	Type  string
	Token string

	srv *httptest.Server

	mu        sync.Mutex
	perms     map[string]forge.Permission // "owner/name login", guarded by mu
	prs       []PR                        // guarded by mu
	down      bool                        // answer 503 to everything; guarded by mu
	pullsDown bool                        // answer 503 to pull requests only; guarded by mu
	calls     int                         // requests served, guarded by mu
}

// Start starts a fake forge of typ (forge.TypeGitHub or forge.TypeGitea)
// that accepts token, and stops it when the test ends.
func Start(tb testing.TB, typ, token string) *Server {
	tb.Helper()
	s := &Server{Type: typ, Token: token, perms: map[string]forge.Permission{}}
	prefix := ""
	if typ == forge.TypeGitea {
		prefix = "/api/v1"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+prefix+"/repos/{owner}/{repo}/collaborators/{user}/permission", s.permission)
	mux.HandleFunc("POST "+prefix+"/repos/{owner}/{repo}/pulls", s.pulls)
	s.srv = httptest.NewServer(s.guard(mux))
	s.URL = s.srv.URL
	tb.Cleanup(s.srv.Close)
	return s
}

// Grant gives login perm on repo ("owner/name").
func (s *Server) Grant(repo, login string, perm forge.Permission) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.perms[repo+" "+login] = perm
}

// SetDown makes the forge answer 503 to every request (down) or serve again.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// SetPullsDown makes the forge answer 503 to requests to open pull
// requests only (permission checks still work), or serve them again.
func (s *Server) SetPullsDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pullsDown = down
}

// PRs returns the pull requests opened so far.
func (s *Server) PRs() []PR {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]PR(nil), s.prs...)
}

// Calls returns how many requests the forge has answered.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *Server) guard(next http.Handler) http.Handler {
	want := "Bearer " + s.Token
	if s.Type == forge.TypeGitea {
		want = "token " + s.Token
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.calls++
		down := s.down
		s.mu.Unlock()
		switch {
		case down:
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"message": "Service Unavailable"})
		case r.Header.Get("Authorization") != want:
			writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "Bad credentials"})
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// permission serves the collaborator permission endpoint. GitHub answers
// {"permission","role_name","user"}; Gitea {"permission","role_name","user"}
// too. An unknown user is a 404 {"message":"Not Found"}.
func (s *Server) permission(w http.ResponseWriter, r *http.Request) {
	repo := r.PathValue("owner") + "/" + r.PathValue("repo")
	s.mu.Lock()
	p, ok := s.perms[repo+" "+r.PathValue("user")]
	s.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"permission": string(p), "role_name": string(p), "user": map[string]any{"login": r.PathValue("user")},
	})
}

// pulls serves POST …/pulls {title,body,head,base} → 201 {number,html_url,…};
// a missing field is GitHub's 422 "Validation Failed".
func (s *Server) pulls(w http.ResponseWriter, r *http.Request) {
	var pr forge.PullRequest
	if err := json.NewDecoder(r.Body).Decode(&pr); err != nil || pr.Title == "" || pr.Head == "" || pr.Base == "" {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": "Validation Failed"})
		return
	}
	repo := r.PathValue("owner") + "/" + r.PathValue("repo")
	s.mu.Lock()
	if s.pullsDown {
		s.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"message": "Service Unavailable"})
		return
	}
	n := len(s.prs) + 1
	web := strings.TrimSuffix(s.URL, "/")
	u := fmt.Sprintf("%s/%s/pull/%d", web, repo, n)
	if s.Type == forge.TypeGitea {
		u = fmt.Sprintf("%s/%s/pulls/%d", web, repo, n)
	}
	s.prs = append(s.prs, PR{Repo: repo, Number: n, URL: u, PullRequest: pr})
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, map[string]any{
		"number": n, "html_url": u, "state": "open", "title": pr.Title, "body": pr.Body,
		"head": map[string]any{"ref": pr.Head}, "base": map[string]any{"ref": pr.Base},
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Close stops the forge now (it is also stopped when the test ends).
func (s *Server) Close() { s.srv.Close() }
