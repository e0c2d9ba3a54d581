package local

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupMount is where the cgroup hierarchies are mounted.
const cgroupMount = "/sys/fs/cgroup"

// cgroupRemoveTimeout bounds how long removing a cgroup waits for its last
// processes to be released by the kernel.
const cgroupRemoveTimeout = 5 * time.Second

// cgroup is one cgroup in the memory, pids and cpu hierarchies. On cgroup
// v1 they are separate directories; on cgroup v2 the fields name the same
// directory. An empty field means that controller is unavailable.
type cgroup struct {
	v2     bool
	memory string
	pids   string
	cpu    string
}

// dirs returns the distinct directories of c.
func (c cgroup) dirs() []string {
	var ds []string
	for _, d := range []string{c.pids, c.memory, c.cpu} {
		if d != "" && !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	return ds
}

// child returns the cgroup named name below c; it does not create it.
func (c cgroup) child(name string) cgroup {
	j := func(d string) string {
		if d == "" {
			return ""
		}
		return filepath.Join(d, name)
	}
	return cgroup{v2: c.v2, memory: j(c.memory), pids: j(c.pids), cpu: j(c.cpu)}
}

// create makes c's directories; existing ones are fine.
func (c cgroup) create() error {
	for _, d := range c.dirs() {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
	}
	return nil
}

// procsFiles returns the files a process writes its pid to, to join c.
func (c cgroup) procsFiles() []string {
	var fs []string
	for _, d := range c.dirs() {
		fs = append(fs, filepath.Join(d, "cgroup.procs"))
	}
	return fs
}

// procs lists the processes in c (not in its children). A cgroup that does
// not exist has none.
func (c cgroup) procs() ([]int, error) {
	ds := c.dirs()
	if len(ds) == 0 {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(ds[0], "cgroup.procs"))
	// A cgroup removed while we read it (its last process exited and Wait
	// cleaned it up) answers ENODEV rather than ENOENT: it has no processes.
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read cgroup procs: %w", err)
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killAll sends SIGKILL to every process in c once. On cgroup v2 kernels
// with cgroup.kill this is atomic with respect to forks.
func (c cgroup) killAll() error {
	if c.v2 && len(c.dirs()) > 0 {
		err := writeCgroupFile(filepath.Join(c.dirs()[0], "cgroup.kill"), "1")
		if err == nil {
			return nil
		}
		// Kernels before 5.14 have no cgroup.kill: fall back to pids.
	}
	pids, err := c.procs()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := kill(pid, syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill %d: %w", pid, err)
		}
	}
	return nil
}

// setLimits writes the memory, process and CPU limits of c; cpus 0 means
// no CPU limit.
func (c cgroup) setLimits(memory int64, pids int, cpus float64) error {
	if c.memory != "" {
		if c.v2 {
			if err := writeCgroupFile(filepath.Join(c.memory, "memory.max"), strconv.FormatInt(memory, 10)); err != nil {
				return err
			}
			// Without this the limit could be dodged by swapping.
			swap := filepath.Join(c.memory, "memory.swap.max")
			if _, err := os.Stat(swap); err == nil {
				if err := writeCgroupFile(swap, "0"); err != nil {
					return err
				}
			}
		} else if err := setV1Memory(c.memory, memory); err != nil {
			return err
		}
	}
	if c.pids != "" {
		if err := writeCgroupFile(filepath.Join(c.pids, "pids.max"), strconv.Itoa(pids)); err != nil {
			return err
		}
	}
	if c.cpu != "" {
		if err := c.setCPU(cpus); err != nil {
			return err
		}
	}
	return nil
}

// cpuPeriod is the period, in microseconds, over which a CPU limit is
// enforced: a sandbox limited to N CPUs runs for at most N*cpuPeriod
// microseconds in each period. The kernel's default, 100 ms.
const cpuPeriod = 100_000

// cpuQuota returns the quota in microseconds per cpuPeriod for a limit of
// cpus, or -1 for no limit.
func cpuQuota(cpus float64) int64 {
	if cpus <= 0 {
		return -1
	}
	return max(int64(math.Round(cpus*cpuPeriod)), minCPUQuota)
}

// minCPUQuota is the smallest quota the kernel accepts, in microseconds.
const minCPUQuota = 1000

// setCPU writes the CPU bandwidth limit of c: cpu.max on cgroup v2,
// cpu.cfs_period_us and cpu.cfs_quota_us on v1.
func (c cgroup) setCPU(cpus float64) error {
	quota := cpuQuota(cpus)
	period := strconv.Itoa(cpuPeriod)
	if c.v2 {
		v := "max " + period
		if quota > 0 {
			v = strconv.FormatInt(quota, 10) + " " + period
		}
		return writeCgroupFile(filepath.Join(c.cpu, "cpu.max"), v)
	}
	quotaFile := filepath.Join(c.cpu, "cpu.cfs_quota_us")
	// Lift the quota first: a quota and period that are valid together
	// may not be with the other's old value.
	if err := writeCgroupFile(quotaFile, "-1"); err != nil {
		return err
	}
	if err := writeCgroupFile(filepath.Join(c.cpu, "cpu.cfs_period_us"), period); err != nil {
		return err
	}
	if quota < 0 {
		return nil
	}
	err := writeCgroupFile(quotaFile, strconv.FormatInt(quota, 10))
	if errors.Is(err, syscall.EINVAL) {
		// Cgroup v1 refuses a quota above an ancestor's (atrium itself
		// runs under a lower CPU limit): that limit applies anyway.
		return nil
	}
	return err
}

// cpuThrottled returns how many periods the kernel throttled c (and its
// children) for exceeding the CPU limit, and false when it does not say.
func (c cgroup) cpuThrottled() (int64, bool) {
	if c.cpu == "" {
		return 0, false
	}
	return readKeyed(filepath.Join(c.cpu, "cpu.stat"), "nr_throttled")
}

// setV1Memory sets memory.limit_in_bytes and, when swap accounting is on,
// memory.memsw.limit_in_bytes (memory plus swap) to limit. The kernel keeps
// memsw >= limit at every step, so the order depends on the current values.
func setV1Memory(dir string, limit int64) error {
	v := strconv.FormatInt(limit, 10)
	mem := filepath.Join(dir, "memory.limit_in_bytes")
	sw := filepath.Join(dir, "memory.memsw.limit_in_bytes")
	if _, err := os.Stat(sw); err != nil {
		return writeCgroupFile(mem, v)
	}
	if err := writeCgroupFile(mem, v); err != nil {
		// Raising the limit above the current memsw: raise memsw first.
		if err2 := writeCgroupFile(sw, v); err2 != nil {
			return err
		}
		return writeCgroupFile(mem, v)
	}
	return writeCgroupFile(sw, v)
}

// oomKills returns how many processes of c the kernel's OOM killer has
// killed, and false when the kernel does not report it.
func (c cgroup) oomKills() (int64, bool) {
	if c.memory == "" {
		return 0, false
	}
	file := "memory.oom_control" // v1, kernel 4.13 and later
	if c.v2 {
		file = "memory.events"
	}
	n, ok := readKeyed(filepath.Join(c.memory, file), "oom_kill")
	return n, ok
}

// pidsCurrent returns the number of tasks in c and its children.
func (c cgroup) pidsCurrent() (int64, bool) {
	if c.pids == "" {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(c.pids, "pids.current"))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// children lists the names of c's child cgroups.
func (c cgroup) children() []string {
	var names []string
	for _, d := range c.dirs() {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(names, e.Name()) {
				names = append(names, e.Name())
			}
		}
	}
	return names
}

// remove deletes c's directories. The kernel refuses while processes are
// still being released, so it retries for a short while.
func (c cgroup) remove() error {
	deadline := time.Now().Add(cgroupRemoveTimeout)
	for _, d := range c.dirs() {
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w", d, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// enableControllers makes ctrls available to the children of the cgroup v2
// directory dir.
func enableControllers(dir string, ctrls []string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("read subtree_control of %s: %w", dir, err)
	}
	have := strings.Fields(string(b))
	var add []string
	for _, c := range ctrls {
		if !slices.Contains(have, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := writeCgroupFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " ")); err != nil {
		return fmt.Errorf("enable controllers in %s: %w", dir, err)
	}
	return nil
}

// cgroups is the provider's place in the cgroup hierarchies: a parent cgroup
// holding one cgroup per sandbox (with the sandbox's limits), which holds one
// leaf cgroup per running command.
type cgroups struct {
	parent cgroup
	// v2root and ctrls are set on cgroup v2, where controllers must be
	// enabled in every ancestor of a cgroup that uses them.
	v2root string
	ctrls  []string
}

// setupCgroups finds the memory, pids and cpu controllers and creates the
// parent cgroup. parent is a path from the root of the hierarchy; "" picks
// the default described at Config.CgroupParent. It fails when no controller
// is usable; warn describes the controllers that are missing.
func setupCgroups(parent string) (cs *cgroups, warn string, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupMount, &st); err != nil {
		return nil, "", fmt.Errorf("stat %s: %w", cgroupMount, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		if parent == "" {
			parent = DefaultCgroupParent
		}
		return setupCgroupsV2(cgroupMount, parent)
	}
	return setupCgroupsV1(parent)
}

// setupCgroupsV2 prepares root/parent on a unified hierarchy mounted at root.
func setupCgroupsV2(root, parent string) (*cgroups, string, error) {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return nil, "", fmt.Errorf("read cgroup controllers: %w", err)
	}
	avail := strings.Fields(string(b))
	var ctrls []string
	var warn string
	var missing []string
	for _, c := range []string{"memory", "pids", "cpu"} {
		if slices.Contains(avail, c) {
			ctrls = append(ctrls, c)
		} else {
			missing = append(missing, "the cgroup v2 "+c+" controller is not available")
		}
	}
	if len(ctrls) == 0 {
		return nil, "", errors.New("cgroup v2 has none of the memory, pids and cpu controllers")
	}
	warn = strings.Join(missing, "; ")
	dir := filepath.Join(root, filepath.Clean("/"+parent))
	cg := cgroup{v2: true}
	if slices.Contains(ctrls, "memory") {
		cg.memory = dir
	}
	if slices.Contains(ctrls, "pids") {
		cg.pids = dir
	}
	if slices.Contains(ctrls, "cpu") {
		cg.cpu = dir
	}
	cs := &cgroups{parent: cg, v2root: root, ctrls: ctrls}
	err = cs.ensureParent()
	if err != nil && cg.cpu != "" && len(ctrls) > 1 {
		// The cpu controller can be refused (real-time processes in an
		// ancestor) where memory and pids work: keep those.
		cs.ctrls = slices.DeleteFunc(slices.Clone(ctrls), func(c string) bool { return c == "cpu" })
		cs.parent.cpu = ""
		if err2 := cs.ensureParent(); err2 == nil {
			return cs, strings.Join(append(missing, "cannot enable the cgroup v2 cpu controller: "+err.Error()), "; "), nil
		}
	}
	if err != nil {
		return nil, "", err
	}
	return cs, warn, nil
}

// setupCgroupsV1 prepares the parent cgroup in the v1 memory, pids and cpu
// hierarchies. By default it nests under the cgroup this process runs in, so
// sandboxes stay inside any limit the operator put on atrium itself.
func setupCgroupsV1(parent string) (*cgroups, string, error) {
	mounts, err := v1Mounts()
	if err != nil {
		return nil, "", err
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, "", err
	}
	cg := cgroup{}
	var problems []string
	for _, ctrl := range []string{"memory", "pids", "cpu"} {
		m, ok := mounts[ctrl]
		if !ok {
			problems = append(problems, "no cgroup v1 "+ctrl+" hierarchy is mounted")
			continue
		}
		rel := parent
		if rel == "" {
			// Paths in /proc/self/cgroup are relative to the hierarchy's
			// root; the mount may show only a subtree of it.
			p := own[ctrl]
			if r, ok := strings.CutPrefix(p, m.root); ok && m.root != "/" {
				p = r
			}
			rel = filepath.Join(p, "atrium")
		}
		dir := filepath.Join(m.point, filepath.Clean("/"+rel))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			problems = append(problems, fmt.Sprintf("create %s: %v", dir, err))
			continue
		}
		switch ctrl {
		case "memory":
			cg.memory = dir
		case "pids":
			cg.pids = dir
		case "cpu":
			cg.cpu = dir
		}
	}
	if cg.memory == "" && cg.pids == "" && cg.cpu == "" {
		return nil, "", errors.New(strings.Join(problems, "; "))
	}
	return &cgroups{parent: cg}, strings.Join(problems, "; "), nil
}

// ensureParent (re)creates the parent cgroup, which Close removes when it is
// empty and another provider in this process may have removed meanwhile.
func (cs *cgroups) ensureParent() error {
	if cs.v2root == "" {
		for _, d := range cs.parent.dirs() {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("create cgroup %s: %w", d, err)
			}
		}
		return nil
	}
	dir := cs.parent.dirs()[0]
	rel, err := filepath.Rel(cs.v2root, dir)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", dir, err)
	}
	p := cs.v2root
	for part := range strings.SplitSeq(rel, string(filepath.Separator)) {
		if err := enableControllers(p, cs.ctrls); err != nil {
			return err
		}
		p = filepath.Join(p, part)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create cgroup %s: %w", p, err)
		}
	}
	return enableControllers(dir, cs.ctrls)
}

// createSession makes (or reuses) the cgroup of a sandbox and sets its
// limits.
func (cs *cgroups) createSession(name string, memory int64, pids int, cpus float64) (cgroup, error) {
	if err := cs.ensureParent(); err != nil {
		return cgroup{}, err
	}
	cg := cs.parent.child(name)
	err := cg.create()
	if errors.Is(err, fs.ErrNotExist) {
		// Another provider's Close removed the parent meanwhile.
		if err := cs.ensureParent(); err != nil {
			return cgroup{}, err
		}
		err = cg.create()
	}
	if err != nil {
		return cgroup{}, err
	}
	if cs.v2root != "" {
		// Commands run in leaf cgroups below; they need the controllers to
		// report their own OOM kills.
		if err := enableControllers(cg.dirs()[0], cs.ctrls); err != nil {
			return cgroup{}, err
		}
	}
	if err := cg.setLimits(memory, pids, cpus); err != nil {
		return cgroup{}, fmt.Errorf("set limits of %s: %w", name, err)
	}
	return cg, nil
}

// removeParent deletes the parent cgroup if no sandbox uses it any more.
func (cs *cgroups) removeParent() {
	for _, d := range cs.parent.dirs() {
		_ = unix.Rmdir(d) // Busy while other providers' sandboxes live there.
	}
}

// v1Mount is where a cgroup v1 hierarchy is mounted.
type v1Mount struct {
	point string // mount point
	root  string // the hierarchy path shown at the mount point
}

// v1Mounts maps each cgroup v1 controller to its mount, from
// /proc/self/mountinfo.
func v1Mounts() (map[string]v1Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	mounts := make(map[string]v1Mount)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 || b[0] != "cgroup" {
			continue
		}
		for opt := range strings.SplitSeq(b[2], ",") {
			if _, seen := mounts[opt]; !seen {
				mounts[opt] = v1Mount{point: unescapeMount(a[4]), root: unescapeMount(a[3])}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return mounts, nil
}

// unescapeMount undoes the octal escapes (\040 for space, ...) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroups maps each cgroup v1 controller to the cgroup this process is
// in, from /proc/self/cgroup.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read own cgroup: %w", err)
	}
	own := make(map[string]string)
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for c := range strings.SplitSeq(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own, nil
}

// readKeyed reads the value of key from a "key value" per line file such as
// memory.events.
func readKeyed(path, key string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// writeCgroupFile writes s to an existing cgroup control file.
func writeCgroupFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
