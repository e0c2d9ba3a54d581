package local

import (
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/session"
)

// reservedPaths are the sandbox paths a compute.Mount may neither replace
// nor reach into: the workspace and what the layout itself provides.
var reservedPaths = []string{Workspace, "/proc", "/dev", "/usr", "/etc", "/bin", "/sbin",
	"/lib", "/lib32", "/lib64", "/libx32", "/tmp", egressDir}

// checkMounts validates a spec's mounts and returns them with clean paths:
// each host path an existing directory, each sandbox path absolute, unique,
// and outside the workspace and the system directories.
func checkMounts(mounts []compute.Mount) ([]compute.Mount, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	out := make([]compute.Mount, 0, len(mounts))
	seen := make(map[string]bool, len(mounts))
	for _, mt := range mounts {
		host, sb := filepath.Clean(mt.Host), path.Clean(mt.Sandbox)
		if !filepath.IsAbs(mt.Host) {
			return nil, session.Errorf(session.CodeBadRequest, "sandbox mount: host path %q is not absolute", mt.Host)
		}
		if fi, err := os.Stat(host); err != nil || !fi.IsDir() {
			return nil, session.Errorf(session.CodeBadRequest, "sandbox mount: host path %q is not a directory", mt.Host)
		}
		if !path.IsAbs(mt.Sandbox) || sb == "/" || strings.ContainsRune(mt.Sandbox, 0) {
			return nil, session.Errorf(session.CodeBadRequest, "sandbox mount: sandbox path %q must be an absolute path below /", mt.Sandbox)
		}
		for _, r := range reservedPaths {
			if sb == r || strings.HasPrefix(sb, r+"/") {
				return nil, session.Errorf(session.CodeBadRequest, "sandbox mount: sandbox path %q is reserved (%s)", mt.Sandbox, r)
			}
		}
		if seen[sb] {
			return nil, session.Errorf(session.CodeBadRequest, "sandbox mount: %q is mounted twice", mt.Sandbox)
		}
		seen[sb] = true
		out = append(out, compute.Mount{Host: host, Sandbox: sb, ReadOnly: mt.ReadOnly})
	}
	return out, nil
}

// mountArgs returns the bubblewrap arguments binding mounts. bubblewrap
// creates the missing directories of each sandbox path.
func mountArgs(mounts []compute.Mount) []string {
	var a []string
	for _, mt := range mounts {
		op := "--bind"
		if mt.ReadOnly {
			op = "--ro-bind"
		}
		a = append(a, op, mt.Host, mt.Sandbox)
	}
	return a
}

// unsafeMountPaths maps the sandbox paths of mounts in args (whole
// arguments, or KEY=VALUE values) to their host paths, for commands that
// run without bubblewrap (--unsafe-no-sandbox), where nothing is mounted:
// the command sees the host directories themselves, read-write.
func unsafeMountPaths(mounts []compute.Mount, args []string) []string {
	if len(mounts) == 0 {
		return args
	}
	out := make([]string, len(args))
	for i, a := range args {
		prefix, v := "", a
		if k, val, ok := strings.Cut(a, "="); ok && !strings.HasPrefix(a, "/") {
			prefix, v = k+"=", val
		}
		for _, mt := range mounts {
			if v == mt.Sandbox || strings.HasPrefix(v, mt.Sandbox+"/") {
				v = mt.Host + strings.TrimPrefix(v, mt.Sandbox)
				break
			}
		}
		out[i] = prefix + v
	}
	return out
}

// lastWins removes the earlier of entries with the same key from an
// environment, keeping the order of the rest: a command's own HOME wins
// over the sandbox's.
func lastWins(env []string) []string {
	last := make(map[string]int, len(env))
	for i, e := range env {
		k, _, _ := strings.Cut(e, "=")
		last[k] = i
	}
	if len(last) == len(env) {
		return env
	}
	out := make([]string, 0, len(last))
	for i, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if last[k] == i {
			out = append(out, e)
		}
	}
	return out
}
