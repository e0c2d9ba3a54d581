package atrium_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/atriumhq/atrium"

// TestDependencyDirection enforces the layering of DESIGN §2: imports flow
// downward only. session/ and web/ use the standard library only; storage/ and
// compute/ (L1) never import each other or L2, except that compute/ may use
// storage/blob (the workspace is saved to object storage); session/api may use
// session, and session/retry github.com/cenkalti/backoff/v5; actor/ and gateway/
// never import each other; nothing imports cmd/.
func TestDependencyDirection(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	// forbidden maps a package tree to the trees it must not depend on.
	forbidden := map[string][]string{
		"session": {"*"},
		"web":     {"*"},
		"storage": {"compute", "actor", "gateway", "cmd"},
		"compute": {"actor", "gateway", "cmd"},
		"actor":   {"gateway", "cmd"},
		"gateway": {"actor", "storage", "compute", "cmd"},
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, deps := fields[0], fields[1:]
		tree := treeOf(pkg)
		bans, ok := forbidden[tree]
		if !ok {
			continue
		}
		checked++
		for _, dep := range deps {
			if bans[0] == "*" {
				if tree == "session" && treeOf(dep) == "session" {
					continue // session/api builds on session
				}
				if subtree(pkg) == "session/retry" && dep == "github.com/cenkalti/backoff/v5" {
					continue // the one backoff policy (session/retry) is cenkalti's
				}
				if strings.Contains(strings.SplitN(dep, "/", 2)[0], ".") {
					t.Errorf("%s imports %s: %s may use the standard library only", pkg, dep, tree)
				}
				continue
			}
			depTree := treeOf(dep)
			for _, ban := range bans {
				if depTree == ban {
					t.Errorf("%s imports %s: %s must not depend on %s (DESIGN §2)", pkg, dep, tree, ban)
				}
			}
			if tree == "compute" && treeOf(dep) == "storage" && subtree(dep) != "storage/blob" {
				t.Errorf("%s imports %s: compute may use storage/blob only (DESIGN §2)", pkg, dep)
			}
			// L1 packages of different trees under storage/ never import each other.
			if tree == "storage" && depTree == "storage" && subtree(pkg) != subtree(dep) {
				t.Errorf("%s imports %s: storage packages must not import each other", pkg, dep)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no package of the module was checked")
	}
}

// treeOf returns the top-level folder of a module package, or "" for others.
func treeOf(pkg string) string {
	rest, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return ""
	}
	return strings.SplitN(rest, "/", 2)[0]
}

// subtree returns the second-level folder of a module package ("storage/sqlite").
func subtree(pkg string) string {
	parts := strings.SplitN(strings.TrimPrefix(pkg, module+"/"), "/", 3)
	if len(parts) < 2 {
		return parts[0]
	}
	return parts[0] + "/" + parts[1]
}
