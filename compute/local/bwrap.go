package local

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/atriumhq/atrium/compute"
	"github.com/atriumhq/atrium/compute/egress"
)

// Paths and identities inside a sandbox.
const (
	// Workspace is where the session's workspace is mounted in a sandbox.
	Workspace = "/workspace"
	// SandboxUID is the uid and gid of commands inside a sandbox.
	SandboxUID = 1000
	// sandboxPath is the PATH of commands.
	sandboxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// sandboxHostname is the host name inside a sandbox.
	sandboxHostname = "atrium"
)

// etcAllowed lists the entries of the host's /etc that sandboxes see, read
// only. Anything else in /etc (shadow, SSH and TLS keys, credentials of
// package managers and version control) stays out.
var etcAllowed = []string{
	"alternatives",
	"bash.bashrc",
	"debian_version",
	"gai.conf",
	"host.conf",
	"hosts",
	"inputrc",
	"ld.so.cache",
	"ld.so.conf",
	"ld.so.conf.d",
	"localtime",
	"magic",
	"magic.mime",
	"mime.types",
	"networks",
	"nsswitch.conf",
	"os-release",
	"profile",
	"profile.d",
	"protocols",
	"services",
	"shells",
	"ssl/certs",
	"ssl/openssl.cnf",
	"terminfo",
	"timezone",
}

// systemLinks are the top-level directories that a merged-/usr system has as
// symbolic links into /usr; older systems have them as directories.
var systemLinks = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// passwd and group are the account databases of a sandbox.
const (
	sandboxPasswd = "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"atrium:x:1000:1000:atrium:/workspace:/bin/bash\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	sandboxGroup = "root:x:0:\natrium:x:1000:\nnogroup:x:65534:\n"
)

// layout is the part of the bubblewrap command line that is the same for
// every sandbox: namespaces, the read-only system and /etc.
type layout struct {
	base    []string // every sandbox
	network []string // added when the sandbox shares the host's network
}

// newLayout inspects the host's system directories and writes the generated
// account files into stateDir.
func newLayout(stateDir string, tmpBytes int64) (*layout, error) {
	if err := writeFileAtomic(filepath.Join(stateDir, "passwd"), sandboxPasswd); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(filepath.Join(stateDir, "group"), sandboxGroup); err != nil {
		return nil, err
	}
	uid := strconv.Itoa(SandboxUID)
	a := []string{
		"--unshare-all", "--unshare-user", "--disable-userns",
		"--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--uid", uid, "--gid", uid, "--hostname", sandboxHostname,
		"--ro-bind", "/usr", "/usr",
	}
	for _, name := range systemLinks {
		host := "/" + name
		fi, err := os.Lstat(host)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(host)
			if err != nil {
				return nil, fmt.Errorf("read link %s: %w", host, err)
			}
			a = append(a, "--symlink", target, host)
		case fi.IsDir():
			a = append(a, "--ro-bind", host, host)
		}
	}
	a = append(a, "--proc", "/proc", "--dev", "/dev", "--size", strconv.FormatInt(tmpBytes, 10), "--tmpfs", "/tmp",
		"--perms", "0755", "--dir", "/etc")
	made := map[string]bool{"/etc": true}
	for _, name := range etcAllowed {
		args, ok := etcEntry("/etc/" + name)
		if !ok {
			continue
		}
		// Create parent directories readable by everyone; bubblewrap
		// would make them 0700.
		var dirs []string
		for dir := path.Dir("/etc/" + name); !made[dir]; dir = path.Dir(dir) {
			dirs = append(dirs, dir)
			made[dir] = true
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			a = append(a, "--perms", "0755", "--dir", dirs[i])
		}
		a = append(a, args...)
	}
	a = append(a,
		"--ro-bind", filepath.Join(stateDir, "passwd"), "/etc/passwd",
		"--ro-bind", filepath.Join(stateDir, "group"), "/etc/group")
	l := &layout{base: a, network: []string{"--share-net"}}
	if args, ok := etcEntry("/etc/resolv.conf"); ok {
		l.network = append(l.network, args...)
	}
	return l, nil
}

// etcEntry returns the arguments that reproduce the host's file p in a
// sandbox: a symbolic link into /usr stays a link (time zone and os-release
// are found by their link's target), anything else is bound read-only.
func etcEntry(p string) ([]string, bool) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, false
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(p)
		if err != nil {
			return nil, false
		}
		abs := target
		if !path.IsAbs(abs) {
			abs = path.Join(path.Dir(p), target)
		}
		if strings.HasPrefix(abs, "/usr/") {
			return []string{"--symlink", target, p}, true
		}
		// A link elsewhere (e.g. resolv.conf into /run): bind what it
		// points to, if anything.
		if _, err := os.Stat(p); err != nil {
			return nil, false
		}
	}
	return []string{"--ro-bind", p, p}, true
}

// Paths of the egress proxy's pieces inside a sandbox.
const (
	// egressDir holds them.
	egressDir = "/run/atrium"
	// egressSocket is the node's proxy, a Unix socket bound from the host.
	egressSocket = egressDir + "/egress.sock"
	// egressForwarder is the forwarder executable (atrium itself), named
	// so that it acts as one (egress.IsForwarder).
	egressForwarder = egressDir + "/" + egress.ForwarderName
	// modelSocket is the node's model gateway, a Unix socket bound from
	// the host; the forwarder relays compute.ModelAddr to it.
	modelSocket = egressDir + "/model.sock"
)

// sandboxOptions are the parts of a bubblewrap command line that differ
// between sandboxes.
type sandboxOptions struct {
	network bool // share the host's network
	// egress, when set, binds the proxy's socket and the forwarder in and
	// starts the forwarder before the command.
	egress *egressMount
	// mounts are host directories bound into the sandbox (compute.Spec.Mounts).
	mounts []compute.Mount
	// model, when set, binds the model gateway's socket and the forwarder
	// in and starts the forwarder on compute.ModelAddr before the command.
	model *modelMount
}

// modelMount is what a command needs to reach the node's model gateway.
type modelMount struct {
	socket    string // host path of the gateway's Unix socket
	forwarder string // host path of the forwarder executable
}

// egressMount is what a command needs to reach its sandbox's egress proxy.
type egressMount struct {
	socket    string // host path of the proxy's Unix socket
	forwarder string // host path of the forwarder executable
	port      int    // where the forwarder listens on the sandbox's loopback
}

// args returns the bubblewrap arguments that run argv in a sandbox with the
// host directory workspace at /workspace and dir as working directory. argv
// is started through /bin/sh's exec so that a missing or non-executable
// command ends with the shell's status 127 or 126 and a message on stderr.
// With an egress proxy the shell first starts the forwarder in the
// background and waits until it listens; if it cannot, the command does not
// run and the status is 125.
func (l *layout) args(workspace, dir string, o sandboxOptions, argv []string) []string {
	a := make([]string, 0, len(l.base)+len(l.network)+32+len(argv))
	a = append(a, l.base...)
	if o.network {
		a = append(a, l.network...)
	}
	script := `exec "$@"`
	if e := o.egress; e != nil {
		a = append(a,
			"--perms", "0755", "--dir", "/run",
			"--perms", "0755", "--dir", egressDir,
			"--ro-bind", e.forwarder, egressForwarder,
			"--ro-bind", e.socket, egressSocket)
		// The substitution ends when the forwarder, in the background,
		// has printed that it listens and closed its output.
		script = `ready=$(` + egressForwarder + " -listen " + egressListen(e.port) + " -socket " + egressSocket +
			` &); [ "$ready" = ` + egress.ForwarderReady + ` ] || exit 125; exec "$@"`
	}
	if mm := o.model; mm != nil {
		if o.egress == nil {
			a = append(a,
				"--perms", "0755", "--dir", "/run",
				"--perms", "0755", "--dir", egressDir,
				"--ro-bind", mm.forwarder, egressForwarder)
		}
		a = append(a, "--ro-bind", mm.socket, modelSocket)
		script = `ready=$(` + egressForwarder + " -listen " + compute.ModelAddr + " -socket " + modelSocket +
			` &); [ "$ready" = ` + egress.ForwarderReady + ` ] || exit 125; ` + script
	}
	a = append(a, "--bind", workspace, Workspace)
	a = append(a, mountArgs(o.mounts)...)
	a = append(a,
		"--chdir", dir,
		"--remount-ro", "/",
		"--", "/bin/sh", "-c", script, "sh")
	return append(a, argv...)
}

// egressListen is the address of the egress proxy on a sandbox's loopback.
func egressListen(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// proxyEnv returns the environment that points programs at the egress proxy
// listening at addr (host:port): the variables curl, wget, pip, npm, git,
// Go, Python's requests and most others read.
func proxyEnv(addr string) []string {
	u := "http://" + addr
	const local = "localhost,127.0.0.1,::1"
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=" + local, "no_proxy=" + local,
	}
}

// wrapper returns the arguments of /bin/sh that put the shell into the
// cgroups whose cgroup.procs files are given and then exec target. Joining
// happens before target runs, so nothing it forks escapes the limits.
func wrapper(procsFiles []string, target []string) []string {
	var b strings.Builder
	if len(procsFiles) > 0 {
		b.WriteString("{ ")
		for i, f := range procsFiles {
			if i > 0 {
				b.WriteString(" && ")
			}
			b.WriteString("echo $$ > ")
			b.WriteString(shellQuote(f))
		}
		b.WriteString("; } || { echo 'atrium: cannot enter the sandbox cgroup' >&2; exit 125; }; ")
	}
	b.WriteString(`exec "$@"`)
	return append([]string{"sh", "-c", b.String(), "sh"}, target...)
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// writeFileAtomic replaces the file at p with data. Running sandboxes keep
// the old file they bound.
func writeFileAtomic(p, data string) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}
